"""Sweeps (`expctl run -m`): the plan and its search space, the local driver of trials (pool,
resources), the ledger read back, results as tables and plots."""
