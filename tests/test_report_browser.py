"""The report in a real browser: offline, no page errors, every plot drawn."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from workbench.ui.report import build_figures, write_report

from .browser_support import ARGS, CHROMIUM, MARKS, is_local
from .frames import ddp_steps, make_runs, scaling_sweep

pytestmark = MARKS


def test_report_renders_offline_in_chromium(tmp_path: Path) -> None:
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright")
    runs, steps, evals = scaling_sweep()
    straggler = ddp_steps(world_size=4, slow_rank=2, slow_from=30)
    straggler["run_id"] = "ws4-slow"
    steps = pd.concat([steps, straggler], ignore_index=True)
    runs = pd.concat([runs, make_runs([{"run_id": "ws4-slow", "world_size": 4}])])
    path = write_report(runs, steps, evals, tmp_path / "report.html", title="Browser check")
    n_figures = len(build_figures(runs, steps, evals)[0])
    assert n_figures >= 10

    errors: list[str] = []
    outside: list[str] = []
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.on(
                "console",
                lambda msg: errors.append(msg.text) if msg.type == "error" else None,
            )

            def route(r: object) -> None:
                request = r.request  # type: ignore[attr-defined]
                if is_local(request.url, files=True):
                    r.continue_()  # type: ignore[attr-defined]
                else:
                    outside.append(request.url)
                    r.abort()  # type: ignore[attr-defined]

            page.route("**/*", route)
            page.goto(path.as_uri(), wait_until="load")
            page.wait_for_function(
                f"document.querySelectorAll('.plotly .main-svg').length >= {n_figures}",
                timeout=30_000,
            )
            drawn = page.evaluate(
                "Array.from(document.querySelectorAll('.plotly-graph-div'))"
                ".filter(d => d.querySelector('.main-svg') && d._fullData"
                " && d._fullData.length > 0).length"
            )
            traces = page.evaluate(
                "Array.from(document.querySelectorAll('.plotly-graph-div'))"
                ".map(d => d.querySelectorAll('.trace, .hm, .heatmaplayer image').length)"
            )
            page.screenshot(path=str(tmp_path / "report.png"), full_page=True)
        finally:
            browser.close()
    assert errors == []
    assert outside == []
    assert drawn == n_figures
    assert all(count > 0 for count in traces), traces
