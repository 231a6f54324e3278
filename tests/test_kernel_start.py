"""A sweep point whose kernel dies before it answers (as when another process takes one of the
ports jupyter_client picked for it) is started again, whole; a kernel that never comes up is
said as the point's error. A real kernel, from a kernelspec of the test's own that dies on its
first start."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import nbformat
import pytest

from workbench.sweeps.execute import KERNEL_STARTS, execute_notebook

pytestmark = pytest.mark.slow

_DIES_ONCE = """
import os, runpy, sys
marker = sys.argv.pop(1)
if not os.path.exists(marker):
    open(marker, "w").close()
    sys.exit(1)  # dies before it replies, as a kernel whose port was taken
sys.argv[0] = "ipykernel_launcher"
runpy.run_module("ipykernel_launcher", run_name="__main__")
"""


def _kernel(tmp: Path, name: str, marker: Path) -> None:
    spec = tmp / "jupyter" / "kernels" / name
    spec.mkdir(parents=True)
    argv = [sys.executable, "-c", _DIES_ONCE, str(marker), "-f", "{connection_file}"]
    (spec / "kernel.json").write_text(
        json.dumps({"argv": argv, "display_name": name, "language": "python"})
    )


def _notebook(path: Path, kernel: str) -> Path:
    book = nbformat.v4.new_notebook()
    book.metadata["kernelspec"] = {"name": kernel, "display_name": kernel, "language": "python"}
    book.cells = [nbformat.v4.new_code_cell("answer = 6 * 7\nprint(answer)")]
    nbformat.write(book, path)
    return path


def test_a_kernel_that_dies_before_it_answers_is_started_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    marker = tmp_path / "first-start"
    _kernel(tmp_path, "dies-once", marker)
    book = _notebook(tmp_path / "in.ipynb", "dies-once")
    assert execute_notebook(book, tmp_path / "out.ipynb", {}, timeout_s=120) is None
    assert marker.exists(), "the first start did not die: the test proved nothing"
    outputs = nbformat.read(tmp_path / "out.ipynb", as_version=4).cells[0].outputs
    assert "42" in outputs[0]["text"]


def test_a_kernel_that_never_starts_is_the_points_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    spec = tmp_path / "jupyter" / "kernels" / "never"
    spec.mkdir(parents=True)
    argv = [sys.executable, "-c", "import sys; sys.exit(1)", "-f", "{connection_file}"]
    (spec / "kernel.json").write_text(json.dumps({"argv": argv, "display_name": "never"}))
    book = _notebook(tmp_path / "in.ipynb", "never")
    said = execute_notebook(book, tmp_path / "out.ipynb", {}, timeout_s=120)
    assert KERNEL_STARTS == 2
    assert said is not None and "RuntimeError: Kernel died before replying" in said, said
