"""Tables for people, as the report and the dashboard show them: units per column, the columns
that matter first, shared values in one caption line, empty columns left out."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from workbench.ui.table_format import cell_text, people_table, table_html
from workbench.ui.tables import frame_html


def test_every_number_reads_in_its_unit_and_never_in_exponent_notation() -> None:
    said = {
        ("samples_per_s", 21005.3): "21,005/s",
        ("samples_per_s_std", 8.485): "8.48/s",
        ("train_samples_per_s", 0.00001): "0.00001/s",
        ("step_s", 0.001523): "1.52 ms",
        ("exposed_comm_s", 0.0): "0 s",
        ("epoch_s", 12345.6): "12,346 s",
        ("comm_s", 3.2e-8): "0.000000032 s",
        ("comm_share", 0.7788): "78 %",
        ("efficiency", 0.2886): "29 %",
        ("mfu", 0.004): "0.4 %",
        ("speedup", 0.58): "0.58x",
        ("measured_speedup", 3.25): "3.25x",
        ("peak_bytes", 0.31 * 2**30): "0.31 GiB",
        ("peak_bytes", 140 * 2**30): "140 GiB",
        ("tflops_per_device", 0.0000123): "0.0000123 TFLOP/s",
        ("train_samples", 4096): "4,096",
        ("learning_rate", 0.0001): "0.0001",
        ("final_loss", 123456.7): "123,457",
        ("final_loss", 2.101e4): "21,010",
        ("world_size", np.int64(8)): "8",
        ("samples_per_s", float("nan")): "",
        ("incomplete", None): "",
        ("model", "mlp"): "mlp",
    }
    got = {key: cell_text(*key) for key in said}
    assert got == said
    assert not [t for t in got.values() if re.search(r"e[+-]\d\d", t)]


def test_shared_values_go_to_one_caption_and_the_scaling_columns_come_first() -> None:
    frame = pd.DataFrame(
        {
            "model": ["mlp", "mlp"],
            "precision": ["fp32", "fp32"],
            "optimizer": ["sgd", "sgd"],
            "learning_rate": [0.05, 0.05],
            "train_samples": [4096, 4096],
            "nodes": [1, 1],
            "runs": [3, 3],
            "samples_per_s": [21005.3, 36120.0],
            "samples_per_s_std": [np.nan, np.nan],
            "step_s": [0.001523, 0.00177],
            "world_size": [1, 2],
            "speedup": [1.0, 1.7196],
            "efficiency": [1.0, 0.8598],
        }
    )
    table = people_table(frame)
    assert table.fixed == [
        "mlp",
        "fp32",
        "sgd",
        "lr 0.05",
        "4,096 samples",
        "1 node",
        "3 runs per point",
    ]
    assert table.columns == ["world_size", "speedup", "efficiency", "samples_per_s", "step_s"]
    assert table.rows == [
        ["1", "1.00x", "100 %", "21,005/s", "1.52 ms"],
        ["2", "1.72x", "86 %", "36,120/s", "1.77 ms"],
    ]
    text = frame_html(frame)
    assert text == table_html(frame)  # every table of tables.py is one for people
    assert (
        "<caption" in text
        and ("fixed: mlp, fp32, sgd, lr 0.05, 4,096 samples, 1 node, 3 runs per point</caption>")
        in text
    )
    assert "samples_per_s_std" not in text  # empty: no column


def test_one_row_keeps_its_columns() -> None:
    """A single row has nothing to hoist: its values stay in their columns (only empty ones go)."""
    frame = pd.DataFrame({"model": ["mlp"], "world_size": [4], "mfu": [np.nan], "runs": [2]})
    table = people_table(frame)
    assert (table.columns, table.rows, table.fixed) == (
        ["world_size", "model", "runs"],
        [["4", "mlp", "2"]],
        [],
    )
    assert "<caption" not in table_html(frame)


def test_cells_are_escaped() -> None:
    text = table_html(pd.DataFrame({"note": ["a <b> & c", "d"]}))
    assert "<td>a &lt;b&gt; &amp; c</td>" in text
