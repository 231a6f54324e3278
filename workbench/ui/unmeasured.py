"""What the runs of a report could not measure, said under the finding instead of shown as zero:
the parts of a user's script that are not seen from outside, and each run's measurement
warnings (a private DDP timer missing, a script that stepped no optimizer)."""

from __future__ import annotations

import pandas as pd

#: What the hooks cannot tell apart in a script run, and where its time goes instead.
SCRIPT_NOTE = (
    "{scripts}: your own training, traced from outside. Its evaluation, checkpoints and epochs "
    "happen inside the script and are not told apart: their time is in 'between steps'; no "
    "FLOP count, so no MFU"
)


def _non_empty(runs: pd.DataFrame, column: str) -> pd.Series:
    if column not in runs.columns:
        return pd.Series(False, index=runs.index)
    return runs[column].notna() & (runs[column].astype(str) != "")


def unmeasured_lines(runs: pd.DataFrame) -> list[str]:
    """One line for the script runs (naming their scripts), then each distinct measurement
    warning with the runs that gave it."""
    lines = []
    script = _non_empty(runs, "script") | _non_empty(runs, "script_module")
    if script.any():
        names = runs.loc[script, "model"].astype(str).str.removeprefix("script:")
        lines.append(SCRIPT_NOTE.format(scripts=", ".join(sorted(set(names)))))
    warned = _non_empty(runs, "measurement_warnings")
    by_message: dict[str, list[str]] = {}
    if warned.any():
        said_by_run = runs.loc[warned, ["run_id", "measurement_warnings"]]
        for run_id, said in said_by_run.itertuples(index=False):
            for message in str(said).split("; "):
                by_message.setdefault(message, []).append(str(run_id))
    for message, run_ids in by_message.items():
        lines.append(f"not measured in {', '.join(run_ids)}: {message}")
    return lines
