"""The report's first screen in a real browser: a laptop's 1280x800 window shows the finding and
the speedup chart without scrolling, and no table cell reads in exponent notation."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest

from workbench.ui.report import write_report

from .browser_support import ARGS, CHROMIUM, MARKS
from .frames import ddp_steps, make_runs, scaling_sweep

pytestmark = MARKS

#: Where each part sits on the page, in CSS pixels from the top of the document.
BOXES = """() => {
  const box = (el) => { const r = el.getBoundingClientRect();
    return {top: r.top + window.scrollY, bottom: r.bottom + window.scrollY, height: r.height}; };
  const speedup = Array.from(document.querySelectorAll('section.figure'))
    .find(s => s.querySelector('h2').textContent === 'Speedup');
  return {
    finding: box(document.querySelector('section.finding')),
    speedup: box(speedup.querySelector('.plotly-graph-div')),
    plot: box(speedup.querySelector('.main-svg')),
    ideal: speedup.querySelectorAll('.scatterlayer .trace').length,
    firstFigure: document.querySelector('section.figure h2').textContent,
    glossaryOpen: document.querySelector('details#glossary').open,
  };
}"""
CELLS = "Array.from(document.querySelectorAll('table td, table th, table caption'))" + (
    ".map(c => c.textContent)"
)


def _study() -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """A weak-scaling sweep at 1, 2 and 4 ranks plus a 4-rank run with a straggler: a finding of
    three lines, as a real study gives."""
    runs, steps, evals = scaling_sweep()
    slow = ddp_steps(world_size=4, slow_rank=2, slow_from=30).assign(run_id="ws4-slow")
    steps = pd.concat([steps, slow], ignore_index=True)
    runs = pd.concat([runs, make_runs([{"run_id": "ws4-slow", "world_size": 4}])])
    return runs, steps, evals


def test_first_screen_holds_the_finding_and_the_speedup_chart(tmp_path: Path) -> None:
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright")
    runs, steps, evals = _study()
    title = "Scaling report: weak-scaling study of the mlp on 1 to 4 ranks"
    path = write_report(runs, steps, evals, tmp_path / "report.html", title=title)
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 800})
            page.goto(path.as_uri(), wait_until="load")
            page.wait_for_function(
                "Array.from(document.querySelectorAll('section.figure'))"
                ".some(s => s.querySelector('h2').textContent === 'Speedup'"
                " && s.querySelector('.main-svg'))",
                timeout=30_000,
            )
            boxes = page.evaluate(BOXES)
            cells = page.evaluate(CELLS)
            page.screenshot(path=str(tmp_path / "first-screen.png"))
        finally:
            browser.close()
    assert boxes["firstFigure"] == "Speedup"
    assert 0 <= boxes["finding"]["top"] and boxes["finding"]["bottom"] <= 800, boxes
    chart = boxes["speedup"]
    assert chart["height"] >= 400, boxes  # drawn at its full height, not squeezed to fit
    assert 0 <= chart["top"] and chart["bottom"] <= 800, boxes  # whole, with no scrolling
    assert boxes["plot"]["bottom"] <= 800, boxes
    assert boxes["ideal"] >= 2, boxes  # the measured curve and the ideal line
    assert boxes["glossaryOpen"] is False  # the definitions are there, folded
    assert len(cells) > 50
    assert [c for c in cells if re.search(r"e[+-]\d\d", c)] == []


def test_a_report_beside_its_plotly_min_js_draws_every_figure(tmp_path: Path) -> None:
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright")
    runs, steps, evals = _study()
    path = write_report(runs, steps, evals, tmp_path / "r.html", plotly_js="directory")
    assert (tmp_path / "plotly.min.js").is_file()
    errors: list[str] = []
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 800})
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.goto(path.as_uri(), wait_until="load")
            page.wait_for_function(
                "document.querySelectorAll('.plotly-graph-div').length > 0 && "
                "Array.from(document.querySelectorAll('.plotly-graph-div'))"
                ".every(d => d.querySelector('.main-svg'))",
                timeout=30_000,
            )
            drawn = page.evaluate("document.querySelectorAll('.plotly .main-svg').length")
        finally:
            browser.close()
    assert errors == []
    assert drawn >= path.read_text().count('class="plotly-graph-div"') >= 10
