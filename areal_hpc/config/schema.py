"""The typed schema of one experiment: the single source of truth for every setting.

Each dataclass is one section of the YAML file. Every option is documented by the comment above
it. Defaults describe the tiny CPU profile unless noted; the paper's settings live in
configs/experiments/.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class ModelConfig:
    """A dense decoder of a supported family (RMSNorm, SwiGLU, RoPE, grouped-query attention).

    With `path` set, every shape field (family to rope_scaling) left null here is read from the
    checkpoint's config.json, and one set here must agree with it (config/load.py); the YAML
    names only what the run changes. Without `path`, the shape fields must be set (qkv_bias and
    qk_norm follow the family). config/hf.py maps these fields to config.json keys.
    """

    # Short name used in logs, checkpoints and the simulator (e.g. "qwen2-32b").
    name: str = "tiny-qwen2"
    # Directory of a Hugging Face checkpoint (config.json + safetensors). When set, its weights
    # initialise the trainer and the generators and its config.json gives the shape.
    path: str | None = None
    # Tokenizer directory; defaults to `path`.
    tokenizer_path: str | None = None
    # Architecture family: "qwen2" (Qwen2ForCausalLM: bias on q/k/v), "qwen3" (Qwen3ForCausalLM:
    # RMSNorm on each query and key head, no bias) or "llama" (LlamaForCausalLM: no bias).
    family: str | None = None
    # The shape, as config.json names it (num_layers: num_hidden_layers); null: config.json's.
    vocab_size: int | None = None
    hidden_size: int | None = None
    intermediate_size: int | None = None
    num_layers: int | None = None
    num_attention_heads: int | None = None
    # Key/value heads (grouped-query attention); must divide num_attention_heads.
    num_query_groups: int | None = None
    # Channels of one attention head; null: hidden_size // num_attention_heads (Qwen3 and Llama
    # checkpoints name it, and Qwen3's may differ from that).
    head_dim: int | None = None
    # Longest position, RoPE base frequency and RMSNorm epsilon; null: config.json's.
    max_position_embeddings: int | None = None
    rope_theta: float | None = None
    rms_norm_eps: float | None = None
    # Whether the output projection shares the input embedding's weights.
    tie_word_embeddings: bool | None = None
    # Bias on the q, k and v projections; null: the family's (qwen2 true, qwen3 and llama false).
    qkv_bias: bool | None = None
    # RMSNorm on each query and key head before RoPE; null: the family's (qwen3 true).
    qk_norm: bool | None = None
    # RoPE frequency scaling as config.json writes it; null: none. Only Llama 3's is supported:
    # {rope_type: llama3, factor: F, low_freq_factor: 1.0, high_freq_factor: 4.0,
    #  original_max_position_embeddings: 8192} (megatron-core fixes all but the factor).
    rope_scaling: dict | None = None

    @property
    def head_size(self) -> int:
        """head_dim, or hidden_size // num_attention_heads when it is null."""
        return self.head_dim or self.hidden_size // self.num_attention_heads


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
    # Parameter dtype for training (gradients and optimizer states stay fp32): "auto" (fp32 on
    # CPU, bf16 on CUDA), "fp32" (CPU only: Transformer Engine 2.9 has no fp32 attention kernel
    # for packed sequences), "bf16" or "fp16".
    params_dtype: str = "auto"
    # fp16 only: the loss scale Megatron's dynamic scaler starts from (its own default is 2^32).
    # A step whose scaled gradients overflow is skipped, and after two in a row the scale halves;
    # the trainer retries the skipped minibatch under the lower scale (no data is dropped, the
    # policy version counts applied steps only, `train/skipped_steps` counts the skips). 2^16
    # (torch.amp's start) spares most of the 2^32 start's ~18 skips of the first step.
    initial_loss_scale: float = 65536.0
    # Use Megatron's distributed optimizer (optimizer state sharded over dp).
    distributed_optimizer: bool = True
    # Activation recomputation (megatron-core recompute_granularity): "none" keeps every layer's
    # activations for the backward pass; "selective" recomputes only `recompute_modules`;
    # "full" keeps only the input of recomputed layers and recomputes them in the backward pass
    # (about one more forward pass; what fits 32k-token micro-batches of the large models).
    recompute: str = "none"
    # With "full": "uniform" (the stage's layers in groups of recompute_num_layers, each group's
    # input kept) or "block" (only the first recompute_num_layers layers of each pipeline stage
    # are recomputed; the rest keep everything).
    recompute_method: str = "uniform"
    # With "full": layers per group (uniform) or recomputed layers per stage (block); null: 1 for
    # uniform, every layer of the stage for block.
    recompute_num_layers: int | None = None
    # With "selective": the parts of each layer recomputed, of "mlp" (the SwiGLU MLP: most of a
    # layer's activations) and "core_attn" (attention scores; Transformer Engine's fused attention
    # keeps none, so only the CPU profile saves memory with it).
    recompute_modules: list[str] = field(default_factory=lambda: ["mlp"])
    # Tokens per chunk when log-probs are taken from the logits: each chunk is upcast to fp32 and
    # log-softmaxed alone (and again in the backward pass), so fp32 full-vocabulary logits never
    # exist for the whole micro-batch.
    logprob_chunk_tokens: int = 2048


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
    # Dtype of the inference weights and KV cache: "auto" (the trainer's, trainer.params_dtype
    # resolved: the dtype every weight update arrives in), "fp32", "bf16" or "fp16".
    dtype: str = "auto"
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
    # Longest prompt in tokens; longer prompts are left out or refused at launch (data.overlong).
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
    # Generators the run goes on with after losing some (a dead process or node): the controller
    # hands a lost generator's prompts to the others and rebuilds the weight groups without it;
    # below this many it checkpoints and exits for a requeue, which starts them all again.
    min_generators: int = 1
    # Replacement generators that may join the running job in all, each in a lost one's place
    # (`python -m areal_hpc.launch --join RUN_DIR`; the SLURM scripts start cluster.spare_nodes'
    # spares as a step of their own): one joins the next weight update and serves once it holds the current
    # version. 0: none; a lost generator is then only survived.
    max_replacements: int = 4


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

    # Learning rate after the warmup.
    lr: float = 2e-5
    # Adam's decay rates of the first and second moments, and its epsilon.
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-5
    # Decoupled weight decay (AdamW).
    weight_decay: float = 0.05
    # Gradient-norm clip; 0 disables clipping.
    grad_clip: float = 1.0
    # Fraction of total steps spent warming the learning rate up linearly from 0.
    warmup_ratio: float = 0.001


# The (prompt, answer) keys of each data.layout; docs/data.md has an example row of each.
# flat: {"prompt": str, "answer": str}; verl: its parquet (prompt = chat messages, the answer in
# reward_model.ground_truth); areal-math: {"prompt", "solutions": [str, ...]}; areal-code:
# {"prompt", "input_output": JSON text of {"inputs": [...], "outputs": [...]}}.
DATA_LAYOUTS = {
    "flat": ("prompt", "answer"),
    "verl": ("prompt", "reward_model.ground_truth"),
    "areal-math": ("prompt", "solutions"),
    "areal-code": ("prompt", "input_output"),
}


@dataclass
class EvalConfig:
    """Held-out evaluation during training (at the start, every `eval_interval` versions and at the
    end), scored as `areal-hpc eval` scores a checkpoint (avg@n, pass@k)."""

    # Held-out data sets, each reported on its own as eval_set/<file stem>/...; [] uses
    # data.eval_path, or the synthetic task's held-out split.
    paths: list[str] = field(default_factory=list)
    # Samples per prompt; null: rollout.group_size.
    n: int | None = None
    # Sampling of the evaluation; null: the rollout's. Unlike training, top_p may truncate here
    # (the paper evaluates at temperature 0.6, top-p 0.95): no log-prob of it is trained on.
    temperature: float | None = None
    top_p: float | None = None
    max_new_tokens: int | None = None


@dataclass
class DataConfig:
    """Prompt data: JSON lines, JSON, Parquet or a Hugging Face dataset directory, one prompt and
    one answer per row, in one of the DATA_LAYOUTS."""

    # Training prompts: a .jsonl, .json or .parquet file, a directory of *.parquet or *.jsonl
    # shards, or a directory written by datasets' save_to_disk (a DatasetDict's "train" split);
    # null uses the built-in synthetic task, data.synthetic_task (CPU profile).
    train_path: str | None = None
    # Held-out prompts for evaluation, in the same forms; null uses a held-out split of the
    # synthetic task.
    eval_path: str | None = None
    # Where a row keeps its prompt and answer: "flat", "verl", "areal-math" or "areal-code"
    # (DATA_LAYOUTS above).
    layout: str = "flat"
    # The row's prompt key; null: the layout's. A dotted path reaches into objects
    # (e.g. "extra_info.question"). The prompt is a string, used as is, or a list of chat
    # messages {"role", "content"}, rendered by `chat_template`.
    prompt_key: str | None = None
    # The row's answer key; null: the layout's; dotted paths as for prompt_key (e.g.
    # "reward_model.ground_truth"). A list of strings or numbers (AReaL's `solutions`) gives its
    # first element; an object or any other list (code tests) is JSON-encoded; a number, its text.
    answer_key: str | None = None
    # How chat-message prompts become text: "auto" (the tokenizer's chat template), "none"
    # (refuse chat-message rows) or the path of a .jinja file that replaces the tokenizer's
    # template. Rendered with add_generation_prompt=True; string prompts are never templated.
    chat_template: str = "auto"
    # Extra variables for the chat template, e.g. {enable_thinking: false} for Qwen3.
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    # Prompts longer than rollout.max_prompt_len tokens: "filter" (left out, counted and named at
    # launch) or "error" (the launch is refused, naming them).
    overlong: str = "filter"
    # Shuffle the training prompts once per epoch with the experiment seed.
    shuffle: bool = True
    # The built-in task of unset paths: "arithmetic" (integer expressions, \boxed{} answers,
    # reward.kind math) or "programs" (write the program of a function shown by input/output
    # examples, run in the sandbox against hidden tests: reward.kind code). synthetic_max_ops
    # and synthetic_ops shape the arithmetic task only.
    synthetic_task: str = "arithmetic"
    # Size of the synthetic task's training and held-out sets.
    synthetic_train_size: int = 4096
    synthetic_eval_size: int = 128
    # The synthetic task's difficulty: problems of 1 to this many operations (fewer more likely),
    # drawn from these operators (a non-empty subset of "+-*"; without "*" the intermediate
    # values stay small, which a tiny model learns in minutes).
    synthetic_max_ops: int = 8
    synthetic_ops: str = "+-*"
    # The tiny model's SFT warm start stops once greedy decoding solves this share of a
    # validation set of the synthetic task: enough reward signal for RL, room left to improve.
    synthetic_warm_start_accuracy: float = 0.2
    # Share of the warm start's worked solutions that slip once, as an imperfect teacher's would
    # (arithmetic: one step's value off by 1 to 3, carried on to a wrong answer; programs: the
    # slope or the offset off by one): the student then knows the right solution but samples a
    # slip now and then, so pass@16 stands far above pass@1, the gap RL closes. 0: none slips.
    synthetic_warm_start_slips: float = 0.0

    def row_keys(self) -> tuple[str, str]:
        """The (prompt, answer) keys in effect: the ones set, else the layout's."""
        prompt, answer = DATA_LAYOUTS[self.layout]
        return self.prompt_key or prompt, self.answer_key or answer


@dataclass
class CodeSandboxConfig:
    """Limits for running untrusted programs in the code reward."""

    # Wall-clock limit per test case, seconds.
    per_test_timeout_s: float = 4.0
    # Wall-clock limit for all test cases of one program, seconds.
    total_timeout_s: float = 30.0
    # Memory limit, MiB: per process (address space) and, through a memory cgroup, for the run
    # as a whole (every process and memfd of it; bwrap's working directory is also this size).
    memory_mb: int = 1024
    # Where each run's memory cgroup is made: "auto" (under the reward worker's own cgroup, where
    # the kernel allows it), the absolute path of a cgroup prepared for it, or "off" (per-process
    # limits only). See areal_hpc/reward/memory_cgroup.py.
    memory_cgroup: str = "auto"
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
    # Verdicts each reward worker keeps of programs it ran to a clean end against the same tests
    # (reward/code_check.py): the samples of one prompt often write the same program, which then
    # runs once. A program that reads the clock or a random source gets its first verdict again;
    # 0 runs every sample.
    reuse_verdicts: int = 4096


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
    # `timeout_s`; it returns the reward as a number, a bool or a dict with a "score" (other numeric
    # keys are averaged per batch as reward/<key>), on its own scale. A response counts as correct
    # (accuracy) when the dict's "acc" is true, else when the score reaches 1; a call that fails
    # scores 0. Imported and called once at launch.
    function: str | None = None
    # Math: where an answer is looked for when a response has no \boxed{...}, in order:
    # "answer_phrase" (the last "answer is X" / "Answer: X") and "last_number" (the last number in
    # the text: rewards lucky truncations and guesses, so only for models that cannot box). [] for
    # boxed answers only (the paper's experiments).
    math_fallbacks: list[str] = field(default_factory=lambda: ["answer_phrase"])
    # Reward of a correct and of a wrong answer of the built-in math and code checks (paper: +5 /
    # -5); a custom function's rewards are its scores.
    correct: float = 5.0
    wrong: float = -5.0
    # Worker processes per generator.
    workers: int = 2
    # Seconds allowed for one math verification or custom function call before it counts as wrong.
    timeout_s: float = 10.0
    # Megabytes a reward worker process (and the launch's probe of a custom function) may allocate
    # (RLIMIT_DATA: heap and anonymous memory, not mapped libraries): a custom function or a math
    # check that allocates past it gets a MemoryError, scored wrong and named, instead of taking
    # the generator's node. A worker takes ~150 MB itself; programs are limited by code.memory_mb.
    # 0: no limit.
    memory_mb: int = 8192
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
    # Steps between Hugging Face exports (0: none): at every multiple of it, and at the last
    # version, the checkpoint also holds hf/, the weights as a directory that transformers and
    # vLLM load (config.json, generation_config.json with the special token ids and no sampling
    # defaults, tokenizer files, ~2 GiB safetensors shards). A step that is not a checkpoint step
    # gets a checkpoint for it, so a multiple of interval_steps adds none. Pruned with its
    # checkpoint (keep_last); `areal-hpc export-hf` exports any checkpoint afterwards.
    hf_interval: int = 0
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
    # Write TensorBoard event files to <dir>/tensorboard.
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
    doing; a generator past its deadline is dropped and the run goes on without it, as after its
    death, while `rollout.min_generators` are left (else the job ends naming it)."""

    # A training step, from the batch's dispatch to StepDone.
    train_step_s: float = 0.0
    # One generator loading a new version, from UpdateWeights to its WeightsLoaded.
    weight_update_s: float = 0.0
    # The trainer's part of a checkpoint.
    checkpoint_s: float = 0.0
    # A generator with prompts in flight sending no sample.
    generation_s: float = 0.0
    # The automatic deadline: factor x the longest completed one, at least min_s; first_s before
    # any completed.
    factor: float = 5.0
    min_s: float = 300.0
    first_s: float = 3600.0


@dataclass
class ClusterConfig:
    """Node layout of the heterogeneous SLURM job (component 0: train, component 1: rollout)."""

    # GPUs of every node; each task sees all of its node's (`areal-hpc slurm plan --ranks` shows
    # the devices every rank uses: a trainer's cuda:<GPU>, a generator's CUDA_VISIBLE_DEVICES).
    gpus_per_node: int = 8
    # Nodes of component 0 (controller + trainers); trainer ranks = train_nodes * gpus_per_node.
    train_nodes: int = 1
    # Nodes of component 1 (generators); generator GPUs = rollout_nodes * gpus_per_node.
    rollout_nodes: int = 1
    # Nodes of a third component for warm spare generators (partition rollout_partition): one
    # spare per engine's GPUs (gpus_per_node / generator.tensor_parallel_size; one a node on the
    # CPU profile), each with its engine loaded, taking a lost generator's place within one weight
    # update (rollout.max_replacements). 0: no spares; a lost generator is only survived.
    spare_nodes: int = 0
    # SLURM partition of component 0.
    train_partition: str = "train"
    # SLURM partition of component 1.
    rollout_partition: str = "rollout"
    # Network interface between the nodes (e.g. ib0, hsn0, eth0): its IPv4 address is where every
    # rank's listeners (lifelines, the trainer group, the weight groups) meet, and every worker
    # rank sets GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME to it. null: automatic, the interface of
    # the route to rank 0's node (never loopback unless the node has no other address), for gloo
    # only; NCCL keeps its own choice (wire/network.py).
    network_interface: str | None = None
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
    eval: EvalConfig = field(default_factory=EvalConfig)
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
