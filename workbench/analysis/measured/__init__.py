"""What was measured: the measured window and its warm-up (windows, warmup), a store's step rows
left in the engine (stored), DDP's sampled timers per step and rank (comm_samples), step x rank
cells (rank_cells), a point's link class (links), FLOPs and peaks (flops), numbers for people
(units), display. The analysis's ground floor: imports only the store, config and schema."""
