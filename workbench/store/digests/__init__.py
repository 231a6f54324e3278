"""Run digests, one room: a finished run's step rows digested once and kept beside its traces,
then read in their place by every report, Dashboard, tune, ``predict`` and printed finding.

The passes over the rows in the engine (:mod:`~workbench.store.digests.query`:
:class:`StepDigest`, its per-rank pass in :mod:`~workbench.store.digests.rank_pass`, the frames
that follow from them in :mod:`~workbench.store.digests.step_frames`), a run's digest on disk
(:mod:`~workbench.store.digests.on_disk`: its frames in Parquet, valid while the run has ended
and its trace files are unchanged), and building and opening them
(:mod:`~workbench.store.digests.serve`: the analysis hands its passes in and gets frames back,
from the digests or from the rows). No torch; no analysis: its rules come in as functions.
"""
