"""Rank 0's decisions, pure: the scheduler, the staleness bound, the trajectory buffer and the
checkpoint layout. The I/O around them is runtime/controller_rank.py."""
