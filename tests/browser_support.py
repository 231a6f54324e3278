"""What the browser tests share: Debian's Chromium, its flags for a closed network, the markers."""

from __future__ import annotations

import os
from urllib.parse import urlparse

import pytest

from .requirements import require

CHROMIUM = "/usr/bin/chromium"
#: Without the background-networking flags Chromium keeps calling home on a machine that
#: cannot reach it; playwright's own browser download does not work here, so Debian's is used.
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]
MARKS = [pytest.mark.browser, pytest.mark.slow, pytest.mark.usefixtures("chromium")]


@pytest.fixture(scope="session")
def chromium() -> str:
    """Debian's Chromium: skipped where missing, a failure in CI."""
    require(
        os.access(CHROMIUM, os.X_OK),
        f"{CHROMIUM} missing: apt-get install -y --no-install-recommends chromium",
    )
    return CHROMIUM


def is_local(url: str, files: bool = False) -> bool:
    """A request that stays on this machine (``file:`` URLs too when ``files``)."""
    parts = urlparse(url)
    schemes = ("data", "blob", "about") + (("file",) if files else ())
    return parts.scheme in schemes or parts.hostname in ("localhost", "127.0.0.1")
