"""The MPI world: roles and placement, messages between ranks, and the launch of each rank."""
