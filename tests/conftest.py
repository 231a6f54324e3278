"""Shared fixtures: real multi-process runs launch once per session and serve many tests."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from workbench.config.run_config import RunConfig
from workbench.run.backends.pool import shared_template
from workbench.run.launch import launch

from .lanes import mark_lanes

# Keep each rank to one thread: two ranks share this machine's two cores.
os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(scope="session", autouse=True)
def jupyter_dirs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """Kernels (papermill's, the sweeps', JupyterLab's) keep their profile and connection files
    in the session's own folders, not in the user's ``~/.ipython`` and Jupyter runtime dir."""
    root = tmp_path_factory.mktemp("jupyter")
    dirs = {"IPYTHONDIR": str(root / "ipython"), "JUPYTER_RUNTIME_DIR": str(root / "runtime")}
    saved = {name: os.environ.get(name) for name in dirs}
    os.environ.update(dirs)
    yield dirs
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture(scope="session", autouse=True)
def pool_template() -> Iterator[str]:
    """One pool template for the session: every pool run, in this process or in a kernel or a
    CLI it starts (``$WORKBENCH_POOL_TEMPLATE``), forks its ranks from it, so the suite imports
    torch for them once instead of once a rank (tests/helpers.py: ``WARM``)."""
    with shared_template() as path:
        yield path


@pytest.fixture(scope="session")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A result store shared by the session's real runs."""
    return tmp_path_factory.mktemp("store")


def base_config(store: Path, **changes) -> RunConfig:
    """The small config the integration tests share: 512 samples, global batch 64 (8 steps per
    epoch), 2 epochs, a checkpoint every 4 steps, eval after each epoch."""
    fields = dict(
        model="mlp",
        train_samples=512,
        eval_samples=200,
        global_batch_size=64,
        epochs=2,
        warmup_steps=2,
        checkpoint_every_steps=4,
        output_dir=str(store),
        sweep="it",
        trace_flush_s=0.2,
        collective_timeout_s=60,
        eval_batch_size=64,
    )
    fields.update(changes)
    return RunConfig(**fields)


@pytest.fixture(scope="session")
def ddp2(store: Path):
    """A completed 2-rank run that also records which samples each rank consumed."""
    handle = launch(
        base_config(
            store,
            world_size=2,
            run_name="ddp2",
            trace_sample_ids=True,
            trace_comm_every_steps=4,
        )
    )
    assert handle.wait(timeout_s=180) == "completed"
    return handle


@pytest.fixture(scope="session")
def ddp1(store: Path):
    """The same run on 1 rank (same global batch, same tracing: only the world size and the
    name differ, so the two are one strong-scaling curve)."""
    handle = launch(
        base_config(
            store,
            world_size=1,
            run_name="ddp1",
            trace_sample_ids=True,
            trace_comm_every_steps=4,
        )
    )
    assert handle.wait(timeout_s=180) == "completed"
    return handle


@pytest.hookimpl(tryfirst=True)  # before ``-m`` selects by the markers given here
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Each test gets the marker of its lane (``make test``: tests/lanes.py). GPU tests run
    wherever a CUDA device is visible, and are skipped with the reason elsewhere (a skip is
    never counted as verification)."""
    mark_lanes(items)
    gpu_tests = [item for item in items if "gpu" in item.keywords]
    if not gpu_tests:
        return
    import torch

    if torch.cuda.is_available():  # counts devices; creates no CUDA context
        return
    skip = pytest.mark.skip(reason="no CUDA device visible here: the GPU path is not verified")
    for item in gpu_tests:
        item.add_marker(skip)


from .browser_support import chromium  # noqa: E402,F401  (session fixture for browser tests)
from .cores_busy import pytest_runtest_protocol  # noqa: E402,F401  (make test-profile)
from .slurm_support import slurm_cluster  # noqa: E402,F401  (session fixture for Slurm tests)
