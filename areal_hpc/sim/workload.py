"""What a run asks of the cluster: batch, lengths, staleness, concurrency, taken from a config."""

from __future__ import annotations

from dataclasses import dataclass, replace

from areal_hpc.config.schema import ExperimentConfig
from areal_hpc.errors import UserError
from areal_hpc.sim.lengths import REASONING, LengthDistribution

# Simulated prompt tokens by task (chat template included), assumed: competition-math problems
# are a few sentences; code problems carry a statement, constraints and examples.
PROMPT_TOKENS = {"math": 128, "code": 512}


@dataclass(frozen=True)
class Workload:
    # Prompts per training step, and samples (trajectories) per prompt.
    batch_prompts: int
    group_size: int
    # Tokens of every simulated prompt.
    prompt_len: int
    # Longest prompt the config allows; with the length cap it sizes the KV cache and training
    # micro-batches.
    max_prompt_len: int
    lengths: LengthDistribution
    # Staleness bound; None is unbounded (eta = infinity).
    eta: int | None
    # Training gate of the controller's StalenessManager: "strict" or "admission".
    staleness_gate: str
    # Prompts in flight across all generators at once.
    max_concurrent: int
    # Sequences one engine decodes at once.
    max_num_seqs: int
    # PPO minibatches (gradient synchronisations) per step.
    minibatches: int
    # Token budget of one packed training micro-batch.
    micro_batch_tokens: int
    # Fraction of HBM an inference engine may use.
    memory_utilization: float
    # Interrupted sequences recompute their KV cache (mode abort) rather than keep it.
    reprefill: bool
    # Seconds from a sample's last token to its reward reaching the controller (scored in
    # parallel, so a latency, not a throughput limit).
    reward_s: float = 0.0

    @property
    def max_context(self) -> int:
        return self.max_prompt_len + self.lengths.cap

    @property
    def batch_trajectories(self) -> int:
        return self.batch_prompts * self.group_size

    def with_eta(self, eta: int | None) -> Workload:
        return replace(self, eta=eta)

    def with_gate(self, gate: str) -> Workload:
        return replace(self, staleness_gate=gate)


def workload_from(cfg: ExperimentConfig, context: int | None = None,
                  lengths: LengthDistribution = REASONING, reward_s: float = 0.0,
                  prompt_len: int | None = None) -> Workload:
    """The workload of an experiment config. `context` (prompt + generation, tokens) replaces the
    config's max_prompt_len + max_new_tokens; the generation cap becomes context - max_prompt_len.
    `lengths` (its cap replaced by that), `reward_s` and `prompt_len` (None: PROMPT_TOKENS of the
    task) default to the paper's assumptions; a calibration (calibration.py) gives measured ones."""
    r = cfg.rollout
    cap = r.max_new_tokens if context is None else context - r.max_prompt_len
    if cap < 1:
        raise UserError(f"--context {context} leaves no room to generate after the "
                        f"{r.max_prompt_len}-token prompt limit")
    return Workload(
        batch_prompts=r.batch_prompts,
        group_size=r.group_size,
        prompt_len=min(PROMPT_TOKENS[cfg.reward.kind] if prompt_len is None else prompt_len, r.max_prompt_len),
        max_prompt_len=r.max_prompt_len,
        lengths=lengths.with_cap(cap),
        eta=r.eta,
        staleness_gate=r.staleness_gate,
        max_concurrent=r.max_concurrent,
        max_num_seqs=cfg.generator.max_num_seqs,
        minibatches=cfg.ppo.minibatches,
        micro_batch_tokens=cfg.trainer.micro_batch_tokens,
        memory_utilization=cfg.generator.gpu_memory_utilization,
        reprefill=cfg.generator.interrupt_mode == "abort",
        reward_s=reward_s,
    )
