"""SLURM: heterogeneous-job scripts rendered from configs, the rank plan, and the run contract."""
