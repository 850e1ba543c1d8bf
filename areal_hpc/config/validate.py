"""Semantic checks of a typed config: ranges, choices, parallel layout, files.

Pure except for the optional file-existence checks. Each problem is one line naming the key.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

from areal_hpc.config.hf import FAMILIES, LLAMA3_FIXED, SHAPE_FIELDS
from areal_hpc.config.schema import DATA_LAYOUTS, ExperimentConfig
from areal_hpc.errors import ConfigError

# What scores a prompt: reward.kind and every value of reward.by_source.
REWARD_KINDS = ("math", "code", "custom")
# reward.function: "module:function" or "path/to/file.py:function" (the loader checks it too).
FUNCTION_FORM = re.compile(r"[^:]+:[A-Za-z_][A-Za-z0-9_]*")

CHOICES = {
    "device": ("auto", "cpu", "cuda"),
    "trainer.params_dtype": ("auto", "fp32", "bf16", "fp16"),
    "trainer.recompute": ("none", "selective", "full"),
    "trainer.recompute_method": ("uniform", "block"),
    "generator.interrupt_mode": ("abort", "keep"),
    "generator.dtype": ("auto", "fp32", "bf16", "fp16"),
    "ppo.adv_norm": ("global", "group", "grpo", "none"),
    "rollout.staleness_gate": ("strict", "admission"),
    "data.layout": tuple(DATA_LAYOUTS),
    "data.overlong": ("filter", "error"),
    "data.synthetic_task": ("arithmetic", "programs"),
    "reward.kind": REWARD_KINDS,
    "reward.code.backend": ("auto", "bwrap", "unshare", "rlimits"),
    "logging.level": ("DEBUG", "INFO", "WARNING", "ERROR"),
    "logging.wandb.mode": ("disabled", "offline", "online"),
    "cluster.mpi": ("pmix", "pmi2", "none"),
}

# Options whose value is a list, each element one of these.
LIST_CHOICES = {
    # The recompute_modules of megatron-core that a dense decoder has ("layernorm" needs
    # Transformer Engine, whose layer spec fuses the norms into the linears: nothing to recompute).
    "trainer.recompute_modules": ("mlp", "core_attn"),
    "reward.math_fallbacks": ("answer_phrase", "last_number"),
}

# (key, predicate, requirement as the user reads it)
RANGES = [
    ("seed", lambda v: v >= 0, ">= 0"),
    ("total_steps", lambda v: v >= 1, ">= 1"),
    ("eval_interval", lambda v: v >= 0, ">= 0"),
    ("eval.n", lambda v: v is None or v >= 1, ">= 1 or null"),
    ("eval.temperature", lambda v: v is None or v >= 0, ">= 0 or null"),
    ("eval.top_p", lambda v: v is None or 0 < v <= 1, "in (0, 1] or null"),
    ("eval.max_new_tokens", lambda v: v is None or v >= 1, ">= 1 or null"),
    ("startup_timeout_s", lambda v: v > 0, "> 0"),
    ("model.vocab_size", lambda v: v >= 1, ">= 1"),
    ("model.hidden_size", lambda v: v >= 1, ">= 1"),
    ("model.intermediate_size", lambda v: v >= 1, ">= 1"),
    ("model.num_layers", lambda v: v >= 1, ">= 1"),
    ("model.num_attention_heads", lambda v: v >= 1, ">= 1"),
    ("model.num_query_groups", lambda v: v >= 1, ">= 1"),
    ("model.head_dim", lambda v: v >= 1, ">= 1"),
    ("model.max_position_embeddings", lambda v: v >= 1, ">= 1"),
    ("model.rope_theta", lambda v: v > 0, "> 0"),
    ("model.rms_norm_eps", lambda v: v > 0, "> 0"),
    ("trainer.tp", lambda v: v >= 1, ">= 1"),
    ("trainer.pp", lambda v: v >= 1, ">= 1"),
    ("trainer.dp", lambda v: v >= 1, ">= 1"),
    ("trainer.micro_batch_tokens", lambda v: v >= 1, ">= 1"),
    ("trainer.min_micro_batches", lambda v: v >= 1, ">= 1"),
    ("trainer.recompute_num_layers", lambda v: v >= 1, ">= 1 or null"),
    ("trainer.logprob_chunk_tokens", lambda v: v >= 1, ">= 1"),
    # The scaler's floor is 1 (trainer/loss_scale.py MIN_LOSS_SCALE).
    ("trainer.initial_loss_scale", lambda v: v >= 1, ">= 1"),
    ("generator.count", lambda v: v >= 1, ">= 1"),
    ("generator.tensor_parallel_size", lambda v: v >= 1, ">= 1"),
    ("generator.gpu_memory_utilization", lambda v: 0 < v <= 1, "in (0, 1]"),
    ("generator.kv_cache_bytes", lambda v: v > 0, "> 0"),
    ("generator.max_num_seqs", lambda v: v >= 1, ">= 1"),
    ("generator.weight_bucket_bytes", lambda v: v >= 2**20, ">= 1 MiB"),
    ("rollout.eta", lambda v: v >= 0, ">= 0"),
    ("rollout.batch_prompts", lambda v: v >= 1, ">= 1"),
    ("rollout.group_size", lambda v: v >= 1, ">= 1"),
    ("rollout.max_concurrent", lambda v: v >= 1, ">= 1"),
    ("rollout.min_generators", lambda v: v >= 1, ">= 1"),
    ("rollout.max_replacements", lambda v: v >= 0, ">= 0"),
    ("rollout.max_prompt_len", lambda v: v >= 1, ">= 1"),
    ("rollout.max_new_tokens", lambda v: v >= 1, ">= 1"),
    ("rollout.temperature", lambda v: v >= 0, ">= 0"),
    # The trainer's log-probs (pi_prox, pi_theta) are those of softmax(logits / temperature) over
    # the whole vocabulary; with top-p or top-k the generator samples from a truncated distribution
    # the trainer does not compute, which biases every importance weight.
    ("rollout.top_p", lambda v: v == 1.0,
     "1.0 (the trainer's log-probs do not apply top-p truncation, so the PPO weights would be biased)"),
    ("rollout.top_k", lambda v: v == -1,
     "-1 (the trainer's log-probs do not apply top-k truncation, so the PPO weights would be biased)"),
    ("ppo.clip_eps", lambda v: 0 < v < 1, "in (0, 1)"),
    ("ppo.dual_clip", lambda v: v is None or v > 1, "null or > 1"),
    ("ppo.behav_imp_weight_cap", lambda v: v is None or v > 1, "null or > 1"),
    ("ppo.minibatches", lambda v: v >= 1, ">= 1"),
    ("optimizer.lr", lambda v: v > 0, "> 0"),
    ("optimizer.beta1", lambda v: 0 <= v < 1, "in [0, 1)"),
    ("optimizer.beta2", lambda v: 0 <= v < 1, "in [0, 1)"),
    ("optimizer.eps", lambda v: v > 0, "> 0"),
    ("optimizer.weight_decay", lambda v: v >= 0, ">= 0"),
    ("optimizer.grad_clip", lambda v: v >= 0, ">= 0"),
    ("optimizer.warmup_ratio", lambda v: 0 <= v <= 1, "in [0, 1]"),
    ("data.synthetic_train_size", lambda v: v >= 1, ">= 1"),
    ("data.synthetic_eval_size", lambda v: v >= 1, ">= 1"),
    ("data.synthetic_max_ops", lambda v: 1 <= v <= 8, "between 1 and 8"),
    ("data.synthetic_ops", lambda v: v != "" and len(set(v)) == len(v) and set(v) <= set("+-*"),
     'a non-empty subset of "+-*", each operator once'),
    ("data.synthetic_warm_start_accuracy", lambda v: 0 < v <= 1, "in (0, 1]"),
    ("data.synthetic_warm_start_slips", lambda v: 0 <= v < 1, "in [0, 1)"),
    ("reward.workers", lambda v: v >= 1, ">= 1"),
    ("reward.timeout_s", lambda v: v > 0, "> 0"),
    ("reward.memory_mb", lambda v: v == 0 or v >= 256, "0 (no limit) or >= 256 (a worker takes ~150 MB itself)"),
    ("reward.max_pending", lambda v: v >= 1, ">= 1"),
    ("reward.retries", lambda v: v >= 0, ">= 0"),
    ("reward.code.per_test_timeout_s", lambda v: v > 0, "> 0"),
    ("reward.code.total_timeout_s", lambda v: v > 0, "> 0"),
    ("reward.code.memory_mb", lambda v: v >= 16, ">= 16"),
    ("reward.code.max_processes", lambda v: v >= 1, ">= 1"),
    ("reward.code.reuse_verdicts", lambda v: v >= 0, ">= 0"),
    ("reward.code.max_output_bytes", lambda v: v >= 1, ">= 1"),
    ("reward.code.memory_cgroup", lambda v: v in ("auto", "off") or v.startswith("/"),
     "auto, 'off' (quoted: YAML reads a bare off as false) or the absolute path of a cgroup directory"),
    ("checkpoint.interval_steps", lambda v: v >= 0, ">= 0"),
    ("checkpoint.hf_interval", lambda v: v >= 0, ">= 0 (0: no Hugging Face exports)"),
    ("checkpoint.keep_last", lambda v: v >= 1, ">= 1"),
    ("watchdog.train_step_s", lambda v: v >= 0, ">= 0 (0: automatic)"),
    ("watchdog.weight_update_s", lambda v: v >= 0, ">= 0 (0: automatic)"),
    ("watchdog.checkpoint_s", lambda v: v >= 0, ">= 0 (0: automatic)"),
    ("watchdog.generation_s", lambda v: v >= 0, ">= 0 (0: automatic)"),
    ("watchdog.factor", lambda v: v >= 1, ">= 1"),
    ("watchdog.min_s", lambda v: v > 0, "> 0"),
    ("watchdog.first_s", lambda v: v > 0, "> 0"),
    ("cluster.gpus_per_node", lambda v: v >= 1, ">= 1"),
    ("cluster.train_nodes", lambda v: v >= 1, ">= 1"),
    ("cluster.rollout_nodes", lambda v: v >= 1, ">= 1"),
    ("cluster.spare_nodes", lambda v: v >= 0, ">= 0"),
    ("cluster.max_restarts", lambda v: v >= 0, ">= 0"),
]


def get(cfg: object, dotted: str):
    for part in dotted.split("."):
        cfg = getattr(cfg, part)
    return cfg


def _ranges_and_choices(cfg: ExperimentConfig) -> list[str]:
    problems = []
    for key, ok, need in RANGES:
        value = get(cfg, key)
        if value is not None and not ok(value):  # null only where the schema allows it
            problems.append(f"{key} = {value!r}: must be {need}")
    for key, allowed in CHOICES.items():
        value = get(cfg, key)
        if value not in allowed:
            problems.append(f"{key} = {value!r}: must be one of {', '.join(allowed)}")
    for key, allowed in LIST_CHOICES.items():
        value = get(cfg, key)
        bad = [v for v in value if v not in allowed]
        if bad or len(set(value)) != len(value):
            problems.append(f"{key} = {list(value)!r}: must list distinct items of {', '.join(allowed)}")
    return problems


# Shape fields that have no meaning when null (head_dim and rope_scaling do).
REQUIRED_SHAPE = tuple(f for f in SHAPE_FIELDS if f not in ("head_dim", "rope_scaling"))


def _rope_scaling_problem(scaling: dict) -> str | None:
    """Why megatron-core cannot apply this RoPE scaling, or None when it can."""
    if scaling.get("rope_type") != "llama3":
        return f"rope_type {scaling.get('rope_type')!r} is not supported (only llama3)"
    factor = scaling.get("factor")
    if not isinstance(factor, int | float) or factor <= 0:
        return "llama3 needs a factor > 0"
    fixed = {k: scaling.get(k) for k in LLAMA3_FIXED}
    extra = sorted(set(scaling) - {"rope_type", "factor", *LLAMA3_FIXED})
    if fixed != LLAMA3_FIXED or extra:
        return ("megatron-core 0.16.1 applies llama3 scaling only with "
                + ", ".join(f"{k} {v}" for k, v in LLAMA3_FIXED.items()) + " and no other keys")
    return None


def _model(cfg: ExperimentConfig) -> list[str]:
    """The shape is complete and the family's; head_dim and RoPE scaling are representable."""
    m = cfg.model
    where = f" (from {m.path}/config.json)" if m.path is not None else ""
    if m.family is not None and m.family not in FAMILIES:  # first: qkv_bias and qk_norm follow the family
        return [f"model.family = {m.family!r}: must be one of {', '.join(FAMILIES)}"]
    missing = [f"model.{f}: must be set (or set model.path to a checkpoint; its config.json gives it)"
               for f in REQUIRED_SHAPE if getattr(m, f) is None]
    if missing:  # model.family among them when unset
        return missing
    family, problems = FAMILIES[m.family], []
    for key, want, what in (("qkv_bias", family.qkv_bias, "bias on q, k and v"),
                            ("qk_norm", family.qk_norm, "an RMSNorm on each query and key head")):
        if getattr(m, key) != want:
            problems.append(f"model.{key} = {getattr(m, key)}: the {m.family} family has"
                            f" {what if want else 'no ' + what} ({family.architecture})")
    if m.family == "qwen2" and m.head_dim not in (None, m.hidden_size // m.num_attention_heads):
        problems.append(f"model.head_dim = {m.head_dim}: qwen2 derives it as hidden_size // num_attention_heads"
                        f" = {m.hidden_size // m.num_attention_heads}")
    if m.rope_scaling is not None:
        why = _rope_scaling_problem(m.rope_scaling)
        if why:
            problems.append(f"model.rope_scaling = {dict(m.rope_scaling)}{where}: {why}")
    return problems


def _reward(cfg: ExperimentConfig) -> list[str]:
    r = cfg.reward
    problems = [f"reward.by_source.{source} = {kind!r}: must be one of {', '.join(REWARD_KINDS)}"
                for source, kind in r.by_source.items() if kind not in REWARD_KINDS]
    if r.function is None:
        if "custom" in (r.kind, *r.by_source.values()):
            problems.append("reward.function: must be set (module:function or path/to/file.py:function)"
                            " when reward.kind or a reward.by_source value is custom")
    elif not FUNCTION_FORM.fullmatch(r.function):
        problems.append(f"reward.function = {r.function!r}: must be module:function or path/to/file.py:function")
    return problems


def _data(cfg: ExperimentConfig) -> list[str]:
    """Row keys are dotted paths: no empty part (a typo like "reward_model..ground_truth")."""
    problems = []
    for key in ("data.prompt_key", "data.answer_key"):
        value = get(cfg, key)
        if value is not None and not all(value.split(".")):
            problems.append(f"{key} = {value!r}: must be a key or a dotted path of keys (a.b.c), or null")
    d = cfg.data
    uses_synthetic = d.train_path is None or (d.eval_path is None and not cfg.eval.paths)
    if uses_synthetic and d.synthetic_task == "programs" and cfg.reward.kind != "code":
        problems.append(f"data.synthetic_task = 'programs': its answers are tests that reward.kind code runs,"
                        f" not {cfg.reward.kind} (set reward.kind: code, or data paths for every split)")
    return problems


def _wandb(cfg: ExperimentConfig) -> list[str]:
    w = cfg.logging.wandb
    if w.mode != "disabled" and not w.project:
        return [f"logging.wandb.project: must be set when logging.wandb.mode = {w.mode!r}"]
    return []


def trainer_layout_problems(cfg: ExperimentConfig) -> list[str]:
    """How the model cannot be split over trainer.tp x trainer.pp (the one copy of these rules:
    the config check and the trainer's start both ask it). Needs tp, pp >= 1."""
    m, t = cfg.model, cfg.trainer
    problems = []
    if m.num_attention_heads % t.tp or m.num_query_groups % t.tp:
        problems.append(
            f"trainer.tp = {t.tp}: must divide model.num_attention_heads = {m.num_attention_heads}"
            f" and model.num_query_groups = {m.num_query_groups}"
        )
    if m.vocab_size % t.tp:
        problems.append(f"trainer.tp = {t.tp}: must divide model.vocab_size = {m.vocab_size}")
    if m.intermediate_size % t.tp:
        problems.append(f"trainer.tp = {t.tp}: must divide model.intermediate_size = {m.intermediate_size}")
    if m.num_layers % t.pp:
        problems.append(f"trainer.pp = {t.pp}: must divide model.num_layers = {m.num_layers}")
    if t.sequence_parallel and t.tp == 1:
        problems.append("trainer.sequence_parallel = true: needs trainer.tp > 1")
    return problems + _recompute_problems(cfg)


def _recompute_problems(cfg: ExperimentConfig) -> list[str]:
    """megatron-core runs `uniform` groups back to back over a stage's layers, so a group size
    must divide them; `block` can recompute at most all of them."""
    t = cfg.trainer
    stage_layers = cfg.model.num_layers // t.pp
    n = t.recompute_num_layers
    if t.recompute == "full" and n is not None:
        if t.recompute_method == "uniform" and stage_layers % n:
            return [f"trainer.recompute_num_layers = {n}: must divide the {stage_layers} layers of a pipeline"
                    f" stage (model.num_layers / trainer.pp) with recompute_method uniform"]
        if t.recompute_method == "block" and n > stage_layers:
            return [f"trainer.recompute_num_layers = {n}: more than the {stage_layers} layers of a pipeline"
                    f" stage (model.num_layers / trainer.pp)"]
    if t.recompute == "selective" and not t.recompute_modules:
        return ["trainer.recompute_modules = []: selective recomputation needs at least one module"]
    return []


def _device_dtype(cfg: ExperimentConfig) -> list[str]:
    """The dtype refusal of params_dtype, known before launch when the device is named."""
    if cfg.device == "auto":
        return []
    try:
        params_dtype(cfg, cfg.device)
    except ConfigError as e:
        return [str(e)]
    return []


def params_dtype(cfg: ExperimentConfig, device: str) -> str:
    """trainer.params_dtype on `device` ("cpu" or "cuda"), "auto" resolved: the one place this is
    decided. Transformer Engine 2.9 has no fp32 attention for packed (THD) micro-batches: its
    flash and fused (cuDNN) kernels take fp16/bf16 only and its unfused one refuses THD
    (attention/dot_product_attention/utils.py, get_attention_backend), so fp32 on CUDA is refused
    here rather than failing in the first forward pass."""
    dtype = cfg.trainer.params_dtype
    if dtype == "auto":
        return "bf16" if device == "cuda" else "fp32"
    if dtype == "fp32" and device == "cuda":
        raise ConfigError(
            "trainer.params_dtype = 'fp32': not on CUDA; Transformer Engine 2.9 has no fp32 attention kernel"
            " for packed (THD) micro-batches (flash and cuDNN attention take fp16/bf16 only, the unfused one"
            " no packed sequences): use bf16 (auto) or fp16"
        )
    return dtype


def generator_dtype(cfg: ExperimentConfig, device: str) -> str:
    """generator.dtype on `device`, "auto" resolved to the trainer's dtype (params_dtype): the
    trainers send weight updates in it, and an engine of another dtype would convert every update."""
    dtype = cfg.generator.dtype
    return params_dtype(cfg, device) if dtype == "auto" else dtype


def _model_and_parallel(cfg: ExperimentConfig) -> list[str]:
    m, t, g, r = cfg.model, cfg.trainer, cfg.generator, cfg.rollout
    problems = []
    if m.head_dim is None and m.hidden_size % m.num_attention_heads:
        problems.append(
            f"model.hidden_size = {m.hidden_size}: not divisible by model.num_attention_heads"
            f" = {m.num_attention_heads}"
        )
    if m.num_attention_heads % m.num_query_groups:
        problems.append(
            f"model.num_query_groups = {m.num_query_groups}: does not divide"
            f" model.num_attention_heads = {m.num_attention_heads}"
        )
    problems += trainer_layout_problems(cfg)
    if m.num_attention_heads % g.tensor_parallel_size or m.num_query_groups % g.tensor_parallel_size:
        problems.append(
            f"generator.tensor_parallel_size = {g.tensor_parallel_size}: must divide model.num_attention_heads"
            f" = {m.num_attention_heads} and model.num_query_groups = {m.num_query_groups}"
        )
    longest = r.max_prompt_len + r.max_new_tokens
    if longest > m.max_position_embeddings:
        problems.append(
            f"rollout.max_new_tokens = {r.max_new_tokens}: max_prompt_len + max_new_tokens = {longest}"
            f" exceeds model.max_position_embeddings = {m.max_position_embeddings}"
        )
    if longest > t.micro_batch_tokens:
        problems.append(
            f"trainer.micro_batch_tokens = {t.micro_batch_tokens}: smaller than the longest sequence"
            f" (rollout.max_prompt_len + rollout.max_new_tokens = {longest})"
        )
    if r.min_generators > g.count:
        problems.append(f"rollout.min_generators = {r.min_generators}: more than generator.count = {g.count}")
    # Every data-parallel replica trains a part of every minibatch (trainer/batch_plan.py).
    if cfg.ppo.minibatches * t.dp > r.batch_prompts * r.group_size:
        problems.append(
            f"ppo.minibatches = {cfg.ppo.minibatches} x trainer.dp = {t.dp}: more than the trajectories per step"
            f" (rollout.batch_prompts * rollout.group_size = {r.batch_prompts * r.group_size})"
        )
    return problems


def cluster_problems(cfg: ExperimentConfig) -> list[str]:
    """GPU layout: trainer ranks fill component 0's GPUs, generator engines fill component 1's."""
    c, g = cfg.cluster, cfg.generator
    problems = []
    train_gpus = c.train_nodes * c.gpus_per_node
    if cfg.trainer_world != train_gpus:
        problems.append(
            f"trainer.tp * trainer.pp * trainer.dp = {cfg.trainer_world}: must equal the training GPUs"
            f" (cluster.train_nodes * cluster.gpus_per_node = {train_gpus})"
        )
    if c.gpus_per_node % g.tensor_parallel_size:
        problems.append(
            f"generator.tensor_parallel_size = {g.tensor_parallel_size}: must divide"
            f" cluster.gpus_per_node = {c.gpus_per_node} (an engine may not span nodes)"
        )
    rollout_gpus = c.rollout_nodes * c.gpus_per_node
    if g.count * g.tensor_parallel_size != rollout_gpus:
        problems.append(
            f"generator.count = {g.count}: count * tensor_parallel_size = "
            f"{g.count * g.tensor_parallel_size} must equal the rollout GPUs"
            f" (cluster.rollout_nodes * cluster.gpus_per_node = {rollout_gpus})"
        )
    return problems


def _spares(cfg: ExperimentConfig) -> list[str]:
    n = cfg.cluster.spare_nodes
    if n and not cfg.rollout.max_replacements:
        return [f"cluster.spare_nodes = {n}: spares need rollout.max_replacements > 0, or every spare is refused"]
    return []


def path_kind(path: str | Path) -> str:
    """"dir", "file" or "missing", or why the path cannot be looked at at all ("File name too
    long", "Permission denied"), where pathlib's is_file and is_dir would raise."""
    try:
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return "missing"
    except (OSError, ValueError) as e:  # ValueError: a NUL byte in the name
        return getattr(e, "strerror", None) or str(e)
    return "dir" if stat.S_ISDIR(mode) else "file"


def _files(cfg: ExperimentConfig) -> list[str]:
    problems = []
    kinds: dict[str, str] = {}

    def check(key: str, value: str, wanted: set[str], missing: str) -> None:
        kinds[key] = kind = path_kind(value)
        if kind not in wanted:
            problems.append(f"{key} = {value!r}: {missing if kind in ('dir', 'file', 'missing') else kind}")

    for key in ("model.path", "model.tokenizer_path"):
        if (value := get(cfg, key)) is not None:
            check(key, value, {"dir"}, "directory not found")
    if kinds.get("model.path") == "dir" and path_kind(Path(cfg.model.path) / "config.json") != "file":
        problems.append(f"model.path = {cfg.model.path!r}: has no config.json (not a Hugging Face model)")
    data_file = "file not found (a data file or a dataset directory)"
    for key in ("data.train_path", "data.eval_path"):
        if (value := get(cfg, key)) is not None:
            check(key, value, {"dir", "file"}, data_file)
    for n, value in enumerate(cfg.eval.paths):
        check(f"eval.paths[{n}]", value, {"dir", "file"}, data_file)
    stems = [Path(p).stem for p in cfg.eval.paths]
    if len(set(stems)) < len(stems):
        problems.append(f"eval.paths: two data sets share a name ({', '.join(stems)}); metrics are named by file stem")
    template = cfg.data.chat_template
    if template not in ("auto", "none"):
        check("data.chat_template", template, {"file"}, "not auto, none or an existing template file (.jinja)")
    resume = cfg.checkpoint.resume
    if resume not in ("auto", "never"):
        check("checkpoint.resume", resume, {"dir"}, "not 'auto', 'never' or an existing checkpoint directory")
    return problems


def missing_weights(cfg: ExperimentConfig) -> list[str]:
    """model.path without weights, as a launch refuses it. Not one of the file checks: a directory
    with only config.json (configs/models/) gives the shape to `config check` and `slurm plan`;
    only a run needs the weights (the trainer reads *.safetensors files alone)."""
    path = cfg.model.path
    if path is None or any(Path(path).glob("*.safetensors")):
        return []
    return [f"model.path = {path!r}: no weights there (no *.safetensors files), only the model's shape;"
            f" set model.path to the checkpoint directory (--set model.path=/path/to/{Path(path).name})"]


def validate(cfg: ExperimentConfig, check_files: bool = True) -> list[str]:
    """All problems of a config, one line each; empty when it can run."""
    problems = _ranges_and_choices(cfg)
    if not any(p.startswith("model.") for p in problems):  # _model divides by the shape's values
        problems += _model(cfg)
    if not problems:  # the structural checks divide by these values
        problems += _model_and_parallel(cfg)
        if cfg.device != "cpu":
            problems += cluster_problems(cfg)
        problems += _device_dtype(cfg)
    problems += _spares(cfg)
    problems += _reward(cfg)
    problems += _data(cfg)
    problems += _wandb(cfg)
    if check_files:
        problems += _files(cfg)
    return problems


def check_world(cfg: ExperimentConfig, world_size: int) -> list[str]:
    """The MPI world must hold exactly the controller, the trainers and the generators."""
    if world_size == cfg.world_size:
        return []
    return [
        f"MPI world size {world_size} does not match the config: 1 controller + "
        f"{cfg.trainer_world} trainer ranks (tp*pp*dp) + {cfg.generator.count} generators"
        f" (generator.count) = {cfg.world_size}"
    ]
