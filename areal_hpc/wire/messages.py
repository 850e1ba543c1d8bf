"""Every message exchanged between ranks: the single message schema of the system.

Messages are dataclasses pickled with protocol 5 (wire/transport.py). Token ids, log-probs and
versions are numpy arrays (int32, float32, int32), never Python lists: an array pickles as one
copy of its bytes, a list as one object per token (a 12k-token trajectory: 146 kB and ~25 us to
pickle and unpickle as arrays, 184 kB and ~0.8 ms as lists). Messages carrying a batch pack its
trajectories into one array per field (PackedTrajectories). Bulk tensors (weights) never travel
here; they go through the weight-transfer groups (areal_hpc/rollout/weight_transfer.py).
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

from areal_hpc.wire.layout import Role

# The dtype of each array field of Trajectory, little-endian so a checkpoint reads on any host.
_ARRAYS = {"prompt_ids": np.dtype("<i4"), "output_ids": np.dtype("<i4"), "logprobs": np.dtype("<f4"),
           "versions": np.dtype("<i4")}


def _vector(values: Sequence | np.ndarray, dtype: np.dtype, what: str) -> np.ndarray:
    """`values` as a 1-d array of `dtype` (no copy when it already is one)."""
    array = np.asarray(values, dtype=dtype)
    if array.ndim != 1:
        raise ValueError(f"{what}: expected a 1-d sequence, got shape {array.shape}")
    return array


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
    prompt_ids: np.ndarray  # int32; a list is converted
    group_size: int
    sampling: SamplingParams
    # The prompt's reward reference, built and checked once at preflight: an
    # areal_hpc.reward.task.Reference (MathReference or CodeReference), typed Any here because
    # the wire imports no component package. None only where nothing scores the samples (a bare
    # Generator in tests and benchmarks).
    reference: Any = None
    # The prompt's data set (its row's data_source), copied onto each of its trajectories.
    data_source: str | None = None

    def __post_init__(self) -> None:
        self.prompt_ids = _vector(self.prompt_ids, _ARRAYS["prompt_ids"], f"request for prompt {self.prompt_id}")


@dataclass(eq=False)
class Trajectory:
    """Generator -> controller: one finished, scored sample.

    `logprobs[i]` and `versions[i]` belong to `output_ids[i]`: the log-probability under, and the
    policy version of, the weights that sampled that token. One trajectory may span versions when
    a weight update interrupted it. The four sequences are numpy arrays (int32 ids, float32
    log-probs, int32 versions); lists given to the constructor are converted. Use len(), never
    truth tests or `+` (which adds arrays elementwise).
    """

    prompt_id: int
    sample_index: int
    prompt_ids: np.ndarray
    output_ids: np.ndarray
    logprobs: np.ndarray
    versions: np.ndarray
    finish_reason: str
    reward: float = 0.0
    reward_reason: str = ""
    # The reward service failed on this sample (Verdict.infra): it is left out of training.
    reward_infra: bool = False
    # The response is right (Verdict.correct): what the accuracy metrics count.
    correct: bool = False
    # Seconds from submission to the last token, and to the reward.
    generate_s: float = 0.0
    reward_s: float = 0.0
    # The prompt's data set (GenerateRequest.data_source), for per-source batch statistics.
    data_source: str | None = None
    # Other numeric values a custom reward function returned with the score.
    reward_metrics: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        where = f"trajectory of prompt {self.prompt_id} sample {self.sample_index}"
        for name, dtype in _ARRAYS.items():
            setattr(self, name, _vector(getattr(self, name), dtype, f"{where}: {name}"))
        if not len(self.output_ids) == len(self.logprobs) == len(self.versions):
            raise ValueError(f"{where}: {len(self.output_ids)} output tokens but {len(self.logprobs)} logprobs"
                             f" and {len(self.versions)} versions")

    def __eq__(self, other: object) -> bool:
        """Field by field, arrays by value (the dataclass default cannot compare arrays)."""
        if not isinstance(other, Trajectory):
            return NotImplemented
        return all(np.array_equal(getattr(self, f.name), getattr(other, f.name)) if f.name in _ARRAYS
                   else getattr(self, f.name) == getattr(other, f.name) for f in fields(self))

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def oldest_version(self) -> int:
        return int(self.versions.min()) if len(self.versions) else -1

    def to_state(self) -> dict[str, Any]:
        """A JSON object for the controller checkpoint; arrays as base64 of their little-endian
        bytes (16 characters a token instead of ~30 as JSON numbers, and exact)."""
        state = {f.name: getattr(self, f.name) for f in fields(self)}
        for name, dtype in _ARRAYS.items():
            state[name] = base64.b64encode(_vector(state[name], dtype, name).tobytes()).decode("ascii")
        return state

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> Trajectory:
        # A list: a checkpoint written before the arrays were base64 (still read, for a resume).
        arrays = {name: state[name] if isinstance(state[name], list)
                  else np.frombuffer(bytearray(base64.b64decode(state[name])), dtype) for name, dtype in _ARRAYS.items()}
        return cls(**{**state, **arrays})


# Trajectory's fields that are not arrays, in order.
_SCALARS = tuple(f.name for f in fields(Trajectory) if f.name not in _ARRAYS)


def _pack(trajectories: Sequence[Trajectory]) -> tuple[list[tuple], np.ndarray, dict[str, np.ndarray]]:
    """Each trajectory's scalar fields, the lengths of its arrays, and each array field of all of
    them in one array (the one copy of the bytes)."""
    scalars = [tuple(getattr(t, name) for name in _SCALARS) for t in trajectories]
    lengths = np.array([[len(getattr(t, name)) for name in _ARRAYS] for t in trajectories], dtype=np.int64)
    arrays = {name: np.concatenate([getattr(t, name) for t in trajectories] or [np.empty(0, dtype)], dtype=dtype)
              for name, dtype in _ARRAYS.items()}
    return scalars, lengths.reshape(-1, len(_ARRAYS)), arrays


def _unpack(scalars: list[tuple], lengths: np.ndarray, arrays: dict[str, np.ndarray]) -> list[Trajectory]:
    """The trajectories `_pack` took apart; their arrays are views of the packed ones."""
    ends = np.cumsum(lengths, axis=0)[:-1]
    parts = {name: np.split(arrays[name], ends[:, i]) for i, name in enumerate(_ARRAYS)}
    return [Trajectory(**dict(zip(_SCALARS, values, strict=True)), **{name: parts[name][k] for name in _ARRAYS})
            for k, values in enumerate(scalars)]


def _with_trajectories(cls: type, others: dict[str, Any], *packed: Any) -> Any:
    return cls(**others, trajectories=_unpack(*packed))


class PackedTrajectories:
    """Base of the messages that carry many trajectories in a `trajectories` field: they pickle
    with each array field of all their trajectories in one array, not four arrays per trajectory.
    Channel sends such big arrays out of band, from their own memory, and the receiver's
    trajectories are views of the arrays it received: encoding a paper batch (~1.2 GB) costs one
    copy of its bytes, decoding it none (benchmarks/control_plane.py serialize_s_per_gb)."""

    def __reduce__(self) -> tuple:
        others = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "trajectories"}
        return _with_trajectories, (type(self), others, *_pack(self.trajectories))


@dataclass
class StepDone:
    """Trainer leader -> controller: the step finished and the policy is now `version`."""

    version: int
    metrics: dict[str, float]


@dataclass
class UpdateWeights:
    """Controller -> every trainer rank (through its replica's root) and every live generator: move
    `version`'s weights now (trainer stage leaders send, the other trainer ranks help gather) to
    `generators` through weight groups number `group`. When that number is new (the members
    changed, or a round of the last groups broke), each stage leader first makes a new group of
    them (a new WeightGroupAddress) and they join it: both sides decide by the number alone."""

    version: int
    generators: tuple[int, ...]
    group: int = 0


@dataclass
class UpdateBegun:
    """Generator -> controller: UpdateWeights(`version`) reached it and it is loading. A member of
    an update that never says so is the one holding the weight group up (controller_rank.py)."""

    generator_rank: int
    version: int


@dataclass
class WeightsLoaded:
    """Generator -> controller: the engine serves `version` (with timing of pause to resume)."""

    generator_rank: int
    version: int
    seconds: float
    checksums: dict[str, str] = field(default_factory=dict)
    # The engine's decode and prefill step-time sums since its previous update
    # (areal_hpc/rollout/engine_stats.py), added into the step's metrics under `gen/`.
    engine_stats: dict[str, float] = field(default_factory=dict)
    # Set when the transfer broke: the engine goes on with what it had until the update comes again.
    error: str | None = None


@dataclass
class SaveCheckpoint:
    """Controller -> every trainer rank (through its replica's root): write the trainer's part of
    checkpoint `path` (of `version`); with `hf`, also its Hugging Face export (path/hf)."""

    path: str
    version: int
    hf: bool = False


@dataclass
class CheckpointSaved:
    """Trainer leader -> controller: the trainer's part of `path` is complete."""

    path: str


@dataclass
class Shutdown:
    """Controller -> every rank: stop cleanly."""

    reason: str = "done"
    # False once a rank of the world died: MPI_Finalize would wait for it forever, so every rank
    # exits without it (runtime/world.py).
    finalize: bool = True


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
    # (areal_hpc/wire/lifeline.py).
    lifeline: tuple[str, int] | None = None
    lifeline_secret: str = ""


@dataclass
class JoinOffer:
    """Controller -> a spare generator that joined the running job (over its link, wire/link.py;
    it got the LaunchPlan when it joined): take the place of lost generator rank `rank`."""

    rank: int


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
    # The generator ranks of the group, in order: generator generators[i]'s vLLM workers are
    # group ranks 1 + i * tensor_parallel_size onwards (rank 0 is the sender).
    generators: tuple[int, ...]


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
    # Set when the transfer broke (a member of the weight group died): the update is sent again.
    error: str | None = None


@dataclass
class TrainShard(PackedTrajectories):
    """Controller -> root trainer rank of data-parallel replica `replica`, which broadcasts it in
    the replica: the replica's share of the batch that trains the policy at `version`
    (areal_hpc/trainer/batch_plan.py), and the whole batch's facts that the step's metrics need."""

    version: int
    replica: int
    # The replica's trajectories in batch order, each with its advantage over the whole batch.
    trajectories: list[Trajectory]
    advantages: list[float]
    # The replica's part of each PPO minibatch: ascending indices into `trajectories`.
    minibatches: list[list[int]]
    # The whole batch: tokens the model reads, trajectories, mean advantage.
    batch_tokens: int
    batch_trajectories: int
    advantage_mean: float
