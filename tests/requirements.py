"""Real parts the slow tests need (Slurm, Chromium, root): skipped with the reason on a developer's
machine, a failure in CI (``CI=true``), where a missing part must never turn into a green run."""

from __future__ import annotations

import os

import pytest


def in_ci() -> bool:
    """Whether this is a CI run (``CI`` set to true, as CI services do)."""
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def require(available: bool, what: str) -> None:
    """Skip (outside CI) or fail (in CI) the current test when ``what`` is not available."""
    if available:
        return
    if in_ci():
        pytest.fail(f"CI=true and a real part is missing: {what}", pytrace=False)
    pytest.skip(what)
