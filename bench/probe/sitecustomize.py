"""Bench-only probe (bench/gpu.sh feed-spy): EXPCTL_PROBE_AHEAD=N sets expctl.rank.batches.AHEAD
in every Python process started with bench/probe on PYTHONPATH (A/B of the feeding depth)."""

import os

if os.environ.get("EXPCTL_PROBE_AHEAD"):
    import expctl.rank.batches as batches

    batches.AHEAD = int(os.environ["EXPCTL_PROBE_AHEAD"])
