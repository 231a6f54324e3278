"""A finished run's digest: the small frames that every report, Dashboard, ``predict`` and
printed finding compute their tables and figures from, written once beside the traces and read
in place of the step rows.

On disk, ``<run>/digest/``: one Parquet file per frame and ``digest.json``, written last, which
names them and holds :data:`DIGEST_VERSION` and the signature of the trace files the frames came
from (each file's name, size and modification time). A digest is valid while its version is
this one, run.json records the run's end, and the trace files are as they were: a resumed
attempt or a consolidation after a kill changes them, and the digest is built again. A run that
is still running has none. :class:`DigestFrames` hands the frames of several runs' digests out
as :class:`workbench.store.digests.query.StepDigest` computes them from the rows (read into
pandas by :mod:`workbench.store.digests.read_frames`). No torch.
"""

from __future__ import annotations

import io
import secrets
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from workbench import schema
from workbench.store.digests.query import (
    MEASURED,
    binned_measured,
    empty_comm,
    median_measured,
)
from workbench.store.digests.read_frames import (
    DERIVED,
    ReadDigest,
    concat_frames,
    joined_frames,
    read_table,
    table_frame,
)
from workbench.store.digests.step_frames import StepFrames
from workbench.store.engine import steps_view
from workbench.store.files import atomic_write_bytes, read_json, write_json

if TYPE_CHECKING:
    import duckdb
    import pyarrow as pa

#: Bumped whenever what a digest holds, or a rule its frames were computed with (the warm-up,
#: the stragglers), changes: an older digest is then built again.
DIGEST_VERSION = 3
DIGEST_DIR = "digest"
MANIFEST = "digest.json"
#: The frames of a digest (``stragglers``: the straggler rule's answer with its defaults;
#: ``binned``: each rank's step and compute time in the heatmaps' step bins).
TABLES = (
    "per_step",
    "cut",
    "per_rank",
    "attempt_hosts",
    "byte_counts",
    "comm_steps",
    "comm_ranks",
    "backward_rows",
    "single_rank_backward",
    "binned",
    "stragglers",
)
#: Tables read only when asked for (a base's backward timer: a row a rank and sampled step,
#: of which a report reads one run's; a 1-rank base's backward times, a row a measured step).
LAZY = ("backward_rows", "single_rank_backward")


def trace_signature(run_dir: str | Path) -> list[list[object]]:
    """Each trace file of the run (steps and evaluations, live or consolidated): its name, size
    and modification time in nanoseconds, sorted by name."""
    traces = Path(run_dir) / schema.TRACES_DIR
    out: list[list[object]] = []
    # by name (one folder: the order of the paths), as strings compare faster than paths
    for path in sorted(traces.glob("*-rank*.*"), key=lambda p: p.name) if traces.is_dir() else []:
        stat = path.stat()
        out.append([path.name, int(stat.st_size), int(stat.st_mtime_ns)])
    return out


def run_ended(run_dir: str | Path) -> bool:
    """Whether run.json records the run's end (a digest is never kept for a running run)."""
    try:
        return read_json(Path(run_dir) / schema.RUN_FILE).get("ended_at") is not None
    except (OSError, ValueError):
        return False


def _manifest(run_dir: Path) -> dict[str, object] | None:
    try:
        data = read_json(run_dir / DIGEST_DIR / MANIFEST)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def digest_state(run_dir: str | Path) -> str:
    """``valid``; ``running`` (no digest is used for a run that has not ended); ``missing``
    (none, or its files gone); ``stale`` (an older version, or trace files changed since it
    was written)."""
    run = Path(run_dir)
    if not run_ended(run):
        return "running"
    manifest = _manifest(run)
    if manifest is None:
        return "missing"
    if manifest.get("version") != DIGEST_VERSION:
        return "stale"
    if manifest.get("signature") != trace_signature(run):
        return "stale"
    files = manifest.get("files")
    if not isinstance(files, dict) or set(files) != set(TABLES):
        return "stale"
    if not all((run / DIGEST_DIR / str(name)).is_file() for name in files.values()):
        return "missing"  # two readers built it at once, and one removed the other's files
    return "valid"


def _derived_nulls(table: pa.Table, frame: pd.DataFrame, name: str) -> pa.Table:
    """``table`` with each derived column of ``name`` null where it equals what it is derived
    from, bit for bit (NaN where both are NaN); a value that differs keeps its own."""
    import pyarrow as pa

    for column, derive in DERIVED.get(name, {}).items():
        values = frame[column].to_numpy(dtype="float64")
        derived = derive(frame).to_numpy(dtype="float64")
        same = (values == derived) | (np.isnan(values) & np.isnan(derived))
        array = pa.array(values, mask=same, type=pa.float64())  # a NaN that differs stays NaN
        table = table.set_column(table.schema.get_field_index(column), column, array)
    return table


def _to_parquet(frame: pd.DataFrame, name: str = "") -> bytes:
    """The frame as Parquet, its numbers encoded for their shape (a digest is mostly floats
    without repeats and integers that count up): floats split by byte stream, integers as
    deltas, zstd over all; strings, lists and flags as pyarrow writes them."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = _derived_nulls(pa.Table.from_pandas(frame, preserve_index=False), frame, name)
    encoding = {}
    for field in table.schema:
        if pa.types.is_floating(field.type):
            encoding[field.name] = "BYTE_STREAM_SPLIT"
        elif pa.types.is_integer(field.type) and field.type.bit_width >= 32:
            encoding[field.name] = "DELTA_BINARY_PACKED"
    buffer = io.BytesIO()
    pq.write_table(
        table,
        buffer,
        compression="zstd",
        compression_level=9,
        use_dictionary=[f.name for f in table.schema if f.name not in encoding] or False,
        column_encoding=encoding or None,
    )
    return buffer.getvalue()


def write_digest(
    run_dir: str | Path, frames: dict[str, pd.DataFrame], signature: list[list[object]]
) -> Path:
    """Write ``frames`` (every name of :data:`TABLES`) as the run's digest, for the trace files
    of ``signature`` (taken before the frames were computed: a file changed in between leaves
    the digest stale, never wrong). Each frame goes to a file of its own name and a fresh token,
    then the manifest names them (a reader never pairs a new manifest with an old frame); the
    files of the digest it replaces are removed. Returns the manifest's path."""
    run = Path(run_dir)
    folder = run / DIGEST_DIR
    token = secrets.token_hex(4)
    names = {}
    for table in TABLES:
        names[table] = f"{table}-{token}.parquet"
        atomic_write_bytes(folder / names[table], _to_parquet(frames[table], table))
    binned = frames["binned"].attrs
    extra = {"binned_size": int(binned.get("size", 1)), "binned_bins": int(binned.get("bins", 0))}
    manifest = {"version": DIGEST_VERSION, "signature": signature, "files": names, **extra}
    write_json(folder / MANIFEST, manifest)
    for path in folder.glob("*.parquet"):
        if path.name not in names.values():
            path.unlink(missing_ok=True)
    return folder / MANIFEST


def _from_parquet(path: Path, name: str = "") -> pd.DataFrame:
    return table_frame(read_table(path), name)


def read_digest(run_dir: str | Path) -> Mapping[str, Any] | None:
    """The run's digest frames (a :class:`ReadDigest`: each made a pandas frame when first asked
    for), or None unless it is valid (:func:`digest_state`); the binned frame carries its bins
    and their size in ``attrs`` (``bins``, ``size``). The tables of :data:`LAZY` are their
    files' paths, read when asked for."""
    run = Path(run_dir)
    if digest_state(run) != "valid":
        return None
    manifest = _manifest(run)
    assert manifest is not None
    files = manifest.get("files")
    assert isinstance(files, dict)
    try:
        tables = {t: read_table(run / DIGEST_DIR / str(files[t])) for t in TABLES if t not in LAZY}
    except OSError:  # replaced by a newer digest while read
        return None
    paths = {t: run / DIGEST_DIR / str(files[t]) for t in LAZY}  # read when asked for
    binned = {"size": manifest.get("binned_size"), "bins": manifest.get("binned_bins")}
    return ReadDigest(tables, paths, binned)


def digest_bytes(run_dir: str | Path) -> int:
    """The size of the run's digest on disk (0 without one)."""
    folder = Path(run_dir) / DIGEST_DIR
    return sum(p.stat().st_size for p in folder.glob("*")) if folder.is_dir() else 0


class DigestFrames(StepFrames):
    """Several runs' digests (``digests``: the frames of :func:`read_digest`, or of a digest
    just built, in the order of ``run_dirs``) as :class:`workbench.store.digests.query.StepDigest`
    hands its frames out. Each frame is per run, so the runs' frames side by side are what one
    pass over all their rows gives (made one pandas frame from the runs' Arrow tables where
    every digest was read: :func:`workbench.store.digests.read_frames.joined_frames`).
    ``median`` (over rows of several runs) and a bin count other than the digest's go to the
    rows, through the engine, as the only reads of them."""

    def __init__(
        self,
        run_dirs: Iterable[str | Path],
        digests: Sequence[Mapping[str, Any]],
        evals: pd.DataFrame | None = None,
    ) -> None:
        self.run_dirs = [Path(p) for p in run_dirs]

        def joined(table: str, keys: list[str]) -> pd.DataFrame:
            read = [d for d in digests if isinstance(d, ReadDigest)]
            if len(read) == len(digests):  # one conversion, not one a run
                return joined_frames([d.tables[table] for d in read], keys, table)
            return concat_frames([d[table] for d in digests], keys)

        self.per_step = joined("per_step", ["run_id", "attempt", "step"])
        self.cut = joined("cut", ["run_id", "attempt"])
        self.attempt_hosts = joined("attempt_hosts", ["run_id", "attempt", "rank"])
        self._per_rank = joined("per_rank", ["run_id", "rank"])
        self._byte_counts = joined("byte_counts", ["run_id", "comm_bytes", "comm_buckets"])
        #: DDP's sampled timers as the analysis reads them
        #: (:mod:`workbench.analysis.measured.comm_samples`).
        self.comm = {
            "comm_steps": joined("comm_steps", ["run_id", "attempt", "step"]),
            "comm_ranks": joined("comm_ranks", ["run_id", "rank"]),
        }
        #: Each run's backward-timer values (a frame, or its file until asked for).
        self._backward: dict[str, pd.DataFrame | Path] = {
            Path(r).name: d["backward_rows"] for r, d in zip(self.run_dirs, digests, strict=True)
        }
        #: Each 1-rank run's backward times (a frame, or its file until asked for; empty for a
        #: run of more ranks).
        self._alone: dict[str, pd.DataFrame | Path] = {
            Path(r).name: d["single_rank_backward"]
            for r, d in zip(self.run_dirs, digests, strict=True)
        }
        self.stragglers = joined("stragglers", ["run_id", "attempt", "rank"])
        #: Each run's digest, for its binned frame (its ``attrs``: ``bins`` asked, ``size``
        #: steps a bin), made a pandas frame when a figure asks for that run's.
        self._binned = {Path(r).name: d for r, d in zip(self.run_dirs, digests, strict=True)}
        self._evals = evals
        self._byte_groups = None
        #: How many reads went to the rows (a ``median``, an odd bin count): none in a report.
        self.row_reads = 0

    def per_rank(self) -> pd.DataFrame:
        return self._per_rank.copy()

    def byte_counts(self) -> pd.DataFrame:
        return self._byte_counts

    def backward_of(self, run_ids: Sequence[str]) -> pd.DataFrame:
        """The backward-timer values of ``run_ids`` (each run's file read once, when asked)."""
        return self._kept(self._backward, "backward_rows", run_ids)

    def _kept(
        self, held: dict[str, pd.DataFrame | Path], table: str, run_ids: Sequence[str]
    ) -> pd.DataFrame:
        """The rows of a lazy table (``held``: by run, a frame or its file, read once) of
        ``run_ids``."""
        parts = []
        for run_id in (str(r) for r in run_ids):
            found = held.get(run_id)
            if isinstance(found, Path):
                found = held[run_id] = _from_parquet(found, table)
            if found is not None:
                parts.append(found)
        if not parts:
            return empty_comm(table)
        return concat_frames(parts, ["run_id"])

    def _rows(self, run_ids: Sequence[str]) -> duckdb.DuckDBPyConnection:
        """An engine connection whose view ``measured`` holds the measured rows of ``run_ids``
        (the digest's warm-up cut applied): the one way a digest goes back to the rows."""
        self.row_reads += 1
        wanted = {str(r) for r in run_ids}
        con = steps_view([d for d in self.run_dirs if d.name in wanted])
        con.register("_cut", self.cut[["run_id", "attempt", "last_warmup_step"]])
        con.execute(
            "CREATE VIEW measured AS SELECT * FROM (SELECT s.* EXCLUDE (attempt), "
            "coalesce(s.attempt, 0) AS attempt, c.last_warmup_step FROM steps s "
            "LEFT JOIN _cut c ON s.run_id = c.run_id AND coalesce(s.attempt, 0) = c.attempt) "
            f"WHERE {MEASURED}"
        )
        return con

    def median(
        self, column: str, run_ids: Sequence[str], min_world_size: int | None = None
    ) -> float:
        """The median of ``column`` over the measured rows of ``run_ids``. The backward time of
        1-rank runs is kept (a 1-rank base's backward compute); anything else is read from the
        rows (the analysis asks for one only where DDP's timers never ran)."""
        if column == "backward_s" and min_world_size is None and run_ids:
            alone = [self._kept(self._alone, "single_rank_backward", [r]) for r in run_ids]
            if all(len(a) for a in alone):  # every run of one rank, with backward times
                values = np.sort(np.concatenate([a["backward_s"] for a in alone]))
                n = len(values)  # the middle as the engine takes it (a NaN sorts last)
                return float(values[n // 2] if n % 2 else (values[n // 2 - 1] + values[n // 2]) / 2)
        con = self._rows(run_ids)
        try:
            return median_measured(con, column, run_ids, min_world_size)
        finally:
            con.close()

    def binned(self, run_id: str, values: Sequence[str], max_bins: int) -> tuple[pd.DataFrame, int]:
        """The run's binned frame from its digest where it holds ``values`` at ``max_bins``
        (the heatmaps' step and compute time); otherwise from the rows."""
        digest = self._binned.get(str(run_id))
        frame = digest["binned"] if digest is not None else None
        if frame is not None and frame.attrs.get("bins") == max_bins:
            if all(v in frame.columns for v in values):
                size = int(frame.attrs.get("size", 1))
                return frame[["rank", "step", "host", *values]].reset_index(drop=True), size
        con = self._rows([run_id])
        try:
            return binned_measured(con, run_id, values, max_bins)
        finally:
            con.close()
