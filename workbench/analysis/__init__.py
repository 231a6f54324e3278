"""Trace frames to tables: frames in, frames out; no torch, no figures. Imports store, config
(RunConfig's field names, for the scaling groups), schema and errors only.

On four floors, each a sub-package whose docstring says what it may import (the contract
"Floors of the analysis" in pyproject.toml checks it): ``measured`` (the measured window and
its warm-up, the stored-steps reader, DDP's sampled timers, FLOPs, units, display), above it
``throughput`` (scaling groups and tables, breakdown, memory, communication, per-rank summary)
and ``stragglers`` (the rule and the pass, on ``rank_cells``' step x rank matrices), then
``model`` (network fit, cluster network, the scaling model and predict), and at the top
``advice`` (the finding, the loss table, the ranked changes and the candidates they come from)
beside ``run_digests`` (the passes a digest keeps, handed to :mod:`workbench.store.digests`,
which builds and reads the digests, and ``open_steps``, which asks it for frames). Resolve the
grouping once with :func:`resolve_group_by` and pass it to every table and figure.
``stragglers_in_store`` and ``measured_window_in_store`` read a large sweep through the store's
columnar engine.
"""

from workbench.analysis.measured.display import downsample_for_display
from workbench.analysis.measured.windows import (
    check_columns,
    comm_filled,
    eval_rows,
    gap_filled,
    lower_is_better,
    measured_steps,
    measured_window,
    measured_window_in_store,
)
from workbench.analysis.stragglers.slow_ranks import (
    STRAGGLER_COLUMNS,
    stragglers,
    stragglers_in_store,
)
from workbench.analysis.throughput.breakdown import (
    BETWEEN,
    EVAL_PARTS,
    PHASES,
    eval_breakdown,
    phase_breakdown,
)
from workbench.analysis.throughput.comm import communication
from workbench.analysis.throughput.groups import (
    BATCH_COLUMNS,
    FAMILY_COLUMNS,
    NOT_GROUPING,
    ScalingFamilyWarning,
    config_columns,
    default_group_by,
    resolve_group_by,
)
from workbench.analysis.throughput.memory import memory_by_rank
from workbench.analysis.throughput.scaling import run_table, scaling_table

__all__ = [
    "BATCH_COLUMNS",
    "BETWEEN",
    "EVAL_PARTS",
    "FAMILY_COLUMNS",
    "NOT_GROUPING",
    "PHASES",
    "STRAGGLER_COLUMNS",
    "ScalingFamilyWarning",
    "check_columns",
    "comm_filled",
    "communication",
    "config_columns",
    "default_group_by",
    "downsample_for_display",
    "eval_breakdown",
    "eval_rows",
    "gap_filled",
    "lower_is_better",
    "measured_steps",
    "measured_window",
    "measured_window_in_store",
    "memory_by_rank",
    "phase_breakdown",
    "resolve_group_by",
    "run_table",
    "scaling_table",
    "stragglers",
    "stragglers_in_store",
]
