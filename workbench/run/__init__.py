"""Launching and watching runs from the caller's side: preflight checks, ``launch``, one back end
per executor, the run handle, failure analysis, studies. Imports rank (the task it submits),
analysis (a finished run's summary), store and config; never ui or sweeps."""
