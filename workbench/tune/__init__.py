"""``workbench tune``: try what a run's diagnosis calls for, predicted first, then measured
(:func:`tune`); its result in words (:mod:`workbench.tune.render`)."""

from workbench.tune.tuner import TuneError, TuneResult, load_tune, tune

__all__ = ["TuneError", "TuneResult", "load_tune", "tune"]
