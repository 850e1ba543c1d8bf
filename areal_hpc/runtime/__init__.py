"""The wiring of each rank, above the components: the launch and preflight (world, preflight),
rank 0's I/O around the scheduler (controller_rank), the trainer and generator ranks, how a
failure ends the job, and the fan-out of commands to the trainer replicas."""
