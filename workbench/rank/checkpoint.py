"""Checkpoints: model, optimizer, scaler and step on rank 0; RNG states on every rank.

A checkpoint is written into ``checkpoints/step-NNNNNNNN.partial/`` and renamed once every rank has
written its part, so a folder without ``.partial`` is always complete. Loading uses
``weights_only=True``: opening a checkpoint never runs code.
"""

from __future__ import annotations

import random
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from workbench import schema
from workbench.rank import distributed


def _dir(run_dir: Path, step: int) -> Path:
    return run_dir / schema.CHECKPOINTS_DIR / f"step-{step:08d}"


def _rng_state() -> dict[str, Any]:
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, cached],  # type: ignore[attr-defined]
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save(
    run_dir: Path,
    step: int,
    module: nn.Module,
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler,
    rank: int,
    before_commit: Callable[[], None] | None = None,
) -> Path:
    """Collective: every rank calls it at the same step. ``before_commit`` runs on every rank
    once every rank's part is written, before the folder is renamed into place (the tracer
    writes its rows there, so a checkpoint is never ahead of the trace on disk)."""
    final = _dir(run_dir, step)
    partial = final.with_name(final.name + ".partial")
    partial.mkdir(parents=True, exist_ok=True)
    torch.save(_rng_state(), partial / f"rng-rank{rank:05d}.pt")
    if rank == 0:
        torch.save(
            {
                "step": step,
                "model": module.state_dict(),
                "optimizer": optimizer.state_dict(),
                "scaler": scaler.state_dict(),
            },
            partial / "train.pt",
        )
    distributed.barrier()
    if before_commit is not None:
        before_commit()
    if rank == 0:
        if final.exists():
            shutil.rmtree(final)
        partial.rename(final)
    distributed.barrier()
    return final


def latest(run_dir: Path) -> Path | None:
    """The newest complete checkpoint folder of a run."""
    folders = [
        p
        for p in (run_dir / schema.CHECKPOINTS_DIR).glob("step-*")
        if not p.name.endswith(".partial")
    ]
    return max(folders, key=lambda p: p.name) if folders else None


def load_latest(run_dir: Path, module: nn.Module, rank: int) -> dict[str, Any] | None:
    """Load the newest checkpoint's weights into ``module``; returns the rest for
    :func:`restore_training` (None when the run has no checkpoint yet)."""
    folder = latest(run_dir)
    if folder is None:
        return None
    state = torch.load(folder / "train.pt", map_location="cpu", weights_only=True)
    module.load_state_dict(state["model"])
    return {**state, "folder": folder}


def restore_training(
    state: dict[str, Any], optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler, rank: int
) -> int:
    """Restore optimizer, scaler and this rank's RNG states; returns the checkpoint's step."""
    optimizer.load_state_dict(state["optimizer"])
    scaler.load_state_dict(state["scaler"])
    rng = state["folder"] / f"rng-rank{rank:05d}.pt"
    if rng.exists():  # absent when the world size changed since the checkpoint
        _set_rng_state(torch.load(rng, weights_only=True))
    return int(state["step"])
