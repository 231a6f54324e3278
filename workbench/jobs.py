"""The only module that imports submitit: executors, the job environment a rank sees, requeue."""
