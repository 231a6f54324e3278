"""What happened when a run's ranks stopped meeting: which rank did not arrive at which
collective, while which ranks waited in it and for how long, and what the missing rank was
doing; or, where the ranks issued different collectives at the same point, which.

Pure functions over the ranks' flight records (:func:`workbench.store.flight_file.read_flight`),
their status records and their stacks (the text ``faulthandler`` writes to a hung rank's log):
no processes or clocks, so each rule is tested on hand-built records.

How the ranks' collectives line up: each entry carries its process group's own sequence number
(the group's count of collectives issued, torch's C++ ones included), so the k-th collective
of a group is the same call on every rank of it, or a mismatch. A rank's collective is the one
it is in: the last one its Python code issued that never returned, else, for a rank that gave
up waiting (a timeout, a peer's error), the last one PyTorch's own recorder saw it issue.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from workbench.analysis.throughput.fsdp_comm import size
from workbench.run.failure import DIED_UNREPORTED, PEER_ERRORS
from workbench.store.flight_file import AFTER, AFTER_BACKWARD, BETWEEN, PHASES

#: The collective entry of a flight record, or of PyTorch's recorder, as compared here.
Entry = Mapping[str, Any]
#: What torch issues in C++ in each phase (no Python call to record): DDP's gradient buckets
#: in backward, its buffers' broadcast in forward.
_IN_CPP = {"backward": ("all_reduce", "DDP's gradients"), "forward": ("broadcast", "DDP's buffers")}
#: Frames of a stack shown after the user's own.
OTHER_FRAMES_SHOWN = 3
_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: Python's own modules, of any interpreter: ``.../lib/python3.11/selectors.py``.
_STDLIB = re.compile(r"[/\\]lib[/\\]python\d+(?:\.\d+)?[/\\]")


@dataclass(frozen=True)
class Hang:
    """The explanation: the culprit rank, the collective (group, sequence number, op, bytes),
    the culprit's step and phase, and the paragraph that says it."""

    rank: int
    seq: int
    op: str
    nbytes: int
    group: tuple[int, ...]
    step: int | None
    phase: str | None
    kind: str  # "missing" (did not arrive) or "mismatch" (another collective)
    text: str

    @property
    def summary(self) -> str:
        """The explanation in a few words, for a table: "rank 1 did not arrive at collective
        16 (all_reduce): data loading, step 10"."""
        if self.kind == "mismatch":
            what = f"issued another collective as {self.seq} ({self.op})"
        else:
            what = f"did not arrive at collective {self.seq} ({self.op})"
        where = f": {self.phase}, step {self.step}" if self.phase and self.step else ""
        return f"rank {self.rank} {what}{where}"

    def record(self) -> dict[str, Any]:
        """As run.json keeps it, under the failure's ``hang``."""
        return {
            "summary": self.summary,
            "rank": self.rank,
            "seq": self.seq,
            "op": self.op,
            "bytes": self.nbytes,
            "group": list(self.group),
            "step": self.step,
            "phase": self.phase,
            "kind": self.kind,
        }


def _gave_up(state: Mapping[str, Any] | None) -> bool:
    """Whether a rank failed because of its peers (a timeout, a closed connection)."""
    if not state or state.get("status") != "failed":
        return False
    exception = state.get("exception") or ""
    return any(marker in exception for marker in PEER_ERRORS)


def current_collective(
    record: Mapping[str, Any] | None, state: Mapping[str, Any] | None, world: Sequence[int]
) -> Entry | None:
    """The collective a rank is in (or died in): its last one issued from Python that never
    returned; else, where it gave up waiting, the last one PyTorch's recorder saw on the
    default group. None: it is in none."""
    if record is None:
        return None
    open_ = [e for e in record["collectives"] if e["returned_at"] is None]
    if open_:
        return open_[-1]
    dump = record.get("dump") or {}
    if not _gave_up(state):
        return None
    where = {"group": list(world), "step": dump.get("step"), "phase": record["phase"]}
    torch_entries = [e for e in dump.get("torch_recorder") or () if not e.get("p2p")]
    last = max((e for e in torch_entries if e["pg"] == "0"), key=lambda e: e["seq"], default=None)
    if last is not None:
        return {**last, **where}
    if dump.get("seq"):  # torch issued it in C++: its number is the group's count
        op, by = _IN_CPP.get(record["phase"], ("a collective", "torch"))
        return {"seq": dump["seq"], "op": op, "bytes": 0, "by": by,
                "issued_at": record.get("since"), **where}  # fmt: skip
    return None


def _history(record: Mapping[str, Any] | None, before: int) -> set[tuple[str, int]]:
    """(op, bytes) of the collectives a rank issued before sequence number ``before``."""
    if record is None:
        return set()
    dump = record.get("dump") or {}
    entries = [*record["collectives"], *(dump.get("torch_recorder") or ())]
    return {(e["op"], e["bytes"]) for e in entries if e["seq"] < before}


def explain_hang(
    records: Mapping[int, Mapping[str, Any] | None],
    states: Mapping[int, Mapping[str, Any]],
    processes: int,
    stacks: Mapping[int, str | None] | None = None,
    at: float | None = None,
) -> Hang | None:
    """The hang or mismatch the flight records show, or None where they show none (a rank's
    own exception, a clean run). ``stacks``: each rank's log text with its ``faulthandler``
    dump; ``at``: when the run was given up (epoch seconds), for how long a rank had been
    where it was."""
    world = list(range(processes))
    inside = {
        r: e
        for r in world
        if (e := current_collective(records.get(r), states.get(r), world)) is not None
    }
    if not inside:
        return None
    first = min(inside.values(), key=lambda e: e["seq"])
    group = tuple(first.get("group") or world)
    at_seq = {r: e for r, e in inside.items() if e["seq"] == first["seq"] and r in group}
    kinds = Counter((e["op"], e["bytes"]) for e in at_seq.values())
    named = _group_words(group, processes)
    if len(kinds) > 1:
        return _mismatch(at_seq, kinds, records, group, named)
    missing = [r for r in group if r not in at_seq]
    if not missing:
        return None
    culprit = min(missing, key=lambda r: (_liveness(states.get(r)), r))
    stack = (stacks or {}).get(culprit)
    return _missing(culprit, first, at_seq, records, states, (group, named), stack, at)


def _liveness(state: Mapping[str, Any] | None) -> int:
    """A missing rank that died explains more than one still running, than one that failed."""
    status = (state or {}).get("status")
    return {"died": 0, "running": 1}.get(status or "", 2)


def _group_words(group: Sequence[int], processes: int) -> str:
    if list(group) == list(range(processes)):
        return "the default group"
    return f"the group of ranks {', '.join(map(str, group))}"


def _where(step: Any, phase: Any) -> str:
    """Where a rank was, in words: "in the backward of step 9", "between steps 8 and 9"."""
    if phase == PHASES[AFTER]:
        return f"after its training (its last step {step})"
    if step in (None, 0):
        return "before its first step"
    if phase == PHASES[BETWEEN]:
        return f"between steps {step} and {step + 1}"
    if phase == PHASES[AFTER_BACKWARD]:
        return f"after the backward of step {step}, before its optimizer step"
    return f"in the {phase or 'unknown phase'} of step {step}"


def _collective(e: Entry) -> str:
    if e.get("by"):
        return f"{e['op']} of {e['by']}, issued in C++"
    of = f" of {size(int(e['bytes']))}" if e.get("bytes") else ""
    return f"{e['op']}{of}"


def _missing(
    culprit: int,
    first: Entry,
    at_seq: Mapping[int, Entry],
    records: Mapping[int, Mapping[str, Any] | None],
    states: Mapping[int, Mapping[str, Any]],
    group_named: tuple[Sequence[int], str],
    stack: str | None,
    at: float | None,
) -> Hang:
    group, named = group_named
    record = records.get(culprit) or {}
    state = states.get(culprit) or {}
    step, phase = record.get("step"), record.get("phase")
    waits = []
    for r, e in sorted(at_seq.items()):
        end = (states.get(r) or {}).get("ended_at") or at
        waited = f" {end - e['issued_at']:,.1f} s" if end and e.get("issued_at") else ""
        waits.append(f"rank {r} ({_where(e.get('step'), e.get('phase'))}) waited{waited}")
    status = state.get("status")
    doing = {
        "died": f"then {DIED_UNREPORTED}",
        "failed": f"then it failed: {state.get('exception')}",
        "completed": "then it finished its training",
    }.get(status or "", "alive but hung: still there when the run was given up")
    since = record.get("since")
    long = f" (for {at - since:,.1f} s)" if at and since and status == "running" else ""
    text = (
        f"Rank {culprit} did not arrive at collective {first['seq']} of {named} "
        f"({_collective(first)}): {', '.join(waits)} in it. Rank {culprit} was "
        f"{_where(step, phase)}{long}, {doing}."
    )
    frames = stack_words(stack)
    if frames:
        text += f" Its stack, most recent call first: {frames}."
    return Hang(
        culprit,
        int(first["seq"]),
        str(first["op"]),
        int(first.get("bytes") or 0),
        tuple(group),
        step,
        phase,
        "missing",
        text,
    )


def _mismatch(
    at_seq: Mapping[int, Entry],
    kinds: Counter[tuple[str, int]],
    records: Mapping[int, Mapping[str, Any] | None],
    group: Sequence[int],
    named: str,
) -> Hang:
    """Ranks that issued different collectives as the same one: the culprit is the rank whose
    collective the fewest issued; among as few, one whose collective it never issued before
    (a collective in one rank's code only), else the lowest."""
    seq = next(iter(at_seq.values()))["seq"]
    training = {r for r, e in at_seq.items() if e.get("phase") != PHASES[AFTER]}

    def odd(r: int) -> tuple[int, int, int, int]:
        e = at_seq[r]
        left_early = r not in training and bool(training)
        routine = (e["op"], e["bytes"]) in _history(records.get(r), seq)
        return (kinds[(e["op"], e["bytes"])], int(not left_early), int(routine), r)

    culprit = min(at_seq, key=odd)
    e = at_seq[culprit]
    issued = "; ".join(
        f"rank {r}: {_collective(x)} {_where(x.get('step'), x.get('phase'))}"
        for r, x in sorted(at_seq.items())
    )
    why = (
        f"Rank {culprit} had left its training (its steps were over, or it returned or exited "
        "early) while its peers were still training"
        if culprit not in training and training
        else f"Rank {culprit}'s {e['op']} is the odd one out (a collective its peers did not "
        "issue at that point of the training)"
    )
    text = (
        f"The ranks issued different collectives as collective {seq} of {named}: {issued}. {why}."
    )
    return Hang(
        culprit,
        int(seq),
        str(e["op"]),
        int(e.get("bytes") or 0),
        tuple(group),
        e.get("step"),
        e.get("phase"),
        "mismatch",
        text,
    )


def stack_frames(log: str | None) -> list[tuple[str, int, str]]:
    """The last ``faulthandler`` dump of the main thread in ``log``, (file, line, function)
    most recent call first; [] where there is none."""
    if not log:
        return []
    blocks = re.split(r"^(?:Current thread|Thread) 0x[0-9a-f]+ \(most recent call first\):\n",
                      log, flags=re.M)  # fmt: skip
    heads = re.findall(r"^(Current thread|Thread) 0x", log, flags=re.M)
    if not heads:
        return []
    current = [b for h, b in zip(heads, blocks[1:], strict=True) if h == "Current thread"]
    block = (current or blocks[1:])[-1]
    frames: list[tuple[str, int, str]] = []
    for line in block.splitlines():
        m = _FRAME.match(line)
        if m is None:
            if frames:
                break
            continue
        frames.append((m["file"], int(m["line"]), m["func"]))
    return frames


def is_users(path: str) -> bool:
    """Whether a frame's file is the user's: not Python's own, a library's or the workbench's."""
    if path.startswith("<") or "site-packages" in path or "dist-packages" in path:
        return False
    if os.path.abspath(path).startswith(_PACKAGE + os.sep):
        return False
    return _STDLIB.search(path) is None


def stack_words(log: str | None) -> str:
    """A stack as a line: the user's frames first (most recent call on top), then the
    innermost few of the others, and how many more."""
    frames = stack_frames(log)
    if not frames:
        return ""
    mine = [f for f in frames if is_users(f[0])]
    others = [f for f in frames if not is_users(f[0])]
    shown = mine + others[: OTHER_FRAMES_SHOWN if mine else OTHER_FRAMES_SHOWN + 2]
    words = [f"{_short(p)}:{line} in {func}" for p, line, func in shown]
    rest = len(frames) - len(shown)
    return " < ".join(words) + (f" (and {rest} more frames)" if rest > 0 else "")


def _short(path: str) -> str:
    """A frame's file as people read it: the workbench's and libraries' from their package."""
    for marker in ("site-packages" + os.sep, "dist-packages" + os.sep):
        if marker in path:
            return path.split(marker, 1)[1]
    if os.path.abspath(path).startswith(_PACKAGE + os.sep):
        return os.path.relpath(path, os.path.dirname(_PACKAGE))
    return os.path.basename(path)
