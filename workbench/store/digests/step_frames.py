"""What a sweep's step rows come to, per step: the frames every table and figure is composed from
that follow from the per-step pass, the warm-up cut and the per-rank pass, whichever way those
were made (:class:`workbench.store.digests.query.StepDigest` runs them over the rows;
:class:`workbench.store.digests.on_disk.DigestFrames` reads them from each run's digest). No torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from workbench.store.measured_query import KnownSteps, after_warmup
from workbench.store.window_query import WindowParts


class StepFrames:
    """The frames that follow from :attr:`per_step` (per run, attempt and step), :attr:`cut`
    (the warm-up rule's answer), ``attempt_hosts`` and the per-rank pass's gradient byte groups.
    Subclasses set those and give :meth:`per_rank`, :meth:`median` and
    :meth:`binned`.

    Whether the frames were kept (a run digest's) or are computed from the step rows is theirs
    to know: :attr:`source` says which, :attr:`note` why the rows were read, and the
    digest-or-rows choices (passes started in a thread, DDP's timers computed or kept, the
    stragglers kept) are methods here, so that a reader of the frames asks nothing else."""

    run_dirs: list[Path]
    per_step: pd.DataFrame
    cut: pd.DataFrame
    attempt_hosts: pd.DataFrame
    _evals: pd.DataFrame | None
    _byte_groups: pd.DataFrame | None
    #: Where the frames come from: ``"digests"``, frames kept by the runs' digests (read as
    #: they are), or ``"rows"``, the passes over the step rows in the engine
    #: (:class:`workbench.store.digests.query.StepDigest` says so).
    source: str = "digests"
    #: Why the rows were read where the runs' digests could not serve (a run still running,
    #: one without a digest); empty otherwise (:func:`workbench.store.digests.serve.open_frames`).
    note: str = ""
    #: The stragglers the runs' digests hold (the rule with its defaults); None where the
    #: frames come from the rows, and the straggler pass reads them.
    stragglers: pd.DataFrame | None = None
    #: DDP's sampled timers as kept (``comm_steps``, ``comm_ranks``), where they are.
    comm: dict[str, pd.DataFrame]

    def close(self) -> None:
        """Free what the frames hold open (nothing here)."""

    def start_passes(self) -> None:
        """Start the passes over the rows that a reader will want, where there are rows to pass
        over (nothing to start for kept frames)."""

    def comm_frames(self) -> dict[str, pd.DataFrame]:
        """DDP's sampled timers as the analysis reads them
        (:mod:`workbench.analysis.measured.comm_samples`): ``comm_steps``, ``comm_ranks`` and,
        where not kept apart, ``backward_rows`` (and, from the rows, ``single_rank_backward``)."""
        return self.comm

    def backward_of(self, run_ids: Sequence[str]) -> pd.DataFrame:
        """The backward timer's values (``backward_rows`` of :meth:`comm_frames`) of
        ``run_ids``."""
        b = self.comm_frames()["backward_rows"]
        return b[b["run_id"].isin([str(r) for r in run_ids])]

    def __enter__(self) -> StepFrames:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def per_rank(self) -> pd.DataFrame:
        raise NotImplementedError

    def median(
        self, column: str, run_ids: Sequence[str], min_world_size: int | None = None
    ) -> float:
        raise NotImplementedError

    def binned(self, run_id: str, values: Sequence[str], max_bins: int) -> tuple[pd.DataFrame, int]:
        raise NotImplementedError

    def known(self) -> KnownSteps:
        """What :func:`workbench.store.measured_query.measured_rows` would find again: the
        per-step maxima and the warm-up cut (the ranks are found as the rows are read)."""
        nw = self.per_step[self.per_step["measured"]]
        per_step = nw[["run_id", "attempt", "step", "step_s", "world_size", "timed"]]
        return KnownSteps(per_step.reset_index(drop=True), self.cut)

    def measured_steps(self) -> pd.DataFrame:
        """:attr:`per_step` of the measured steps (after each attempt's detected warm-up)."""
        return after_warmup(self.per_step[self.per_step["measured"]], self.cut)

    def window_parts(self, ranks: pd.DataFrame) -> WindowParts:
        """The window's parts (:class:`workbench.store.window_query.WindowParts`) from the
        per-step pass; ``ranks``: per run and attempt, the ranks with measured rows."""
        nw = self.per_step[self.per_step["measured"]]
        per_step = nw[["run_id", "attempt", "step", "step_s"]].assign(warmup=False)
        run_world = self.per_step.groupby("run_id", sort=True)["all_world_size"].max()
        m = self.measured_steps()
        steps = m[["run_id", "attempt", "step", "start_s", "end_s", "samples", "save_s"]]
        steps = steps.assign(world_size=m["world_size"])
        evals = self._evals
        return WindowParts(
            per_step.reset_index(drop=True),
            run_world.rename("world_size").reset_index(),
            steps.reset_index(drop=True),
            ranks,
            evals if evals is not None else pd.DataFrame(),
            self.cut,
        )

    def runs(self) -> pd.DataFrame:
        """Per run with step rows: ``world_size`` (the largest over all its rows), whether any
        row holds a loss (``has_loss``), and the rows (``rows``)."""
        g = self.per_step.groupby("run_id", sort=True)
        return pd.DataFrame(
            {
                "world_size": g["all_world_size"].max(),
                "has_loss": g["loss_n"].sum() > 0,
                "rows": g["rows"].sum(),
            }
        ).reset_index()

    def byte_counts(self) -> pd.DataFrame:
        """Per run, how many measured rows of a multi-rank world size handed each
        ``comm_bytes`` to allreduce, and, apart, each ``comm_buckets`` (``rows``; the other
        column NaN on each row, missing values not counted): exact medians of either over any
        set of runs. From :meth:`per_rank`'s pass (which it runs if it has not)."""
        if self._byte_groups is None:
            self.per_rank()
        byte_groups = self._byte_groups
        assert byte_groups is not None
        runs: list[object] = []
        values: dict[str, list[float]] = {"comm_bytes": [], "comm_buckets": []}
        rows: list[int] = []
        for column, hist in (("comm_bytes", "_bytes"), ("comm_buckets", "_buckets")):
            other = "comm_buckets" if column == "comm_bytes" else "comm_bytes"
            groups = zip(byte_groups["run_id"], byte_groups[hist], strict=True)
            for run_id, counts in groups:
                for value, n in (counts if isinstance(counts, dict) else {}).items():
                    runs.append(run_id)
                    values[column].append(float(value))
                    values[other].append(float("nan"))
                    rows.append(int(n))
        frame = pd.DataFrame({"run_id": pd.Series(runs, dtype=object), **values, "rows": rows})
        frame = frame.groupby(["run_id", "comm_bytes", "comm_buckets"], dropna=False, sort=True)
        return frame["rows"].sum().astype("int64").reset_index()

    def last_step_loss(self) -> pd.DataFrame:
        """Per run with measured rows: the mean loss over ranks at the last step of its last
        attempt (``final_loss``; NaN when no rank traced a loss there)."""
        m = self.measured_steps()
        m = m[m["attempt"] == m.groupby("run_id")["attempt"].transform("max")]
        last = m[m["step"] == m.groupby("run_id")["step"].transform("max")]
        out = last[["run_id", "loss"]].rename(columns={"loss": "final_loss"})
        return out.sort_values("run_id").reset_index(drop=True)

    def loss_per_step(self) -> pd.DataFrame:
        """Per run and step over all rows (warm-up included, attempts together): the mean loss
        over ranks, the largest world size and the samples of all ranks (``samples``)."""
        g = self.per_step.groupby(["run_id", "step"], sort=True)
        loss_n = g["loss_n"].sum()
        return pd.DataFrame(
            {
                "loss": g["loss_sum"].sum(min_count=1) / loss_n.where(loss_n > 0),
                "world_size": g["all_world_size"].max(),
                "samples": g["all_samples"].sum(),
            }
        ).reset_index()

    def attempt_ends(self) -> pd.DataFrame:
        """Per run and attempt over all rows: ``end_s``, the last step's end
        (``t_start_s + step_s``, largest over ranks)."""
        g = self.per_step.groupby(["run_id", "attempt"], sort=True)["all_end_s"].max()
        return g.rename("end_s").reset_index()
