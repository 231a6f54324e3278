"""Throughput and communication: the curves a sweep's runs form (groups), their scaling table
(scaling), complete traces (completeness), per-rank summary, phase breakdown, memory, DDP's
communication (comm) and FSDP's (fsdp_comm). Imports only the analysis's measured floor (and
below)."""
