"""The result store on disk: atomic files, run and rank records, trace files (live Arrow streams,
consolidated Parquet, and the JSONL live files of older runs, read only), Parquet row-group tools,
loading runs and traces into pandas, and the run digests (:mod:`workbench.store.digests`). No
torch; imports config, schema and errors only."""

from workbench.store.load import iter_run_dirs, load_runs, load_traces

__all__ = ["iter_run_dirs", "load_runs", "load_traces"]
