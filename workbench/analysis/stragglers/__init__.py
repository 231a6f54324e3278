"""Stragglers: the rule on step x rank matrices (straggler_rule, each step's others' median from
others_median), the pass over a run's attempts (slow_ranks, the next attempt read ahead: ahead).
Imports only the analysis's measured floor (and below); independent of throughput."""
