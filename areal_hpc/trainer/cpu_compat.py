"""Every workaround that lets megatron-core 0.16.1 run on a machine without CUDA, in one place.

megatron-core assumes a GPU in a handful of places (measured with 0.16.1 on a CPU-only machine).
Each fix below names the megatron-core file:line it answers (paths under `megatron/core/`, line
numbers of 0.16.1). The layer is on exactly when the trainer's configured device resolves to the
CPU (`wire/device.py` device_of; parallel.init_trainer_world then calls `apply()`), whether or not
the machine has a GPU: until then `seed()` returns at once and `cuda_as_cpu()` is a no-op context,
so the GPU profile runs megatron-core unchanged and `device: cpu` on a GPU machine mixes no
devices. The optimizer-state fixes (prime_optimizer_state, restore_adam_steps) answer the absence of Apex and
Transformer Engine, which is the CPU profile, and check exactly that.

One more CPU difference lives in the layer spec rather than here: the local DotProductAttention
rejects packed sequences (transformer/dot_product_attention.py:153) and builds its causal mask on
"cuda" (transformer/utils.py:35), so the CPU spec (model.py) uses packed_attention.py instead.
"""

from __future__ import annotations

import contextlib
import types
from collections.abc import Iterator

import torch
from torch.overrides import TorchFunctionMode

_applied = False


def active() -> bool:
    """Whether this process trains on the CPU through this layer (`apply()` was called)."""
    return _applied


def apply() -> None:
    """Process-wide patches of `torch.cuda`; idempotent; call before building any Megatron module,
    on a trainer whose device is the CPU."""
    global _applied
    if _applied:
        return
    # torch.cuda.current_device() is passed as `device=` when megatron allocates tensors:
    # models/common/embeddings/rotary_pos_embedding.py:162, pipeline_parallel/p2p_communication.py:321,
    # distributed/param_and_grad_buffer.py:800/806, utils.py:631, tensor_parallel/layers.py:552,
    # tensor_parallel/mappings.py:141/181. On a CPU-only torch it raises; answer "cpu".
    torch.cuda.current_device = lambda: torch.device("cpu")
    # pipeline_parallel/p2p_communication.py:398 synchronises the device after batched p2p.
    torch.cuda.synchronize = lambda device=None: None
    # pipeline_parallel/schedules.py:596 and :2138 allocate the token counter on "cuda" at the start
    # of every forward-backward schedule. That module alone sees a torch whose zeros() allocate on
    # the CPU (a TorchFunctionMode around the whole schedule would slow every op by ~15%).
    from megatron.core.pipeline_parallel import schedules

    schedules.torch = _CpuZerosTorch("torch")
    # Activation recomputation (trainer.recompute) saves and restores the CUDA generator's state
    # around each recomputed part: tensor_parallel/random.py:447 and :458 (_get_all_rng_states,
    # _set_all_rng_states). There is none; the CPU generator and the tracker's states (the
    # other two of those three) are what the CPU profile draws from.
    from megatron.core.tensor_parallel import random as mrandom

    mrandom._get_cuda_rng_state = lambda *args, **kwargs: torch.empty(0, dtype=torch.uint8)
    mrandom._set_cuda_rng_state = lambda *args, **kwargs: None
    _applied = True


class _CpuZerosTorch(types.ModuleType):
    """The torch module, except that zeros(device="cuda") allocates on the CPU."""

    def __getattr__(self, name: str):
        return getattr(torch, name)

    def zeros(self, *args, **kwargs):
        if _is_cuda(kwargs.get("device")):
            kwargs = {**kwargs, "device": "cpu"}
        return torch.zeros(*args, **kwargs)


class _CpuRNGStatesTracker:
    """The CPU stand-in for tensor_parallel/random.py's CudaRNGStatesTracker.

    Its add() (random.py:235) and fork() (random.py:250-277) read and write the CUDA generator.
    Megatron forks the tracker around dropout with sequence parallelism
    (transformer/transformer_block.py:707, models/common/embeddings/language_model_embedding.py:145);
    here a fork swaps the CPU generator's state instead.
    """

    def __init__(self) -> None:
        self.states_: dict[str, torch.Tensor] = {}

    def is_initialized(self) -> bool:
        return bool(self.states_)

    def add(self, name: str, seed: int) -> None:
        self.states_[name] = torch.Generator().manual_seed(seed).get_state()

    def get_states(self) -> dict[str, torch.Tensor]:
        return dict(self.states_)

    def set_states(self, states: dict[str, torch.Tensor]) -> None:
        self.states_ = dict(states)

    @contextlib.contextmanager
    def fork(self, name: str = "model-parallel-rng") -> Iterator[None]:
        outer = torch.get_rng_state()
        torch.set_rng_state(self.states_[name])
        try:
            yield
        finally:
            self.states_[name] = torch.get_rng_state()
            torch.set_rng_state(outer)


def seed(seed: int, tp_rank: int) -> None:
    """Install the CPU RNG tracker seeded like megatron's model_parallel_cuda_manual_seed.

    tensor_parallel/random.py:422 (model_parallel_cuda_manual_seed) seeds CUDA generators; on CPU
    the default generator takes the data-parallel seed and the tracker the tensor-parallel one.
    """
    if not active():
        return
    from megatron.core.tensor_parallel import random as mrandom

    torch.manual_seed(seed)
    tracker = _CpuRNGStatesTracker()
    tracker.add(mrandom._DATA_PARALLEL_RNG_TRACKER_NAME, seed)
    tracker.add(mrandom._MODEL_PARALLEL_RNG_TRACKER_NAME, seed + 2718 + tp_rank)
    mrandom._CUDA_RNG_STATE_TRACKER = tracker
    mrandom._CUDA_RNG_STATE_TRACKER_INITIALIZED = True


def _is_cuda(device: object) -> bool:
    return (isinstance(device, str) and device.startswith("cuda")) or (
        isinstance(device, torch.device) and device.type == "cuda"
    )


class _CudaAsCpu(TorchFunctionMode):
    """Runs megatron code that hard-codes the CUDA device on CPU tensors instead.

    Used around model, optimizer and checkpoint calls, not around forward and backward passes.
    Answers `.cuda()` in models/common/language_module/language_module.py:244 (tied embeddings
    with pipeline parallelism); device="cuda" in optimizer/optimizer.py:481/485/907,
    optimizer/clip_grads.py:103/174 and utils.py:1207; and the
    `tensor.type() == "torch.cuda.FloatTensor"` checks of optimizer/clip_grads.py:167 and
    optimizer/distrib_optimizer.py:361/420/582 (which would reject fp32 CPU parameters at :431).
    """

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.Tensor.type and len(args) == 1 and not kwargs:
            name = func(*args)
            return name.replace("torch.", "torch.cuda.", 1) if args[0].device.type == "cpu" else name
        if func is torch.Tensor.cuda:
            return args[0]
        if _is_cuda(kwargs.get("device")):
            kwargs = {**kwargs, "device": "cpu"}
        return func(*args, **kwargs)


def cuda_as_cpu() -> contextlib.AbstractContextManager:
    """Context for megatron calls that name the CUDA device (see _CudaAsCpu); no-op on CUDA."""
    return _CudaAsCpu() if active() else contextlib.nullcontext()


def prime_optimizer_state(optimizer) -> None:
    """Give a fresh distributed optimizer per-parameter state before a checkpoint is loaded into it.

    Without Apex or Transformer Engine (the CPU profile), optimizer/distrib_optimizer.py:640-642
    reads the Adam step from torch's per-parameter state and asserts there is exactly one value,
    which fails on an optimizer that has not stepped yet. Megatron's own remedy for that case
    (distrib_optimizer.py:1137, used at :1357 for FSDP) is one step on zero gradients; the loaded
    checkpoint then overwrites both the weights and the state.
    """
    from megatron.core.optimizer import distrib_optimizer

    if distrib_optimizer.HAVE_APEX_OR_TE:
        return
    for opt in getattr(optimizer, "chained_optimizers", [optimizer]):
        if isinstance(opt, distrib_optimizer.DistributedOptimizer) and not opt.optimizer.state:
            with cuda_as_cpu():
                opt._init_optimizer_states_with_dummy_values()


def restore_adam_steps(optimizer) -> None:
    """Give each parameter its own, correct Adam step after a distributed checkpoint is loaded.

    Without Apex or Transformer Engine, optimizer/distrib_optimizer.py:818-825 hands one shared
    step tensor to every parameter's torch Adam state (torch then increments it once per parameter
    per step), and :940-941 copies into it the step of the template the checkpoint was loaded
    through. The step saved in the param groups (:672-674) is the right one; set it per parameter.
    """
    from megatron.core.optimizer import distrib_optimizer

    if distrib_optimizer.HAVE_APEX_OR_TE:
        return
    for opt in getattr(optimizer, "chained_optimizers", [optimizer]):
        if not isinstance(opt, distrib_optimizer.DistributedOptimizer):
            continue
        for group in opt.optimizer.param_groups:
            for param in group["params"]:
                state = opt.optimizer.state[param]
                if "step" in state and group.get("step") is not None:
                    state["step"] = torch.tensor(float(group["step"]), dtype=torch.float32)


class RMSNorm(torch.nn.RMSNorm):
    """The norm of the CPU layer spec, also under sequence parallelism.

    Without Apex or Transformer Engine the local spec uses transformer/torch_norm.py's
    WrappedTorchNorm, which asserts that sequence parallelism is off (torch_norm.py:32). This
    norm marks its weight `sequence_parallel` as TE's norms do, so finalize_model_grads
    (distributed/finalize_model_grads.py:354) all-reduces its gradient over the TP group.
    """

    def __init__(self, config, hidden_size: int, eps: float = 1e-5, **_):
        super().__init__(hidden_size, eps=eps)
        self.weight.sequence_parallel = config.sequence_parallel
