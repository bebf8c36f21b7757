"""What every rank runs: the entry (`entry.main`), the loop, the build, metrics, checkpoints, the
control group, the report, the hooks outer wings take part through, the run directory and its
provenance. Knows nothing of launchers, Slurm or sweeps."""
