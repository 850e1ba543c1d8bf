"""Every message exchanged between ranks: the single message schema of the system.

Messages are small dataclasses sent with mpi4py's pickled send/recv. Bulk tensors (weights) never
travel here; they go through the weight-transfer groups (areal_hpc/rollout/weight_transfer.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from areal_hpc.runtime.layout import Role


@dataclass
class SamplingParams:
    """How one prompt is sampled (mirrors the rollout section of the config)."""

    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    # Seed of this request's sampling; None lets the engine choose.
    seed: int | None = None


@dataclass
class GenerateRequest:
    """Controller -> generator: sample `group_size` completions of one prompt."""

    prompt_id: int
    prompt_ids: list[int]
    group_size: int
    sampling: SamplingParams
    # What the reward service needs: {"kind": "math", "answer": "..."} or
    # {"kind": "code", "tests": {...inputs/outputs/fn_name...}}.
    reward_spec: dict[str, Any] = field(default_factory=dict)


@dataclass
class Trajectory:
    """Generator -> controller: one finished, scored sample.

    `logprobs[i]` and `versions[i]` belong to `output_ids[i]`: the log-probability under, and the
    policy version of, the weights that sampled that token. One trajectory may span versions when
    a weight update interrupted it.
    """

    prompt_id: int
    sample_index: int
    prompt_ids: list[int]
    output_ids: list[int]
    logprobs: list[float]
    versions: list[int]
    finish_reason: str
    reward: float = 0.0
    reward_reason: str = ""
    # Seconds from submission to the last token, and to the reward.
    generate_s: float = 0.0
    reward_s: float = 0.0

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def oldest_version(self) -> int:
        return min(self.versions) if self.versions else -1


@dataclass
class TrainBatch:
    """Controller -> trainer leader: the trajectories to train the policy at `version` on."""

    version: int
    trajectories: list[Trajectory]


@dataclass
class StepDone:
    """Trainer leader -> controller: the step finished and the policy is now `version`."""

    version: int
    metrics: dict[str, float]


@dataclass
class UpdateWeights:
    """Controller -> trainer stage leaders and generators: move `version`'s weights now."""

    version: int


@dataclass
class WeightsLoaded:
    """Generator -> controller: the engine serves `version` (with timing of pause to resume)."""

    generator_rank: int
    version: int
    seconds: float
    checksums: dict[str, str] = field(default_factory=dict)


@dataclass
class SaveCheckpoint:
    """Controller -> trainer leader: write the trainer's part of checkpoint `path` (of `version`)."""

    path: str
    version: int


@dataclass
class CheckpointSaved:
    """Trainer leader -> controller: the trainer's part of `path` is complete."""

    path: str


@dataclass
class Shutdown:
    """Controller -> every rank: stop cleanly."""

    reason: str = "done"


@dataclass
class WorkerFailed:
    """Any rank -> controller: an exception ended this rank's work."""

    rank: int
    role: Role
    # Index among the ranks of the role (trainer 0, generator 3).
    index: int
    reason: str


@dataclass
class LaunchPlan:
    """Rank 0 -> every rank at start: the checked config and what to load. Sent only after the
    config, the world size, the model directory and the data have been checked."""

    config: Any
    # Hugging Face directory the trainer and the generators start from.
    model_dir: str
    # Checkpoint to resume from (None: a fresh start).
    resume_dir: str | None = None
    # Where every worker connects its lifeline to rank 0, and the job's secret it must present
    # (areal_hpc/runtime/lifeline.py).
    lifeline: tuple[str, int] | None = None
    lifeline_secret: str = ""


@dataclass
class TrainerGroupAddress:
    """First trainer rank -> the other trainer ranks: where their torch.distributed group meets."""

    host: str
    port: int


@dataclass
class WeightGroupAddress:
    """Trainer stage leader -> controller -> generators: where that stage's weight group meets."""

    stage: int
    host: str
    port: int
    world_size: int


@dataclass
class WorkerReady:
    """Any worker -> controller: started, weights loaded, weight groups joined."""

    rank: int
    role: Role


@dataclass
class WeightsSent:
    """Trainer stage leader -> controller: the checksums of the tensors it sent for `version`, to
    check against what every generator loaded."""

    stage: int
    version: int
    checksums: dict[str, str] = field(default_factory=dict)
