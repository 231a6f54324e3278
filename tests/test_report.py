"""The offline HTML report: one file, plotly.js embedded once, every figure with data, no CDN."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go
import pytest

from workbench.analysis import resolve_group_by
from workbench.store.load import load_runs
from workbench.ui.report import build_figures, report_from_store, write_report
from workbench.ui.tables import scaling_columns

from .frames import ddp_steps, make_runs, scaling_sweep, write_scaling_sweep


def html_table(text: str, after: str) -> dict[str, list[str]]:
    """The first HTML table after ``after``, as column name -> cell texts (no lxml needed)."""
    table = text[text.index(after) :].split("</table>")[0]
    header = re.findall(r"<th(?:\s[^>]*)?>(.*?)</th>", table, re.DOTALL)  # not <thead>
    cells = [re.findall(r"<td[^>]*>(.*?)</td>", row, re.DOTALL) for row in table.split("<tr")[2:]]
    return {h.strip(): [row[i].strip() for row in cells] for i, h in enumerate(header)}


def test_report_is_one_offline_file_with_every_figure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the report built a plotly figure object")

    # each figure's spec is written as it is: validating them cost a large report a second
    monkeypatch.setattr(go.Figure, "__init__", refuse)
    runs, steps, evals = scaling_sweep()
    path = write_report(runs, steps, evals, tmp_path / "out" / "report.html", title="A <b> study")
    assert path == tmp_path / "out" / "report.html"
    text = path.read_text(encoding="utf-8")
    figs, _ = build_figures(runs, steps, evals)
    headings = [h for h, _ in figs]
    assert "Speedup" in headings and "Evaluation time" in headings
    assert "Predicted against measured" in headings  # network measured from the ws2/ws4 runs
    assert text.count('class="plotly-graph-div"') == len(figs)
    assert len(re.findall(r"\* plotly\.js v\d", text)) == 1  # the library, once
    assert not re.search(r"<script[^>]+src=", text)  # nothing fetched
    assert "cdn.plot.ly/plotly" not in text
    assert "A &lt;b&gt; study" in text
    scaling = html_table(text, "<h2>Scaling</h2>")
    assert scaling["speedup"] == ["1.00x", "1.60x", "2.50x"]
    assert scaling["efficiency"] == ["100 %", "80 %", "62 %"]  # 62.5 rounds half to even
    assert "None found." in text  # no straggler in the sweep
    assert not list(path.parent.glob(".*.tmp"))  # atomic write left no temporary file


def test_report_without_evals_leaves_their_figures_out(tmp_path: Path) -> None:
    runs, steps, _ = scaling_sweep(evals=False)
    figs, _ = build_figures(runs, steps, None, network="nvlink")
    headings = [h for h, _ in figs]
    assert "Evaluation time" not in headings and "Accuracy against speed" not in headings
    assert "Speedup" in headings and "Predicted against measured" in headings
    path = write_report(runs, steps, None, tmp_path / "r.html")
    assert path.read_text().count('class="plotly-graph-div"') == len(
        build_figures(runs, steps, None)[0]
    )


def test_report_focuses_on_a_straggler(tmp_path: Path) -> None:
    steps = ddp_steps(world_size=4, slow_rank=1, slow_from=30)
    runs = make_runs([{"run_id": "d", "world_size": 4}])
    figs, tables = build_figures(runs, steps, None)
    assert tables["stragglers"]["rank"].tolist() == [1]
    assert "Compute time, run d" in [h for h, _ in figs]
    text = write_report(runs, steps, None, tmp_path / "s.html").read_text()
    assert "<h2>Stragglers</h2>" in text and "None found." not in text


def test_report_with_no_traces_still_writes(tmp_path: Path) -> None:
    runs, steps, _ = scaling_sweep(evals=False)
    text = write_report(runs, steps.iloc[0:0], None, tmp_path / "e.html").read_text()
    assert "no scaling table" in text
    assert 'class="plotly-graph-div"' not in text


def test_report_writes_the_scaling_table_it_computed_as_csv(tmp_path: Path) -> None:
    write_scaling_sweep(tmp_path, train_samples=640)
    summary = tmp_path / "weak" / "summary.csv"
    path = report_from_store(tmp_path / "weak", tmp_path / "r.html", summary_csv=summary)
    table = pd.read_csv(summary)
    assert table["world_size"].tolist() == [1, 2, 4]
    assert table["speedup"].tolist() == pytest.approx([1.0, 1.6, 2.5])
    # the step-10 evaluation's end: after the step-5 evaluation (0.75, 0.75, 0.85 s)
    assert table["time_to_quality_s"].tolist() == pytest.approx([11.5, 14.0, 17.6])
    keys = resolve_group_by(load_runs(tmp_path, ["weak"]))
    assert keys[:2] == ["model", "precision"] and keys[-2:] == ["scaling", "fixed_batch_size"]
    assert set(keys) <= set(table.columns)  # the CSV keeps every group column
    # ... and every other one, empty or shared, as raw numbers: it is for machines
    assert {"samples_per_s_std", "nodes", "runs", "mfu_note"} <= set(table.columns)
    # end to end: 8 steps and the step-5 evaluation (0.75, 0.75, 0.85 s) per measured step
    assert table["wall_step_s"].tolist() == pytest.approx([8.75 / 8, 10.75 / 8, 13.65 / 8])
    assert table["scaling"].tolist() == ["weak"] * 3
    page = path.read_text()
    scaling = html_table(page, "<h2>Scaling</h2>")
    assert list(scaling) == scaling_columns(table, keys)  # the dashboard's columns too
    # what every point shares is said once, above the table; no empty std column of single runs
    assert (
        "fixed: mlp, fp32, sgd, lr 0.05, 640 samples, weak scaling, batch 8 per device, 1 node, "
        "1 run per point, final loss 1.1, mfu note: no MFU: FLOPs not counted</caption>"
    ) in page
    assert list(scaling) == [
        "world_size",
        "global_batch_size",
        "speedup",
        "efficiency",
        "link_class",
        *("samples_per_s", "samples_per_s_per_device", "end_to_end_samples_per_s"),
        *("wall_step_s", "epoch_s", "final_metric", "time_to_quality_s"),
    ]
    assert scaling["link_class"] == ["none", "intra-node", "intra-node"]  # one node
    assert scaling["samples_per_s"] == ["8/s", "12.8/s", "20/s"]  # training alone
    assert scaling["end_to_end_samples_per_s"] == ["7.31/s", "11.9/s", "18.8/s"]
    assert scaling["epoch_s"] == ["87.5 s", "53.8 s", "34.1 s"]  # 53.75: half to even
    assert scaling["time_to_quality_s"] == ["11.5 s", "14 s", "17.6 s"]
    assert not list(summary.parent.glob(".*.tmp"))
    assert report_from_store(tmp_path / "weak", tmp_path / "r2.html") == tmp_path / "r2.html"


def test_report_with_no_traces_writes_an_empty_summary(tmp_path: Path) -> None:
    runs, steps, _ = scaling_sweep(evals=False)
    write_report(runs, steps.iloc[0:0], None, tmp_path / "e.html", summary_csv=tmp_path / "s.csv")
    assert (tmp_path / "s.csv").read_text().strip() == ""
