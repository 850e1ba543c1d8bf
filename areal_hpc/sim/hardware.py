"""GPU presets (and one CPU): the few hardware numbers the cost model needs, each with its source.

Bandwidths are per GPU and one direction, because a collective's time is bytes over the link
one GPU can push. All values are datasheet peaks; the calibrated efficiencies in cost_model.py
say how much of them the software reaches.
"""

from __future__ import annotations

from dataclasses import dataclass

from areal_hpc.errors import UserError


@dataclass(frozen=True)
class Hardware:
    """One GPU model inside an 8-GPU node."""

    name: str
    # Dense bf16/fp16 tensor-core peak, FLOP/s (no sparsity).
    peak_flops: float
    # HBM capacity and bandwidth.
    hbm_bytes: float
    hbm_bw: float
    # NVLink bandwidth per GPU, one direction, inside a node.
    nvlink_bw: float
    # Network bandwidth per GPU, one direction, between nodes.
    net_bw: float
    # Fixed time of one collective (or pipeline send) of a small message, whatever its size.
    collective_latency_s: float
    gpus_per_node: int = 8
    # Every process of a run shares one host of `gpus_per_node` cores (the CPU profile on one
    # machine): more processes than cores slow each other down (sim/host.py).
    one_host: bool = False


# A small NCCL all-reduce inside an NVLink node takes tens of microseconds (launch and protocol
# round trips, not bytes). An order of magnitude, not a measurement of ours: no GPU here.
NCCL_LATENCY_S = 20e-6

# NVIDIA H800 SXM5 (the paper's nodes): compute and HBM3 as the H100 SXM5 datasheet (989 TFLOP/s
# dense bf16, 80 GB, 3.35 TB/s); NVLink cut to 400 GB/s bidirectional (200 GB/s each way); the
# paper's RoCE fabric, 3.2 Tbit/s per node = 400 GB/s per node = 50 GB/s per GPU.
H800 = Hardware("H800", 989.4e12, 80e9, 3.35e12, 200e9, 50e9, NCCL_LATENCY_S)

# NVIDIA H100 SXM5 datasheet: 989 TFLOP/s, 80 GB HBM3 at 3.35 TB/s, NVLink 900 GB/s
# bidirectional; one 400 Gbit/s NDR InfiniBand port per GPU.
H100 = Hardware("H100", 989.4e12, 80e9, 3.35e12, 450e9, 50e9, NCCL_LATENCY_S)

# NVIDIA H200 SXM datasheet: the H100's compute, 141 GB HBM3e at 4.8 TB/s, same links.
H200 = Hardware("H200", 989.4e12, 141e9, 4.8e12, 450e9, 50e9, NCCL_LATENCY_S)

# The CPU profile's machine class (this repository's CI and development machines: Intel Xeon with
# AVX-512 and AMX, Sapphire Rapids class, 2.6 GHz, 2 cores, 24 GiB): one core is one "GPU", as the
# CPU profile binds each generator engine and each trainer rank to a core. Peak: fp32 (the CPU
# profile's dtype), 2 AVX-512 FMA units x 16 lanes x 2 FLOP x 2.6 GHz = 166 GFLOP/s. Memory: the
# machine's 24 GiB over its 2 cores. Bandwidths measured here (numpy copy of 64 MiB, read + write:
# 7.6 GB/s; TCP over loopback, what gloo uses between ranks: 2.2 GB/s; both under load, so low
# bounds). A gloo all-reduce between 2 ranks on loopback takes 11 ms whatever its size (11.4 ms at
# 8 KB, 12.6 ms at 800 KB; 16-18 ms beside one busy process), which is what tensor parallelism's
# many small all-reduces cost here. The fitted efficiencies are relative to these numbers, and
# predictions on this preset multiply by the same numbers the fit divided by, so their errors
# cancel (docs/simulator.md).
CPU = Hardware("cpu", 166.4e9, 12 * 2**30, 8e9, 2e9, 2e9, 11e-3, gpus_per_node=2, one_host=True)

PRESETS = {hw.name.lower(): hw for hw in (H800, H100, H200, CPU)}


def preset(name: str) -> Hardware:
    """The preset called `name` (case-insensitive)."""
    try:
        return PRESETS[name.lower()]
    except KeyError:
        raise UserError(f"unknown hardware '{name}'; choose one of {', '.join(PRESETS)}") from None
