"""Launching a run (inline, local workers, Slurm; the code snapshot) and what a launched trial does
for its sweep (its record in the study, PBT's decisions and exploit)."""
