"""What a simulated run measured: step boundaries, trained tokens and busy GPU-time, reduced to
effective throughput, step rate and idle fractions over the steady-state steps."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Run:
    """One simulated run of several training steps."""

    # Time each training step finished training, seconds (its weight update follows).
    step_ends: tuple[float, ...]
    # Tokens (prompt + generated) trained in each step.
    step_tokens: tuple[int, ...]
    # Steps left out of the averages while the pipeline fills.
    warmup: int
    # GPU-seconds generator and trainer GPUs were busy within the measured window.
    gen_busy_gpu_s: float
    train_busy_gpu_s: float
    gen_gpus: int
    train_gpus: int
    colocated: bool
    # Largest (training version - submission version) over the trained trajectories.
    max_staleness: int
    # Seconds every generator pauses for each weight update (split layouts), counted busy above.
    update_s: float = 0.0

    @property
    def window(self) -> tuple[float, float]:
        start = self.step_ends[self.warmup - 1] if self.warmup else 0.0
        return start, self.step_ends[-1]

    @property
    def window_s(self) -> float:
        start, end = self.window
        return end - start

    @property
    def tokens_per_s(self) -> float:
        """Effective throughput: tokens trained per second in steady state."""
        return sum(self.step_tokens[self.warmup:]) / self.window_s

    @property
    def trainer_bound_tokens_per_s(self) -> float:
        """What the trainer could absorb if it never waited: the ceiling more generators reach."""
        return sum(self.step_tokens[self.warmup:]) * self.train_gpus / self.train_busy_gpu_s

    @property
    def step_s(self) -> float:
        return self.window_s / (len(self.step_ends) - self.warmup)

    @property
    def first_step_s(self) -> float:
        return self.step_ends[0]

    @property
    def steps_per_hour(self) -> float:
        return 3600.0 / self.step_s

    def hours(self, steps: int) -> float:
        """Wall-clock hours of `steps` steps: the first (pipeline fill) then steady ones."""
        return (self.first_step_s + (steps - 1) * self.step_s) / 3600.0

    @property
    def gpus(self) -> int:
        return self.gen_gpus if self.colocated else self.gen_gpus + self.train_gpus

    @property
    def gpu_idle(self) -> float:
        return max(0.0, 1.0 - (self.gen_busy_gpu_s + self.train_busy_gpu_s) / (self.gpus * self.window_s))

    @property
    def gen_idle(self) -> float:
        """Idle share of generator GPU-time (colocated: of the generation phases only)."""
        span = self.window_s - (self.train_busy_gpu_s / self.gpus if self.colocated else 0.0)
        return max(0.0, 1.0 - self.gen_busy_gpu_s / (self.gen_gpus * span))

    @property
    def gen_not_generating(self) -> float:
        """Share of generator GPU-time not generating with the current weights: idle, or paused for
        a weight update. The controller's generator_idle_fraction measures this (a generator is
        busy while it has prompts in flight and holds the current version); gen_idle counts the
        pauses as busy. One pause follows each measured step but the last."""
        if self.colocated:
            return self.gen_idle
        paused = (len(self.step_ends) - self.warmup) * self.update_s * self.gen_gpus
        return min(1.0, max(0.0, 1.0 - (self.gen_busy_gpu_s - paused) / (self.gen_gpus * self.window_s)))

    @property
    def train_idle(self) -> float:
        if self.colocated:
            return 0.0
        return max(0.0, 1.0 - self.train_busy_gpu_s / (self.train_gpus * self.window_s))
