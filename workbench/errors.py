"""Every exception the workbench raises, each carrying its evidence.

User mistakes are ``ValueError`` subclasses so that ``except ValueError`` keeps working for callers
that do not know this module.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a configuration: the field, the value given, and what is allowed."""

    field: str
    value: Any
    allowed: str

    def __str__(self) -> str:
        return f"{self.field}={self.value!r}: {self.allowed}"


class ConfigError(ValueError):
    """A configuration with one or more problems, all reported at once."""

    def __init__(self, problems: list[Problem], what: str = "RunConfig") -> None:
        self.problems = list(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"{what} has {len(self.problems)} problem(s):\n{lines}")

    @property
    def fields(self) -> list[str]:
        return [p.field for p in self.problems]


class PreflightError(ValueError):
    """The machine cannot run this configuration (checked before any process starts)."""

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = list(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"cannot launch:\n{lines}")


class SlurmError(PreflightError):
    """Slurm cannot take the job: sbatch reaches no controller (no configuration, a controller
    that does not answer) or refused the job. The message is one line: sbatch's own words and
    what to check; ``said`` holds all sbatch printed. Raised before a run folder is left
    behind: nothing of the run exists."""

    def __init__(self, message: str, said: str | None = None) -> None:
        self.said = said
        super().__init__([Problem("executor", "slurm", message)])
        self.args = (message,)


class TuneError(ValueError):
    """A tune cannot start from this run or budget; the message says why and what would do."""


class RunFailedError(RuntimeError):
    """A run ended in failure. ``rank`` is the root-cause rank where it is known."""

    def __init__(
        self,
        run_id: str,
        status: str,
        rank: int | None = None,
        exception: str | None = None,
        traceback: str | None = None,
        log_tail: str | None = None,
        log_path: str | None = None,
    ) -> None:
        self.run_id = run_id
        self.status = status
        self.rank = rank
        self.exception = exception
        self.traceback = traceback
        self.log_tail = log_tail
        self.log_path = log_path
        where = f"rank {rank}" if rank is not None else "an unknown rank"
        msg = f"run {run_id} {status}: {where}: {exception or 'no exception recorded'}"
        if log_path:
            msg += f"\n  log: {log_path}"
        if log_tail:
            msg += "\n  last lines:\n    " + "\n    ".join(log_tail.rstrip().splitlines()[-10:])
        super().__init__(msg)


class StoreFullError(OSError):
    """No space left on the disk that holds the store: which file could not be written, the
    disk's mount point, and what is free on it. An ``OSError`` with errno ENOSPC (or EDQUOT),
    so ``except OSError`` still catches it."""

    def __init__(self, errno_: int, path: str, mount: str, free: str, total: str) -> None:
        self.path, self.mount, self.free, self.total = path, mount, free, total
        self.message = (
            f"no space left on the disk mounted at {mount} ({free} free of {total}): "
            f"cannot write {path}"
        )
        super().__init__(errno_, self.message, path)

    def __str__(self) -> str:
        return self.message


class InjectedFault(RuntimeError):
    """Raised on purpose by ``RunConfig.fault`` (fault-injection tests)."""


class NonFiniteLossError(FloatingPointError):
    """The loss became NaN or infinite: the run stops at that step on that rank."""

    def __init__(self, rank: int, step: int, loss: float) -> None:
        self.rank, self.step, self.loss = rank, step, loss
        super().__init__(
            f"loss is {loss} at step {step} on rank {rank}: lower the learning rate, "
            "use fp32 or bf16 instead of fp16, or add warm-up"
        )


class UnusedParametersError(RuntimeError):
    """DDP cannot reduce gradients that were never produced; names the parameters."""

    def __init__(self, names: list[str]) -> None:
        self.names = names
        shown = ", ".join(names[:8]) + (" ..." if len(names) > 8 else "")
        super().__init__(
            f"{len(names)} parameter(s) got no gradient in the first step ({shown}); "
            "DDP would fail at the next step. Remove them from the model, or set "
            "find_unused_parameters=True (slower: an extra pass over the graph per step)"
        )


class MeasurementWarning(RuntimeWarning):
    """A figure could not be measured as configured (a private DDP call missing in this torch,
    a timer that would report the wrong thing): the run goes on and records less, and the rank
    summary and ``run.json`` say what (``measurement_warnings``)."""


class ScriptError(RuntimeError):
    """A user's script did something a workbench rank cannot run as asked (it starts its own
    processes, or trains on several ranks without joining a process group); names the script,
    the rank and what to change."""

    def __init__(self, script: str, rank: int, problem: str) -> None:
        self.script, self.rank, self.problem = script, rank, problem
        super().__init__(f"{script} (rank {rank}): {problem}")


class ScriptExit(RuntimeError):
    """A user's script ended with ``sys.exit(code)``, code not 0: its rank failed with it."""

    def __init__(self, script: str, rank: int, code: object) -> None:
        self.script, self.rank, self.code = script, rank, code
        super().__init__(f"{script} (rank {rank}) exited with code {code!r}")
