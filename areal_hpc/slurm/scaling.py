"""Strong scaling (the paper's Figure 4): one experiment resized to a GPU count, batch size fixed.

A quarter of the nodes train and three quarters generate, as in the paper's runs; trainer
tensor/pipeline sizes and the generators' tensor-parallel size stay as configured, so data
parallelism and the number of engines grow with the GPUs. The result is a list of `--set`
overrides that `areal-hpc slurm render` bakes into one job script per point.
"""

from __future__ import annotations

import re

from areal_hpc.config.schema import ExperimentConfig
from areal_hpc.errors import UserError

TRAIN_SHARE = 4  # one node in TRAIN_SHARE trains


def parse_context(text: str) -> int:
    """'16k' -> 16384, '32768' -> 32768: the longest sequence, prompt plus generation, in tokens."""
    m = re.fullmatch(r"(\d+)([kK]?)", text.strip())
    if not m:
        raise UserError(f"context {text!r}: expected tokens, e.g. 16k, 32k or 20000")
    return int(m.group(1)) * (1024 if m.group(2) else 1)


def strong_scaling_overrides(cfg: ExperimentConfig, gpus: int, context: int, steps: int,
                             run_dir: str) -> list[str]:
    """The KEY=VALUE overrides that run `cfg` on `gpus` GPUs for `steps` steps at `context` tokens."""
    gpn = cfg.cluster.gpus_per_node
    per_point = TRAIN_SHARE * gpn
    if gpus <= 0 or gpus % per_point:
        raise UserError(f"{gpus} GPUs: must be a multiple of {per_point} ({TRAIN_SHARE} x"
                        f" cluster.gpus_per_node = {gpn}): a quarter of the nodes train")
    nodes = gpus // gpn
    train_nodes = nodes // TRAIN_SHARE
    model_parallel = cfg.trainer.tp * cfg.trainer.pp
    if (train_nodes * gpn) % model_parallel:
        raise UserError(f"{gpus} GPUs: {train_nodes * gpn} training GPUs are not a multiple of"
                        f" trainer.tp * trainer.pp = {model_parallel}")
    generation = context - cfg.rollout.max_prompt_len
    if generation < 1:
        raise UserError(f"context {context}: not longer than rollout.max_prompt_len = {cfg.rollout.max_prompt_len}")
    return [
        f"name={cfg.name}-{gpus}gpu-{context}",
        f"total_steps={steps}",
        f"cluster.train_nodes={train_nodes}",
        f"cluster.rollout_nodes={nodes - train_nodes}",
        f"trainer.dp={train_nodes * gpn // model_parallel}",
        f"generator.count={(nodes - train_nodes) * gpn // cfg.generator.tensor_parallel_size}",
        f"rollout.max_new_tokens={generation}",
        f"trainer.micro_batch_tokens={max(cfg.trainer.micro_batch_tokens, context)}",
        "checkpoint.interval_steps=0",
        f"logging.dir={run_dir}",
    ]
