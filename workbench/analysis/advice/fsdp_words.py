"""What the advice says and offers for FSDP, beside DDP's (:mod:`workbench.analysis.advice.
candidates`): what an FSDP run is never offered (DDP's own knobs, which the config refuses with
``strategy='fsdp'``), FSDP's settings (not in the scaling model: measured, not predicted), and
the words for FSDP's causes. No torch.
"""

from __future__ import annotations

from workbench.config.rules import DDP_ONLY, FSDP_ONLY

#: What only DDP has: never offered to an FSDP run.
DDP_KNOBS = frozenset([*DDP_ONLY, "comm_hook"])
#: FSDP's own settings.
FSDP_SETTINGS = frozenset(FSDP_ONLY)
#: FSDP's own change for exposed all-gathers, where its blocks are resharded after forward.
KEEP_GATHERED = (
    "reshard_after_forward true -> false (each block keeps its gathered parameters until "
    "backward: no re-gather there)"
)
#: What FSDP's causes ask of the user where no field is offered (said, not tuned).
FSDP_SAID = {
    "exposed_all_gather": (
        "gather once for more samples: a larger per-device batch (memory permitting) "
        "amortises each step's all-gathers over more compute (gradient accumulation does not: "
        "each micro-step gathers again)"
    ),
    "exposed_reduce_scatter": (
        "reduce-scatter once for more samples: gradient accumulation (FSDP's no_sync: one "
        "reduce-scatter per optimizer step) or a larger per-device batch (memory permitting)"
    ),
}
