"""Whether this machine's Slurm client reaches a controller, asked before a run folder is
written; and sbatch's refusals as one-line errors: sbatch's own words, and what to check.

The probe is ``scontrol ping`` (a few ms; the controller answers UP). Only when it does not say
so is ``sbatch --test-only`` asked, for sbatch's own words: it reads the configuration and asks
the controller as a submission would, and submits nothing. Only the answers that mean "no
controller here" (no configuration, nobody answering, authentication) stop a launch; anything
else (a cluster with no default partition, say) is left to the submission, whose refusal is
then reported the same way.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Mapping
from pathlib import Path

from workbench.errors import SlurmError

#: Asks the controller whether it is up: "Slurmctld(primary) at HOST is UP".
PING = ("scontrol", "ping")
#: A submission that is only tested: the configuration read, the controller asked, no job made.
PROBE = ("sbatch", "--test-only", "--job-name=workbench-probe", "--wrap=true")
#: sbatch retries a controller that refuses for about 9 s here; one that never answers, longer.
PROBE_TIMEOUT_S = 60.0
#: How long ``scontrol ping`` may take: it answers in milliseconds, or DOWN after the
#: controller's MessageTimeout (10 s by default); longer is a controller that hangs.
PING_TIMEOUT_S = 20.0
#: What sbatch says when no controller can be reached from here.
UNREACHABLE = (
    "Could not establish a configuration source",
    "Unable to process configuration file",
    "Unable to contact slurm controller",
    "Unable to establish a connection",
    "Zero Bytes were transmitted or received",
    "Protocol authentication error",
    "Invalid authentication credential",
    "Socket timed out",
    "Communication connection failure",
)
#: Where Debian's and Slurm's own builds look when SLURM_CONF is not set.
DEFAULT_CONF = "/etc/slurm/slurm.conf"
DEFAULT_PORT = "6817"


def probe(env: Mapping[str, str] | None = None) -> SlurmError | None:
    """None when sbatch here reaches a controller (or says anything else); else the error that
    quotes it and says what to check."""
    env = os.environ if env is None else env
    conf = env.get("SLURM_CONF")
    if conf and not Path(conf).is_file():  # sbatch would retry reading it for 60 s
        return SlurmError(
            f"cannot reach Slurm: SLURM_CONF={conf} names no file (sbatch would retry it for "
            "60 s, then stop); set SLURM_CONF to the cluster's slurm.conf or unset it"
        )
    if controller_up(env):
        return None
    try:
        out = subprocess.run(
            PROBE, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S, env=dict(env)
        )
    except FileNotFoundError:
        return SlurmError(
            "cannot reach Slurm: sbatch is not on PATH here (Slurm's client commands are not "
            "installed, or not on PATH); launch from a machine of the cluster (a login node)"
        )
    except subprocess.TimeoutExpired:
        return SlurmError(
            f"cannot reach Slurm: sbatch --test-only did not answer in {PROBE_TIMEOUT_S:g} s; "
            + what_to_check(env)
        )
    said = (out.stderr or "") + (out.stdout or "")
    if out.returncode != 0 and unreachable(said):
        return SlurmError(
            f"cannot reach Slurm: sbatch said {last_line(said)!r}; {what_to_check(env)}",
            said=said,
        )
    return None


def controller_up(env: Mapping[str, str]) -> bool:
    """Whether ``scontrol ping`` says a controller is up (False when it cannot tell)."""
    try:
        out = subprocess.run(
            PING, capture_output=True, text=True, timeout=PING_TIMEOUT_S, env=dict(env)
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.returncode == 0 and " is UP" in out.stdout


def refused(said: str, env: Mapping[str, str] | None = None) -> SlurmError:
    """The error for a submission sbatch refused (``said``: its output); nothing was
    submitted."""
    env = os.environ if env is None else env
    if unreachable(said):
        check = what_to_check(env)
        return SlurmError(f"cannot reach Slurm: sbatch said {last_line(said)!r}; {check}", said)
    return SlurmError(
        f"Slurm refused the job: sbatch said {last_line(said)!r}; nothing was submitted "
        "(check the partition, account, QOS and limits given: sinfo lists the partitions)",
        said=said,
    )


def unreachable(said: str) -> bool:
    """Whether sbatch's output says that no controller can be reached."""
    return any(marker in said for marker in UNREACHABLE)


def last_line(said: str) -> str:
    """sbatch's last line of output (its verdict), or what it said when nothing."""
    lines = [line.strip() for line in said.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "nothing (no output)"


def what_to_check(env: Mapping[str, str]) -> str:
    """Which configuration sbatch reads and which controller it asks, as one clause."""
    conf = env.get("SLURM_CONF")
    where = f"SLURM_CONF={conf}"
    if not conf:
        where = f"SLURM_CONF (not set: sbatch reads {DEFAULT_CONF}, else asks DNS)"
    controller = controller_of(Path(conf or DEFAULT_CONF))
    at = f" on {controller}" if controller else ""
    return f"check {where} and that its controller (slurmctld{at}) is running: scontrol ping"


def controller_of(conf: Path) -> str | None:
    """The primary controller's host and port as a config file names them, or None."""
    try:
        text = conf.read_text(errors="replace")
    except OSError:
        return None
    keys: dict[str, str] = {}
    for line in text.splitlines():
        found = re.match(r"\s*([A-Za-z]+)\s*=\s*(\S+)", line.split("#", 1)[0])
        if found:
            keys.setdefault(found.group(1).lower(), found.group(2))
    host = keys.get("slurmctldhost") or keys.get("controlmachine")
    if host is None:
        return None
    return f"{host} port {keys.get('slurmctldport', DEFAULT_PORT)}"
