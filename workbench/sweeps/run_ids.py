"""Deterministic run ids for sweep points.

A point's id is a readable part from its grid values (``w2_b64_bf16``: world size 2, per-device
batch 64, bf16) and a short hash of its full configuration, so a re-run of the same spec finds its
points, and two different points never share a folder.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from collections.abc import Mapping
from typing import Any

from workbench.config.run_config import RunConfig

#: Fields the sweep sets itself: the store folder, the run id and the store root.
RESERVED_FIELDS = ("sweep", "run_name", "output_dir")
#: Short names used in run ids ("" means the value alone, e.g. ``bf16``); others use the full name.
RUN_ID_ABBREVIATIONS = {
    "world_size": "w",
    "nodes": "n",
    "tasks_per_node": "tpn",
    "per_device_batch_size": "b",
    "global_batch_size": "gb",
    "gradient_accumulation_steps": "ga",
    "learning_rate": "lr",
    "max_steps": "steps",
    "model": "",
    "precision": "",
    "optimizer": "",
    "script_args": "",
}
#: The readable part of an id is cut to this many characters (the hash keeps ids distinct).
READABLE_MAX = 60


def _defaults() -> dict[str, Any]:
    """RunConfig's default field values, as JSON gives them back."""
    out = {}
    for f in dataclasses.fields(RunConfig):
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = f.default_factory()
    return json.loads(json.dumps(out, default=str))


def config_hash(config: RunConfig) -> str:
    """A short hash of the run's full config (derived values included), but not of where it is
    stored. Fields at their default are left out: a field added to RunConfig later must not
    change every id, or a re-run would no longer find the points it completed."""
    data = json.loads(config.to_json())
    defaults = _defaults()
    for key in (*RESERVED_FIELDS, "derived"):
        data.pop(key, None)
    data = {k: v for k, v in data.items() if k not in defaults or v != defaults[k]}
    text = json.dumps(data, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def _token(value: Any) -> str:
    """A value as folder-name characters (``{'hidden_dim': 8}`` -> ``hiddendim8``)."""
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        text = "".join(v.lstrip("-") for v in value)  # script arguments: --steps 10 -> steps10
    else:
        text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
    return re.sub(r"[^A-Za-z0-9.+-]", "", text)


def point_run_id(values: Mapping[str, Any], config: RunConfig) -> str:
    """The run id of a grid point: its grid values, shortened (``w2_b64_bf16``), then a hash of
    its full config, so that ids are readable, deterministic and distinct."""
    parts = []
    for key, value in values.items():
        prefix = RUN_ID_ABBREVIATIONS.get(key)
        parts.append(f"{prefix}{_token(value)}" if prefix is not None else f"{key}-{_token(value)}")
    readable = "_".join(p for p in parts if p)[:READABLE_MAX].strip("_.+-") or "point"
    if not readable[0].isalnum():
        readable = "p" + readable
    return f"{readable}-{config_hash(config)}"
