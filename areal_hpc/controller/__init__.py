"""Rank 0: staleness control, the trajectory buffer, checkpoints and the controller loop."""
