"""The typed schema of one experiment: the single source of truth for every setting.

Each dataclass is one section of the YAML file. Every option is documented by the comment above
it. Defaults describe the tiny CPU profile unless noted; the paper's settings live in
configs/experiments/.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ModelConfig:
    """A Qwen2-architecture decoder (RMSNorm, SwiGLU, RoPE, GQA, bias on q/k/v only)."""

    # Short name used in logs, checkpoints and the simulator (e.g. "qwen2-32b").
    name: str = "tiny-qwen2"
    # Directory of a Hugging Face checkpoint (config.json + safetensors). When set, its weights
    # initialise the trainer and the generators; the shape fields below must match its config.
    path: str | None = None
    # Tokenizer directory; defaults to `path`.
    tokenizer_path: str | None = None
    vocab_size: int = 512
    hidden_size: int = 128
    intermediate_size: int = 384
    num_layers: int = 4
    num_attention_heads: int = 4
    # Key/value heads (grouped-query attention); must divide num_attention_heads.
    num_query_groups: int = 2
    max_position_embeddings: int = 1024
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    # Whether the output projection shares the input embedding's weights.
    tie_word_embeddings: bool = False

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads


@dataclass
class TrainerConfig:
    """Megatron-core trainer ranks: world = tp * pp * dp."""

    # Tensor-parallel size; must divide attention heads and query groups.
    tp: int = 1
    # Pipeline-parallel size; must divide num_layers.
    pp: int = 1
    # Data-parallel size.
    dp: int = 1
    # Megatron sequence parallelism (needs tp > 1; on CPU only with the compatibility layer).
    sequence_parallel: bool = False
    # Token budget of one packed, padding-free micro-batch (the paper's Algorithm 1 capacity).
    micro_batch_tokens: int = 4096
    # k_min of Algorithm 1: the least number of micro-batches per minibatch.
    min_micro_batches: int = 1
    # Parameter dtype for training: fp32 on CPU; bf16 or fp16 on GPU (grads/optimizer stay fp32).
    params_dtype: str = "fp32"
    # Use Megatron's distributed optimizer (optimizer state sharded over dp).
    distributed_optimizer: bool = True


@dataclass
class GeneratorConfig:
    """vLLM generator ranks, each driving one AsyncLLM engine."""

    # Number of generator ranks (engines).
    count: int = 1
    # vLLM tensor-parallel size of each engine (GPUs per engine).
    tensor_parallel_size: int = 1
    # Fraction of GPU memory vLLM may use (GPU profile).
    gpu_memory_utilization: float = 0.85
    # Fixed KV-cache size in bytes (CPU profile; vLLM's default reservation fails there).
    kv_cache_bytes: int = 64 * 2**20
    # Most sequences one engine decodes at once.
    max_num_seqs: int = 256
    # What happens to in-flight requests on a weight update: "abort" (stop, recompute the KV cache
    # of prompt + prefix under the new weights; the paper's) or "keep" (continue on the old cache).
    interrupt_mode: str = "abort"
    # Dtype of the inference weights and KV cache: fp32 on CPU, bf16/fp16 on GPU.
    dtype: str = "fp32"
    # Bucket size in bytes for streaming weights from trainers to generators.
    weight_bucket_bytes: int = 256 * 2**20


@dataclass
class RolloutConfig:
    """Generation requests and the staleness bound."""

    # Staleness bound eta (in policy versions); 0 is synchronous RL.
    eta: int = 4
    # Training batch size B, in prompts (each prompt yields group_size trajectories).
    batch_prompts: int = 8
    # Samples per prompt (the paper's 16 answers per prompt).
    group_size: int = 4
    # Most prompts in flight across all generators at once.
    max_concurrent: int = 64
    # Longest prompt in tokens; longer prompts are an error when data is loaded.
    max_prompt_len: int = 128
    # Most generated tokens per sample.
    max_new_tokens: int = 256
    # Sampling temperature. The generator reports the log-probs of the distribution it samples
    # from (softmax(logits / temperature)) and the trainer computes the same, so pi_behav and
    # pi_prox agree at any temperature.
    temperature: float = 1.0
    # Top-p and top-k truncation must stay off (1.0 and -1): the trainer's log-probs are over the
    # whole vocabulary, and a truncated behaviour distribution would bias the PPO weights.
    top_p: float = 1.0
    top_k: int = -1
    # When a complete batch may train: "admission" (AReaL's rule, the paper's) trains as soon as a
    # batch is ready and bounds only when prompts may start, so a straggler can be trained older
    # than eta; "strict" also waits until no prompt in flight would be trained more than eta
    # versions after it started (trained staleness exactly <= eta; the trainer waits for
    # stragglers, 1.1-1.8x slower at eta <= 4 in the simulator; benchmarks/staleness_gate.py).
    staleness_gate: str = "admission"


@dataclass
class PPOConfig:
    """The decoupled PPO objective (no critic, no reference model, gamma = lambda = 1)."""

    # Clip range epsilon of the PPO ratio.
    clip_eps: float = 0.2
    # Dual-clip constant c (> 1) bounding the loss for negative advantages; null disables it.
    dual_clip: float | None = None
    # Tokens whose behaviour importance weight pi_prox / pi_behav exceeds this are masked out.
    behav_imp_weight_cap: float | None = 5.0
    # PPO minibatches (optimizer steps) per training step.
    minibatches: int = 4
    # Decoupled objective (recompute pi_prox); false gives standard PPO with pi_prox = pi_behav.
    decoupled: bool = True
    # Advantage normalisation, one advantage per trajectory (the reward at its end):
    # "global": minus the batch mean, over the batch std, both weighted by output tokens (each
    #   trajectory counts once per token) with the population std (the paper's setting);
    # "group": per prompt, minus the group mean, over the group's population std, each sample
    #   weighted equally;
    # "grpo": per prompt, minus the group mean, over the group's unbiased (n - 1) std (GRPO);
    # "none": the raw reward.
    adv_norm: str = "global"


@dataclass
class OptimizerConfig:
    """Adam with decoupled weight decay, constant learning rate after a linear warmup."""

    lr: float = 2e-5
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-5
    weight_decay: float = 0.05
    # Gradient-norm clip; 0 disables clipping.
    grad_clip: float = 1.0
    # Fraction of total steps spent warming the learning rate up linearly from 0.
    warmup_ratio: float = 0.001


@dataclass
class DataConfig:
    """Prompt data: JSON lines or Parquet rows with a prompt and an answer field."""

    # Training prompts; null uses the built-in synthetic arithmetic task (CPU profile).
    train_path: str | None = None
    # Held-out prompts for evaluation; null uses a held-out split of the synthetic task.
    eval_path: str | None = None
    prompt_key: str = "prompt"
    answer_key: str = "answer"
    # Shuffle the training prompts once per epoch with the experiment seed.
    shuffle: bool = True
    # Size of the synthetic task's training and held-out sets.
    synthetic_train_size: int = 4096
    synthetic_eval_size: int = 128


@dataclass
class CodeSandboxConfig:
    """Limits for running untrusted programs in the code reward."""

    # Wall-clock limit per test case, seconds.
    per_test_timeout_s: float = 4.0
    # Wall-clock limit for all test cases of one program, seconds.
    total_timeout_s: float = 30.0
    # Address-space limit per process, MiB.
    memory_mb: int = 1024
    # Most processes (threads included) the program may run at once.
    max_processes: int = 16
    # Most bytes of standard output kept per test; more fails the test.
    max_output_bytes: int = 1 << 20
    # Isolation: "auto" (bwrap, and refuse to start without it), "bwrap" (Bubblewrap namespaces,
    # read-only system, no network), "unshare" (namespaces without file-system isolation) or
    # "rlimits" (resource limits and process cleanup only): a weaker one only when named here.
    # See areal_hpc/reward/sandbox.py.
    backend: str = "auto"
    # Interpreter for candidate programs (standard library only); null: the running Python if the
    # sandbox can reach it, else /usr/bin/python3.
    python: str | None = None


@dataclass
class RewardConfig:
    """The reward service run beside each generator."""

    # "math" (final-answer verification), "code" (test execution in a sandbox) or "custom" (the
    # user's `function`). The kind of every prompt whose data_source is not in `by_source`.
    kind: str = "math"
    # The kind of each data source (a row's `data_source` field), so one run mixes math, code and
    # custom prompts, e.g. {openai/gsm8k: math, livecodebench: code, my/source: custom}.
    by_source: dict[str, str] = field(default_factory=dict)
    # The custom reward function: "package.module:function" (importable from PYTHONPATH) or
    # "path/to/file.py:function" (relative to the launch directory). Called as verl calls it,
    # function(data_source, solution_str, ground_truth, extra_info), in the reward workers with
    # `timeout_s`; it returns the reward as a number or a dict with a "score" (other numeric keys
    # are averaged per batch as reward/<key>). Imported and called once at launch.
    function: str | None = None
    # Math: where an answer is looked for when a response has no \boxed{...}, in order:
    # "answer_phrase" (the last "answer is X" / "Answer: X") and "last_number" (the last number in
    # the text: rewards lucky truncations and guesses, so only for models that cannot box). [] for
    # boxed answers only (the paper's experiments).
    math_fallbacks: list[str] = field(default_factory=lambda: ["answer_phrase"])
    # Reward of a correct and of a wrong answer (paper: +5 / -5). A custom function's score is the
    # reward as is, and a call that fails scores `wrong`; accuracy counts rewards >= `correct`.
    correct: float = 5.0
    wrong: float = -5.0
    # Worker processes per generator.
    workers: int = 2
    # Seconds allowed for one math verification or custom function call before it counts as wrong.
    timeout_s: float = 10.0
    # Tasks waiting for a free worker; score() waits while this many are queued (backpressure).
    max_pending: int = 256
    # Times a task is resubmitted after its worker process died under it.
    retries: int = 1
    code: CodeSandboxConfig = field(default_factory=CodeSandboxConfig)


@dataclass
class CheckpointConfig:
    """Checkpoints written by the controller (trainer shards + controller state)."""

    # Steps between checkpoints; 0 disables periodic checkpoints.
    interval_steps: int = 0
    # Directory of checkpoints; relative paths are under logging.dir.
    dir: str = "checkpoints"
    # "auto" resumes from the latest complete checkpoint if any, "never" starts fresh, or a path.
    resume: str = "auto"
    # Complete checkpoints kept; older ones are deleted after a newer one completes.
    keep_last: int = 2


@dataclass
class WandbConfig:
    """Weights & Biases tracking from rank 0: every metrics.jsonl record and the resolved config.
    The run id is kept in <logging.dir>/wandb_run_id, so a resumed or requeued run continues it."""

    # "disabled" (the default: wandb is not even imported), "offline" (files under
    # <logging.dir>/wandb or $WANDB_DIR, uploaded later with `wandb sync`) or "online" (after
    # `wandb login`, or with WANDB_API_KEY set).
    mode: str = "disabled"
    # The wandb project; required unless disabled.
    project: str | None = None
    # Display name of the run; defaults to the experiment's `name`.
    name: str | None = None


@dataclass
class LoggingConfig:
    """Where metrics and logs go."""

    # Run directory for metrics, plots and (by default) checkpoints.
    dir: str = "runs/default"
    tensorboard: bool = True
    # Weights & Biases tracking (off by default).
    wandb: WandbConfig = field(default_factory=WandbConfig)
    # Show a progress bar and a live one-line summary on rank 0.
    progress: bool = True
    # Python log level of every rank.
    level: str = "INFO"


@dataclass
class WatchdogConfig:
    """Deadlines on what can hang after start-up (controller/watchdog.py). Each `*_s` is seconds,
    or 0 for automatic: `factor` times the longest completed one so far, at least `min_s`, and
    `first_s` before any completed. A trainer past its deadline ends the job naming what it was
    doing; so does a generator (a lost generator cannot be replaced yet)."""

    # A training step, from the batch's dispatch to StepDone.
    train_step_s: float = 0.0
    # One generator loading a new version, from UpdateWeights to its WeightsLoaded.
    weight_update_s: float = 0.0
    # The trainer's part of a checkpoint.
    checkpoint_s: float = 0.0
    # A generator with prompts in flight sending no sample.
    generation_s: float = 0.0
    factor: float = 5.0
    min_s: float = 300.0
    first_s: float = 3600.0


@dataclass
class ClusterConfig:
    """Node layout of the heterogeneous SLURM job (component 0: train, component 1: rollout)."""

    gpus_per_node: int = 8
    # Nodes of component 0 (controller + trainers); trainer ranks = train_nodes * gpus_per_node.
    train_nodes: int = 1
    # Nodes of component 1 (generators); generator GPUs = rollout_nodes * gpus_per_node.
    rollout_nodes: int = 1
    train_partition: str = "train"
    rollout_partition: str = "rollout"
    # SLURM time limit (HH:MM:SS or D-HH:MM:SS).
    time_limit: str = "24:00:00"
    # srun's MPI plugin: "pmix" on most clusters, "pmi2" on the local test cluster.
    mpi: str = "pmix"
    # Times the batch script requeues the job after a crash (any failure but a refused launch),
    # counted across requeues; the time-limit stop's requeues do not count.
    max_restarts: int = 3


@dataclass
class ExperimentConfig:
    """A whole experiment: what `python -m areal_hpc.launch CONFIG` runs."""

    # Name of the run (logs, checkpoints, SLURM job name).
    name: str = "tiny-cpu"
    # "auto" picks cuda when a GPU is visible, else cpu; "cpu" or "cuda" forces one profile.
    device: str = "auto"
    # Seed of data order, sampling and initialisation.
    seed: int = 1
    # Training steps (policy versions) to run.
    total_steps: int = 20
    # Evaluate held-out accuracy every this many steps (0: only at the start and end).
    eval_interval: int = 0
    # Seconds every worker rank has to load its model and join the weight groups; a rank not ready
    # by then (a generator that never joins, a node stuck on a file system) is named and the job ends.
    startup_timeout_s: float = 1800.0
    model: ModelConfig = field(default_factory=ModelConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    generator: GeneratorConfig = field(default_factory=GeneratorConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    ppo: PPOConfig = field(default_factory=PPOConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    data: DataConfig = field(default_factory=DataConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    watchdog: WatchdogConfig = field(default_factory=WatchdogConfig)
    # Only used when `device` is cuda or for SLURM rendering; the CPU profile ignores GPU counts.
    cluster: ClusterConfig = field(default_factory=ClusterConfig)

    @property
    def trainer_world(self) -> int:
        return self.trainer.tp * self.trainer.pp * self.trainer.dp

    @property
    def world_size(self) -> int:
        """MPI ranks: one controller, the trainer ranks, one rank per generator engine."""
        return 1 + self.trainer_world + self.generator.count
