"""areal-hpc: fully asynchronous RL for reasoning language models on HPC clusters."""

__version__ = "0.1.0"
