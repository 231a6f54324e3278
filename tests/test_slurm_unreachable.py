"""Slurm that cannot be reached is one clear error, before any run folder is written: sbatch's
own words, the configuration (SLURM_CONF) and the controller to check. ``workbench run`` prints
it as one line with no traceback and exits 2; ``launch`` raises it as a SlurmError (a
PreflightError). Real sbatch, no controller: a configuration it cannot use, and one whose
controller is not running. A job the running cluster refuses is the same kind of line, and its
run folder is taken back."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from workbench.cli import main
from workbench.errors import PreflightError, SlurmError
from workbench.ports import free_port
from workbench.run.backends.slurm_reach import DEFAULT_CONF
from workbench.run.launch import launch

from .conftest import base_config
from .requirements import require

RUN = ["run", "--executor", "slurm", "--world-size", "2", "--steps", "4", "--no-progress"]


@pytest.fixture(autouse=True)
def _sbatch() -> None:
    require(
        shutil.which("sbatch") is not None, "sbatch (slurm-wlm: scripts/install-system-deps.sh)"
    )


def refused_by(
    argv: list[str], capsys: pytest.CaptureFixture[str], why: str = "cannot reach Slurm"
) -> str:
    """What ``workbench ARGV`` printed on stderr: one line, no traceback, exit status 2."""
    assert main(argv) == 2
    printed = capsys.readouterr()
    lines = printed.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {why}: "), printed
    assert "Traceback" not in printed.err + printed.out
    return lines[0]


@pytest.mark.parametrize("conf", ["empty", "unset"])
def test_no_usable_configuration_is_one_line_before_anything_is_written(
    conf: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    if conf == "unset":
        if Path(DEFAULT_CONF).exists():
            pytest.skip(f"{DEFAULT_CONF} exists here: sbatch has a configuration to read")
        monkeypatch.delenv("SLURM_CONF", raising=False)
        said = "sbatch: fatal: Could not establish a configuration source"
        where = "SLURM_CONF (not set"
    else:
        (tmp_path / "slurm.conf").touch()
        monkeypatch.setenv("SLURM_CONF", str(tmp_path / "slurm.conf"))
        said = "sbatch: fatal: Unable to process configuration file"
        where = f"SLURM_CONF={tmp_path / 'slurm.conf'}"
    store = tmp_path / "store"
    line = refused_by([*RUN, "--output-dir", str(store)], capsys)
    assert f"sbatch said {said!r}" in line and where in line and "scontrol ping" in line, line
    assert not store.exists(), "a run folder was written"

    with pytest.raises(SlurmError) as err:  # from Python: the same words, a PreflightError
        launch(base_config(store, world_size=2), executor="slurm")
    assert isinstance(err.value, PreflightError) and said in str(err.value)
    assert "\n" not in str(err.value) and not store.exists()


def test_a_slurm_conf_that_names_no_file_is_refused_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """sbatch itself would retry reading it for 60 s."""
    missing = tmp_path / "nowhere" / "slurm.conf"
    monkeypatch.setenv("SLURM_CONF", str(missing))
    started = time.monotonic()
    line = refused_by([*RUN, "--output-dir", str(tmp_path / "store")], capsys)
    assert time.monotonic() - started < 10
    assert f"SLURM_CONF={missing} names no file" in line, line
    assert not (tmp_path / "store").exists()


def test_a_controller_that_is_not_running_is_named_with_its_host_and_port(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """A configuration whose slurmctld is not running: sbatch tries to connect, then the launch
    stops, quoting it and naming the controller the file names. (sbatch retries for about
    twice MessageTimeout: 18 s at the default 10 s; the file sets 1 s.)"""
    port = free_port()
    conf = tmp_path / "slurm.conf"
    (tmp_path / "plugstack.conf").touch()
    conf.write_text(
        "ClusterName=nowhere\n"
        f"SlurmctldHost=wb-nowhere(127.0.0.1)\nSlurmctldPort={port}\n"
        "AuthType=auth/none\nCredType=cred/none\nMessageTimeout=1\n"
        f"PlugStackConfig={tmp_path / 'plugstack.conf'}\n"
        "NodeName=wb-n1 NodeAddr=127.0.0.1 CPUs=1 State=UNKNOWN\n"
        "PartitionName=debug Nodes=wb-n1 Default=YES State=UP\n"
    )
    monkeypatch.setenv("SLURM_CONF", str(conf))
    store = tmp_path / "store"
    line = refused_by([*RUN, "--output-dir", str(store)], capsys)
    assert "Unable to contact slurm controller" in line, line
    assert f"SLURM_CONF={conf}" in line and f"wb-nowhere(127.0.0.1) port {port}" in line, line
    assert not store.exists(), "a run folder was written"


@pytest.mark.slow
def test_a_job_the_cluster_refuses_is_one_line_and_leaves_no_folder(
    slurm_cluster, tmp_path: Path, capsys
) -> None:
    store = tmp_path / "store"
    argv = [*RUN, "--partition", "no-such-partition", "--output-dir", str(store)]
    line = refused_by(argv, capsys, why="Slurm refused the job")
    assert "Invalid partition name specified" in line and "nothing was submitted" in line, line
    assert not list(store.rglob("run.json")), "a run folder was left"
