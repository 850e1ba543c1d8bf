"""Offline evaluation of a checkpoint (`areal-hpc eval`): avg@n, pass@k and maj@n per data set with
the engines and the reward code of training."""
