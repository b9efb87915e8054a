"""Real processes: runworker fleets, runall, the production process set, a frozen lock
holder, pruning under a live worker."""
