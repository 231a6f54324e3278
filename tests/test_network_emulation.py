"""The scaling model on a network it never saw, for real: two 2-rank runs in network namespaces
whose loopback tbf shapes to 800 and 200 Mbit/s; the model fitted on the 800 Mbit/s run predicts
the 200 Mbit/s run's throughput from that link's own measured bus bandwidth (what
``workbench predict --busbw`` takes), within the issue's worst-case goal of 20 %. Needs root
(``ip netns``, ``tc``): in CI a missing part fails the run."""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path

import pytest

from .requirements import require

# timing: its claims are durations measured on this host; they run alone (tests/README.md)
pytestmark = [pytest.mark.slow, pytest.mark.timing]
ROOT = Path(__file__).resolve().parents[1]


def _benchmark():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location(
        "network_emulation", ROOT / "benchmarks" / "network_emulation.py"
    )
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def test_a_held_out_link_is_predicted_within_20_percent() -> None:
    require(
        os.geteuid() == 0 and bool(shutil.which("tc")),
        "root and tc, to shape a namespace's loopback",
    )
    table = (
        _benchmark()
        .held_out_table({"fit": [800], "check": [200]}, 30, "mlp")
        .set_index("rate_mbit")
    )
    print(table.to_string())
    # the shaping holds: tbf at 200 Mbit/s passes 25 MB/s, and both ranks' traffic crosses the
    # one shaped loopback, so the allreduce's bus bandwidth stays under it
    assert table.loc[200, "busbw_MBps"] < 25.0
    assert table.loc[200, "busbw_MBps"] < 0.5 * table.loc[800, "busbw_MBps"]
    # the held-out point's measured throughput follows the slower link
    assert table.loc[200, "measured_samples_per_s"] < 0.6 * table.loc[800, "measured_samples_per_s"]
    assert abs(table.loc[200, "error"]) <= 0.20, table.loc[200].to_dict()
