"""Trainer ranks for the multi-process tests, launched with torch.distributed.run (gloo, CPU).

    python -m torch.distributed.run --nproc-per-node N tests/trainer/trainer_worker.py SCENARIO OUT MODEL TIED

Each scenario builds real TrainEngines on the tiny Qwen2 in MODEL (TIED: the same with tied
embeddings) and saves what the tests compare to OUT/<scenario>-rank<r>.pt; the assertions live in
the test modules. Scenarios:
- single (1 rank): logits, packed and padded log-probs, TP1 reference loss and gradients, one SFT
  step's weights (also of the tied model), export -> import -> export, bad checkpoints;
- layouts (2 ranks): the same loss / gradients / log-probs / SFT step at tp=2, pp=2, dp=2, tp=2
  with sequence parallelism and pp=2 with tied embeddings, and the hf export from the shards;
- resume_a (2 ranks, dp=2): three PPO steps, a checkpoint, two more steps;
- resume_b (2 ranks, fresh processes): load that checkpoint and take the same two steps; then
  load it into a model of another shape, and load a directory that is no checkpoint;
- cuda (1 rank, GPU): the Transformer Engine spec, packed log-probs, fp32 and bf16 PPO steps;
- groups (8 ranks, tp=2, pp=2, dp=2): Megatron's data-parallel rank and model-parallel group;
- families (2 ranks; MODEL holds one tiny checkpoint per family, qwen2/qwen3/llama): for each, the
  loss, gradients, log-probs and SFT step at tp=1 (dp=2), tp=2 and pp=2 with the shape read from
  its config.json, logits at tp=1, and the hf export from the tp=2 and pp=2 shards.
"""

from __future__ import annotations

import os
import random
import shutil
import sys
import traceback
from pathlib import Path

import torch
import torch.distributed as dist
import yaml

from areal_hpc.config import load_config
from areal_hpc.trainer import hf_export
from areal_hpc.trainer.batch_plan import shards
from areal_hpc.trainer.engine import TrainEngine
from areal_hpc.trainer.parallel import init_trainer_world
from areal_hpc.wire.messages import Trajectory

TIED = "model.tie_word_embeddings=true"
LAYOUTS = {
    "tp2": (2, 1, 1, ()), "pp2": (1, 2, 1, ()), "dp2": (1, 1, 2, ()),
    "tp2sp": (2, 1, 1, ("trainer.sequence_parallel=true",)),
    "pp2tied": (1, 2, 1, (TIED,)),
}


def config(tp: int = 1, pp: int = 1, dp: int = 1, *extra: str):
    return load_config("configs/experiments/tiny-cpu.yaml", [
        f"trainer.tp={tp}", f"trainer.pp={pp}", f"trainer.dp={dp}", "trainer.micro_batch_tokens=256",
        "rollout.max_prompt_len=64", "rollout.max_new_tokens=64", "ppo.minibatches=2", "optimizer.lr=1e-3",
        "optimizer.warmup_ratio=0", *extra,
    ])


# One tiny checkpoint per supported family, hidden 64 and 2 layers (vLLM's CPU attention needs head
# size >= 32): Qwen2 with tied embeddings, Qwen3 with head_dim 32 != hidden / heads = 16 and
# grouped-query attention, Llama with Llama 3's RoPE scaling.
LLAMA3_ROPE = ("{rope_type: llama3, factor: 8.0, low_freq_factor: 1.0, high_freq_factor: 4.0,"
               " original_max_position_embeddings: 8192}")
FAMILY_SHAPES = {
    "qwen2": ["model.family=qwen2", "model.num_attention_heads=2", "model.num_query_groups=2",
              "model.tie_word_embeddings=true"],
    "qwen3": ["model.family=qwen3", "model.num_attention_heads=4", "model.num_query_groups=2", "model.head_dim=32"],
    "llama": ["model.family=llama", "model.num_attention_heads=2", "model.num_query_groups=2",
              "model.rope_theta=500000.0", "model.max_position_embeddings=16384", f"model.rope_scaling={LLAMA3_ROPE}"],
}
# 400 tokens: long enough for Llama 3's scaling of the slow RoPE frequencies to move the logits
# ~70x more than the parity tolerance (test_model_families.py).
FAMILY_LOGITS_IDS = torch.tensor([[(7 + 3 * i) % 512 for i in range(400)]])
# Layouts of the families scenario: (tp, pp, dp).
FAMILY_LAYOUTS = {"tp1": (1, 1, 2), "tp2": (2, 1, 1), "pp2": (1, 2, 1)}


def family_config(out: Path, model_dir: Path, tp: int, pp: int, dp: int):
    """tiny-cpu.yaml without its model shape: everything about the model comes from model_dir."""
    file = out / f"family-{os.getpid()}.yaml"  # one per process: ranks write theirs at once
    data = yaml.safe_load(Path("configs/experiments/tiny-cpu.yaml").read_text())
    data.pop("base")
    file.write_text(yaml.safe_dump(data))
    return load_config(file, [
        f"model.path={model_dir}", f"trainer.tp={tp}", f"trainer.pp={pp}", f"trainer.dp={dp}",
        "trainer.micro_batch_tokens=256", "rollout.max_prompt_len=64", "rollout.max_new_tokens=64",
        "ppo.minibatches=2", "optimizer.lr=1e-3", "optimizer.warmup_ratio=0",
    ])


def sft_batch(seed: int = 0, n: int = 12) -> list[tuple[list[int], list[int]]]:
    rng = random.Random(seed)
    return [([rng.randrange(512) for _ in range(rng.randint(2, 20))],
             [rng.randrange(512) for _ in range(rng.randint(1, 60))]) for _ in range(n)]


def trajectories(seed: int = 1, prompts: int = 4, group: int = 4) -> list[Trajectory]:
    """A PPO batch with rewards +-5 and behaviour log-probs to be filled in by the caller."""
    rng = random.Random(seed)
    out = []
    for p in range(prompts):
        prompt = [rng.randrange(512) for _ in range(rng.randint(3, 16))]
        for s in range(group):
            n = rng.randint(1, 50)
            out.append(Trajectory(p, s, prompt, [rng.randrange(512) for _ in range(n)], [0.0] * n, [0] * n,
                                  "stop", reward=rng.choice([5.0, -5.0])))
    return out


def with_behaviour(engine: TrainEngine, trajs: list[Trajectory], seed: int) -> list[Trajectory]:
    """Behaviour log-probs near the current policy's, as from a slightly stale generator."""
    rng = random.Random(seed)
    for t, lps in zip(trajs, engine.compute_logprobs(trajs), strict=True):
        t.logprobs = [lp + rng.uniform(-0.3, 0.3) for lp in lps]
        t.versions = [engine.version] * len(lps)
    return trajs


def step(engine: TrainEngine, batch: list[Trajectory]) -> dict[str, float]:
    """A training step on `batch`, as under the controller: cut by the batch plan, each data-parallel
    replica trains its shard."""
    return engine.train_step(shards(engine.cfg, engine.version, batch)[engine.ranks.dp_rank])


def hf_tensors(engine: TrainEngine, grads: bool = False) -> dict[str, torch.Tensor]:
    """This stage's full tensors (or gradients) by HF name on the stage leader; {} elsewhere."""
    pick = (lambda p: p.main_grad.detach()) if grads else torch.Tensor.detach
    buckets = hf_export.stream(engine.model, engine.rules, engine.cfg.model, engine.ranks, 2**20, pick)
    return {n: t.clone() for bucket in buckets for n, t in bucket}


def measure(engine: TrainEngine, model_dir: str) -> dict:
    """Loss, gradients, log-probs and the weights after one SFT step, from the tiny model."""
    engine.load_hf(model_dir)
    seqs = engine._sft_sequences(sft_batch())
    loss = engine._sft_backward(seqs)
    grads = hf_tensors(engine, grads=True) if engine.ranks.dp_size == 1 else {}
    logprobs = engine.compute_logprobs(trajectories())
    engine.sft_step(sft_batch())
    return {"loss": loss, "grads": grads, "logprobs": logprobs, "after_step": hf_tensors(engine),
            "plan_matches_stream": plan_matches_stream(engine)}


def plan_matches_stream(engine: TrainEngine, bucket_bytes: int = 2**16) -> bool:
    """The weight sender's plan (meta tensors) names what the stream yields on the stage leader."""
    def specs(buckets) -> list[list[tuple[str, torch.dtype, tuple[int, ...]]]]:
        return [[(n, t.dtype, tuple(t.shape)) for n, t in b] for b in buckets]

    streamed = specs(engine.iter_hf_weights(bucket_bytes))  # a collective: every rank iterates it
    return not engine.is_stage_leader or specs(engine.hf_weight_plan(bucket_bytes)) == streamed


def padded_logprobs(engine: TrainEngine, trajs: list[Trajectory]) -> list[list[float]]:
    """Reference: right-padded [b, s] batch through the unpacked path, log-softmax in full."""
    rows = [t.prompt_ids.tolist() + t.output_ids.tolist() for t in trajs]
    width = max(map(len, rows))
    ids = torch.tensor([r + [0] * (width - len(r)) for r in rows])
    with torch.no_grad():
        logp = engine.model(ids, None, None).float().log_softmax(-1)
    out = []
    for b, t in enumerate(trajs):
        p = len(t.prompt_ids)
        out.append([logp[b, p - 1 + i, tok].item() for i, tok in enumerate(t.output_ids)])
    return out


def broken_copies(model_dir: Path, out: Path) -> dict[str, Path]:
    """The tiny checkpoint with one tensor removed, one tensor mis-shaped, and an extra tensor."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(model_dir / "model.safetensors"))
    edits = {
        "missing": lambda t: t.pop("model.layers.1.mlp.up_proj.weight"),
        "misshaped": lambda t: t.update({"model.layers.2.self_attn.k_proj.weight": torch.zeros(32, 128)}),
        "unexpected": lambda t: t.update({"model.layers.9.mlp.gate_proj.weight": torch.zeros(1)}),
    }
    dirs = {}
    for name, edit in edits.items():
        d = out / f"broken-{name}"
        shutil.copytree(model_dir, d, dirs_exist_ok=True)
        copy = dict(tensors)
        edit(copy)
        save_file(copy, str(d / "model.safetensors"), metadata={"format": "pt"})
        dirs[name] = d
    return dirs


def single(out: Path, model_dir: str, tied_dir: str) -> dict:
    cfg = config()
    init_trainer_world(cfg, 0, 1, "env://")
    result = {"tied": measure(TrainEngine(config(1, 1, 1, TIED)), tied_dir)}
    engine = TrainEngine(cfg)
    result.update(measure(engine, model_dir))
    engine.load_hf(model_dir)
    ids = torch.tensor([list(range(7, 107, 3))])
    with torch.no_grad():
        result["logits"] = engine.model(ids, None, None)[0].clone()
    result["logits_ids"] = ids
    trajs = trajectories()
    result["packed"] = engine.compute_logprobs(trajs)
    result["padded"] = padded_logprobs(engine, trajs)
    step(engine, with_behaviour(engine, trajs, 0))
    result["trained"] = hf_tensors(engine)
    engine.export_hf(out / "export-a")
    engine.load_hf(out / "export-a")
    engine.export_hf(out / "export-b")
    with torch.no_grad():
        result["trained_logits"] = engine.model(ids, None, None)[0].clone()
    errors = {}
    for name, d in broken_copies(Path(model_dir), out).items():
        try:
            engine.load_hf(d)
            errors[name] = "no error"
        except Exception as e:  # the test checks the type and the message
            errors[name] = f"{type(e).__name__}: {e}"
    long = trajectories()[:2]
    long[0].output_ids = long[0].output_ids.tolist() * 20
    long[0].logprobs = long[0].versions = [0] * len(long[0].output_ids)
    ragged = trajectories()[:2]
    ragged[1].logprobs = ragged[1].logprobs[:-1]
    for name, batch in (("too_long", long), ("ragged", ragged)):
        try:
            step(engine, batch)
            errors[name] = "no error"
        except Exception as e:
            errors[name] = f"{type(e).__name__}: {e}"
    result["errors"] = errors
    return result


def layouts(out: Path, model_dir: str, tied_dir: str) -> dict:
    result = {}
    for name, (tp, pp, dp, extra) in LAYOUTS.items():
        cfg = config(tp, pp, dp, *extra)
        source = tied_dir if TIED in extra else model_dir
        init_trainer_world(cfg, int(os.environ["RANK"]), 2, "env://")
        engine = TrainEngine(cfg)
        result[name] = measure(engine, source)
        if dp == 1:
            engine.load_hf(source)
            engine.export_hf(out / f"export-{name}")
        del engine
    return result


def resume_a(out: Path, model_dir: str, tied_dir: str) -> dict:
    cfg = config(1, 1, 2)
    init_trainer_world(cfg, int(os.environ["RANK"]), 2, "env://")
    engine = TrainEngine(cfg)
    engine.load_hf(model_dir)
    before = [step(engine, with_behaviour(engine, trajectories(seed=s), s))["loss"] for s in range(3)]
    engine.save_checkpoint(out / "ckpt")
    after = [step(engine, with_behaviour(engine, trajectories(seed=s), s)) for s in range(3, 5)]
    return {"before": before, "after": after, "weights": hf_tensors(engine)}


def resume_b(out: Path, model_dir: str, tied_dir: str) -> dict:
    cfg = config(1, 1, 2)
    init_trainer_world(cfg, int(os.environ["RANK"]), 2, "env://")
    engine = TrainEngine(cfg)  # fresh random weights: everything must come from the checkpoint
    engine.load_checkpoint(out / "ckpt")
    version = engine.version
    after = [step(engine, with_behaviour(engine, trajectories(seed=s), s)) for s in range(3, 5)]
    result = {"version": version, "after": after, "weights": hf_tensors(engine), "errors": {}}
    del engine
    wrong_shape = TrainEngine(config(1, 1, 2, "model.intermediate_size=256"))
    for name, path in (("wrong_shape", out / "ckpt"), ("not_a_checkpoint", out)):
        try:
            wrong_shape.load_checkpoint(path)
            result["errors"][name] = "no error"
        except Exception as e:
            result["errors"][name] = f"{type(e).__name__}: {e}"
    return result


def cuda(out: Path, model_dir: str, tied_dir: str) -> dict:
    """The GPU profile on one GPU: Transformer Engine layers, THD attention, bf16 (auto) then fp16;
    fp32 is refused (no TE attention kernel takes fp32 packed sequences)."""
    torch.backends.cuda.matmul.allow_tf32 = False
    gpu = ("device=cuda", "cluster.gpus_per_node=1", "cluster.train_nodes=1", "cluster.rollout_nodes=1")
    try:
        config(1, 1, 1, *gpu)  # tiny-cpu.yaml names fp32
        fp32_refused = "no error"
    except Exception as e:
        fp32_refused = str(e)
    cfg = config(1, 1, 1, *gpu, "trainer.params_dtype=auto")
    init_trainer_world(cfg, 0, 1, "env://")
    engine = TrainEngine(cfg)
    engine.load_hf(model_dir)
    ids = torch.tensor([list(range(7, 107, 3))])
    trajs = trajectories()
    result = {"packed": engine.compute_logprobs(trajs), "exported": hf_tensors(engine), "te_rules": [
        r.megatron for r in engine.rules if "layer_norm_weight" in r.megatron], "fp32_refused": fp32_refused,
        "dtype": str(next(engine.model.parameters()).dtype)}
    result["step"] = step(engine, with_behaviour(engine, trajs, 0))
    del engine
    fp16 = TrainEngine(config(1, 1, 1, *gpu, "trainer.params_dtype=fp16"))
    fp16.load_hf(model_dir)
    result["fp16_step"] = step(fp16, with_behaviour(fp16, trajectories(), 0))
    result["ids"] = ids
    return result


def families(out: Path, model_dir: str, tied_dir: str) -> dict:
    result: dict = {}
    rank = int(os.environ["RANK"])
    ids = FAMILY_LOGITS_IDS
    for source in sorted(Path(model_dir).iterdir()):
        for layout, (tp, pp, dp) in FAMILY_LAYOUTS.items():
            cfg = family_config(out, source, tp, pp, dp)
            init_trainer_world(cfg, rank, 2, "env://")
            engine = TrainEngine(cfg)
            run = measure(engine, str(source))
            engine.load_hf(source)
            if tp == pp == 1:
                with torch.no_grad():
                    run["logits"] = engine.model(ids, None, None)[0].clone()
            else:
                engine.export_hf(out / f"export-{source.name}-{layout}")
            result[source.name, layout] = run
            del engine
    result["ids"] = ids
    return result


def groups(out: Path, model_dir: str, tied_dir: str) -> dict:
    from megatron.core import parallel_state

    init_trainer_world(config(2, 2, 2), int(os.environ["RANK"]), 8, "env://")
    return {"dp_rank": parallel_state.get_data_parallel_rank(),
            "model_parallel": dist.get_process_group_ranks(parallel_state.get_model_parallel_group())}


def main() -> None:
    scenario, out, model_dir, tied_dir = sys.argv[1], Path(sys.argv[2]), sys.argv[3], sys.argv[4]
    rank = int(os.environ.get("RANK", "0"))
    try:
        result = {"single": single, "layouts": layouts, "resume_a": resume_a, "resume_b": resume_b,
                  "cuda": cuda, "groups": groups, "families": families}[scenario](out, model_dir, tied_dir)
    except Exception:
        result = {"error": traceback.format_exc()}
    torch.save(result, out / f"{scenario}-rank{rank}.pt")
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
