"""Cluster simulator: predicts throughput, step rate, idle time and out-of-memory layouts of
synchronous and asynchronous RL from 32 to 512 GPUs, on a laptop (docs/simulator.md).

Modules, in dependency order: hardware (GPU presets), cost_model (time of each piece of work),
memory (KV capacity, trainer memory), lengths (generation lengths), workload and layout (what
runs where), engine (fluid continuous-batching engines), async_system and sync_system (the two
schedules), run (what a run measured), calibration and fit (the efficiencies), run_fit (all
parameters fitted on measured runs), predict (the paper's models), commands (`areal-hpc sim`).
"""
