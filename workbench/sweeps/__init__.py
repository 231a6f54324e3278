"""Reproducible sweeps: YAML specs, run ids, papermill execution of one notebook per point (the
only papermill user), and the runner that resumes and summarises."""
