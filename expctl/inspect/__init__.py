"""Read-only views of runs, from their files only: `expctl status`, `expctl runs`, `expctl diff`.
Imports no torch."""
