"""fp16 optimizer steps that the loss scaler skips, and when retrying one cannot help.

Megatron's DynamicGradScaler (megatron/core/optimizer/grad_scaler.py) multiplies the loss by its
scale before the backward pass, starting at trainer.initial_loss_scale. When the scaled gradients
overflow, optimizer.step() changes nothing and returns False, and after `hysteresis` (2) such
steps in a row the scale halves (then on every further one), down to MIN_LOSS_SCALE.

A skipped step leaves the weights as they were, so the engine runs the same minibatch again under
the lowered scale until a step is applied: no trajectory is dropped, the policy version (one per
training step) counts applied updates only, and the controller sees one StepDone per batch as
ever. Retrying stops being useful when a step is skipped at the floor scale: the gradients are
not finite without any scaling (a NaN from the model or the data), and the step fails. From a
start of 2^s, a minibatch is skipped at most s + hysteresis times before it is applied or fails.
"""

from __future__ import annotations

# The scaler's floor (megatron-core's default min_loss_scale); config/validate.py requires
# trainer.initial_loss_scale to be at least this.
MIN_LOSS_SCALE = 1.0


def futile_skip(scale: float, skipped: int) -> str | None:
    """Why a minibatch whose optimizer step was skipped at loss scale `scale` (the `skipped`-th
    skip of it) cannot be retried; None when a retry under the lowered scale may succeed.

    Decided from values every trainer rank shares (the scale, and the skip, which Megatron
    all-reduces), so all ranks retry or fail together."""
    if scale > MIN_LOSS_SCALE:
        return None
    return (f"fp16 gradients are not finite even at the minimum loss scale {MIN_LOSS_SCALE:g}"
            f" ({skipped} skipped optimizer steps): the loss or the data holds a NaN or inf, or the model"
            " overflows fp16 (Qwen2 models train in bf16: trainer.params_dtype = bf16)")
