"""A tune's result in words: the table, the report section "What we tried", the best config as
a RunConfig diff and a sweep YAML that reproduces it, and for a change of the training's
mathematics the loss curves of base and candidate side by side."""

from __future__ import annotations

import math
from typing import Any

import yaml

from workbench.config.run_config import RunConfig

VERDICT_WORDS = {
    "better": "better",
    "same": "no significant change",
    "worse": "worse",
    "skipped": "skipped",
}
#: Steps of a loss curve shown side by side (evenly spaced).
LOSS_ROWS = 6
#: Fields of the store, not of the training (a sweep names its own).
RESERVED_FIELDS = ("sweep", "run_name", "output_dir")


def _gain(value: Any) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return f"{value:+.1%}"


def _measured(row: dict[str, Any]) -> str:
    gain = row.get("measured_gain")
    if gain is None or not math.isfinite(float(gain)):
        return "-"
    return f"{_gain(gain)} ({_gain(row['low'])} to {_gain(row['high'])})"


def table_text(result: dict[str, Any]) -> str:
    """One line per candidate: candidate, predicted gain, measured gain with its interval,
    verdict (and why, for a skip or a change not confirmed)."""
    head = ("candidate", "predicted", "measured (95 % interval)", "verdict")
    lines = [head]
    for row in result["candidates"]:
        label = row["label"] + (" [changes the mathematics]" if row.get("changes_math") else "")
        word = VERDICT_WORDS[row["verdict"]]
        if row.get("why"):
            word += f": {row['why']}"
        lines.append((label, _gain(row["predicted_gain"]), _measured(row), word))
    widths = [max(len(line[i]) for line in lines) for i in range(3)]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(line[:3], widths, strict=True)) + "  " + line[3]
        for line in lines
    )


def config_diff(base: dict[str, Any], change: dict[str, Any]) -> str:
    """The best change as a RunConfig diff: ``field: base -> new`` per changed field."""
    return "\n".join(f"  {k}: {base.get(k)!r} -> {v!r}" for k, v in change.items())


def sweep_yaml(result: dict[str, Any]) -> str:
    """A sweep spec that runs the base and the best config side by side (the base's fields,
    less the store's own, as ``fixed``; each changed field as a grid of base and best)."""
    base = RunConfig.from_dict(result["base"])
    defaults = RunConfig(world_size=base.world_size, per_device_batch_size=1).to_dict()
    change = dict(result["best"])
    fixed = {
        k: v
        for k, v in base.to_dict().items()
        if k not in RESERVED_FIELDS
        and k not in change
        and k not in ("derived", "output_dir", "run_name", "sweep")
        and k not in base.derived
        and v is not None
        and v != defaults.get(k)
    }
    fixed.setdefault("world_size", base.world_size)
    spec = {
        "name": f"tune-best-{result['run_id']}",
        "description": f"the base of {result['run_id']} and the best config its tune measured",
        "executor": "local",
        "fixed": fixed,
        "grid": {k: [result["base"].get(k), v] for k, v in change.items()},
    }
    return yaml.safe_dump(spec, sort_keys=False)


def _loss_text(row: dict[str, Any]) -> str:
    curves = row.get("loss_curves") or []
    if not curves:
        return ""
    every = max(1, len(curves) // LOSS_ROWS)
    shown = curves[::every][:LOSS_ROWS] + ([curves[-1]] if (len(curves) - 1) % every else [])
    lines = [f"  loss, {row['label']}: step  base  candidate"]
    lines += [f"    {int(s):>5}  {b:.4f}  {c:.4f}" for s, b, c in shown]
    return "\n".join(lines)


def report_text(result: dict[str, Any]) -> str:
    """The whole text: diagnosis, the "What we tried" table, the best config (diff and sweep
    YAML), and the loss curves of every tried change of the mathematics."""
    d = result["diagnosis"]
    share = d.get("share")
    # the parts are averaged over steps and ranks separately: a share may pass 100 %
    share_text = f" ({min(share, 1.0):.0%} of the step)" if isinstance(share, float) else ""
    out = [f"run {result['run_id']}: diagnosis {d.get('cause')}{share_text}"]
    if result.get("said"):
        out.append(f"nothing to tune at the data-parallel level: {result['said']}")
    out += ["", "What we tried", table_text(result)] if result["candidates"] else []
    out.append(
        f"(gains are throughput ratios minus 1, each run's throughput at its faster steps (the "
        f"quartile of its step times); intervals from "
        f"{result['repeats']} interleaved pairs, Student t on the log ratios; better means the "
        f"interval is above 0 and the gain at least {result['noise']:.0%})"
    )
    curves = [_loss_text(r) for r in result["candidates"] if r.get("loss_curves")]
    if curves:
        out += ["", "Changes of the training's mathematics (you decide):", *curves]
    if result["best"]:
        best = next(r for r in result["candidates"] if r["change"] == result["best"])
        out += [
            "",
            f"best: {best['label']}, measured {_measured(best)}, predicted "
            f"{_gain(best['predicted_gain'])}",
            "as a RunConfig diff:",
            config_diff(result["base"], result["best"]),
            "as a sweep (base and best side by side):",
            sweep_yaml(result).rstrip(),
        ]
    else:
        out += ["", "no significant gain: nothing measured beat the base"]
    return "\n".join(out)
