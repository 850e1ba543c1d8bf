"""One-GPU check of the GPU profile, in under 13 minutes from empty compile caches: every stage in
its own process, under its own time limit, with a JSON result.

Stages (limit, seconds):
- env (30): torch, CUDA, cuDNN, NCCL, Transformer Engine, vLLM, megatron-core versions, the GPU,
  and every pin of containers/gpu-resolve.json that the installed version differs from;
- te_parity (90): the tiny Qwen2 (configs/experiments/tiny-cpu.yaml's shape) on Transformer
  Engine layers in bf16 against transformers in bf16: packed log-probs, SFT gradients, the HF
  export of the loaded checkpoint (sharded, read back through trainer/hf_checkpoint.py as every
  rank reads checkpoints; bit-equal to it in bf16), three decoupled-PPO steps;
- mfu (120): a DeepSeek-R1-Distill-Qwen-1.5B-shaped model (random weights, bf16, math-1.5b's
  recomputation and chunked log-probs) on one GPU: tokens/s, model FLOPs utilisation (goal >= 40%)
  and peak memory of a decoupled-PPO step (pi_prox forward + forward + backward + optimizer) at
  16,384 and 32,768 tokens per micro-batch, against sim/memory.py's estimate;
- vllm (300): CUDA vLLM through the project's Generator on the 1.5B shape: output tokens/s;
- weight_update (240): a trainer process takes a PPO step and streams its weights
  (TrainEngine.iter_hf_weights -> WeightSender, backend nccl) into a CUDA vLLM engine of another
  process on the same GPU; checksums compared, then the engine's log-probs against the trainer's.
  NCCL refuses two ranks of one communicator on one GPU ("Duplicate GPU detected", init.cc: same
  host hash and bus id); the two processes get distinct NCCL_HOSTID values, so NCCL takes them for
  two hosts and moves the bytes over its socket transport (P2P and SHM off): the protocol and the
  NCCL code path of a run, not its speed (that needs two GPUs).

Both vLLM stages start a compiled engine, as a run does: torch.compile (Dynamo, Inductor, Triton)
and CUDA-graph capture take minutes with empty caches (VLLM_CACHE_ROOT, TORCHINDUCTOR_CACHE_DIR,
TRITON_CACHE_DIR), and their limits allow for that. They do not run eager: the vllm stage measures
the throughput a run gets (CUDA graphs included), and weight_update checks that weights reloaded in
place reach the captured graphs, which an eager engine would not test.

MFU counts model FLOPs: 8 x matmul parameters per token (pi_prox forward 2, forward 2, backward
4) plus causal attention, as benchmarks/train_step.py counts them (x 8/6), over the dense bf16
peak; recomputation's extra forward is not counted.

`--dry-run` (CPU machine): every stage builds its configs and plan and stops before its first
CUDA call; te_parity also runs its export check on the CPU profile (the same load, export and
read-back, on gloo and local layers, in the CPU profile's fp32: its local-spec norms keep fp32
weights under bf16, which TE's fused norms do not). The report is printed (and written to --out only
when --out is given).
A real run writes benchmarks/results/gpu_check.json. Exit status 1 when a stage failed.

Usage: .venv/bin/python benchmarks/gpu_check.py [--dry-run] [--out PATH] [--stages env,mfu,...]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))  # train_step's pieces
from train_step import PEAK_BF16, model_flops_per_token  # noqa: E402

from areal_hpc.config.load import load_config  # noqa: E402
from areal_hpc.wire.messages import GenerateRequest, SamplingParams, Trajectory  # noqa: E402

DEFAULT_OUT = ROOT / "benchmarks" / "results" / "gpu_check.json"
GOAL_S = 780
GOAL_MFU = 0.40
# One GPU holds the trainer and (in weight_update) a vLLM engine, both in bf16 (generator.dtype auto
# is the trainer's).
ONE_GPU = ["device=cuda", "trainer.dp=1", "generator.count=1", "generator.tensor_parallel_size=1",
           "cluster.gpus_per_node=1", "cluster.train_nodes=1", "cluster.rollout_nodes=1",
           "trainer.params_dtype=bf16"]
PACKAGES = ("torch", "vllm", "transformer_engine", "transformer_engine_torch", "transformer_engine_cu13",
            "megatron-core", "transformers", "mpi4py", "nvidia-nccl-cu13", "nvidia-cudnn-cu13")
# Tokens per packed sequence in the MFU batches (the paper's mean trace is ~7k tokens).
MFU_SEQUENCE = 8192
MFU_MICRO_BATCHES = (16384, 32768)


def tiny_config(*extra: str):
    return load_config(ROOT / "configs/experiments/tiny-cpu.yaml", [
        *ONE_GPU, "trainer.micro_batch_tokens=512", "rollout.max_prompt_len=64", "rollout.max_new_tokens=128",
        "ppo.minibatches=2", "optimizer.lr=1e-4", "optimizer.warmup_ratio=0", *extra], check_files=False)


def mfu_config(micro_batch: int, *extra: str):
    return load_config(ROOT / "configs/experiments/math-1.5b.yaml", [
        *ONE_GPU, f"trainer.micro_batch_tokens={micro_batch}", "rollout.max_prompt_len=1024",
        f"rollout.max_new_tokens={MFU_SEQUENCE - 1024}", "ppo.minibatches=1", "rollout.batch_prompts=2",
        f"rollout.group_size={micro_batch // MFU_SEQUENCE}", "total_steps=10", *extra], check_files=False)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_single_rank(cfg) -> None:
    from areal_hpc.trainer.parallel import init_trainer_world

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(free_port()))
    init_trainer_world(cfg, 0, 1, "env://")


def batch(seed: int, prompts: int, group: int, prompt_len: int, output_len: int, vocab: int,
          fixed: bool = False) -> list[Trajectory]:
    """Random PPO trajectories (rewards +-5); `fixed`: every one exactly prompt_len + output_len."""
    rng = random.Random(seed)
    out = []
    for p in range(prompts):
        prompt = [rng.randrange(vocab) for _ in range(prompt_len if fixed else rng.randint(3, prompt_len))]
        for s in range(group):
            n = output_len if fixed else rng.randint(1, output_len)
            out.append(Trajectory(p, s, prompt, [rng.randrange(vocab) for _ in range(n)], [0.0] * n, [0] * n,
                                  "stop", reward=rng.choice([5.0, -5.0])))
    return out


def ppo_step(engine, trajectories: list[Trajectory]) -> dict:
    """One training step under the controller's batch plan, behaviour log-probs the current ones."""
    from areal_hpc.trainer.batch_plan import shards

    for t, lps in zip(trajectories, engine.compute_logprobs(trajectories), strict=True):
        t.logprobs, t.versions = lps, [engine.version] * len(lps)
    return engine.train_step(shards(engine.cfg, engine.version, trajectories)[0])


def export_unequal(source_dir: Path, export_dir: Path, dtype) -> list[str]:
    """The tensor names of the export that are not the source's tensor in `dtype` (bit for bit),
    or that either directory lacks. Both are read through trainer/hf_checkpoint.py, which reads
    one model.safetensors or an index and its shards (an export is always the latter)."""
    import torch

    from areal_hpc.trainer.hf_checkpoint import HFCheckpoint

    source, export = HFCheckpoint(source_dir), HFCheckpoint(export_dir)
    common = set(source.names()) & set(export.names())
    unequal = set(source.names()) ^ set(export.names())
    for name in common:
        got, want = export.get(name), source.get(name).to(dtype)
        if got.dtype != want.dtype or not torch.equal(got, want):
            unequal.add(name)
    return sorted(unequal)


def export_check(engine, model_dir: Path, out: Path) -> dict:
    """The engine's Hugging Face export of the checkpoint it loaded from `model_dir`, compared with it."""
    from areal_hpc.trainer.model import params_dtype

    engine.export_hf(out)
    return {"export_files": sorted(p.name for p in out.glob("model*.safetensors*")),
            "export_unequal_tensors": export_unequal(model_dir, out, params_dtype(engine.cfg, engine.device))}


def differences(a: list[list[float]], b: list[list[float]]) -> dict:
    d = [abs(x - y) for xs, ys in zip(a, b, strict=True) for x, y in zip(xs, ys, strict=True)]
    return {"max": max(d), "mean": sum(d) / len(d), "tokens": len(d)}


# ------------------------------------------------------------------------------------- stages


def stage_env(dry_run: bool) -> dict:
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    pins = json.loads((ROOT / "containers/gpu-resolve.json").read_text())["resolved"]
    wanted = dict(p.split("==") for p in pins)
    off_pin = {n: {"installed": versions[n], "pinned": wanted[n]} for n in versions
               if n in wanted and versions[n] != wanted[n]}
    result = {"versions": versions, "off_pin": off_pin}
    if dry_run:
        return result
    import torch

    result.update({
        "torch_cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(),
        "nccl": ".".join(map(str, torch.cuda.nccl.version())), "device": torch.cuda.get_device_name(),
        "capability": ".".join(map(str, torch.cuda.get_device_capability())),
        "memory_gb": torch.cuda.get_device_properties(0).total_memory / 1e9,
    })
    import transformer_engine.pytorch  # noqa: F401  the extension loads against this torch

    result["transformer_engine_imports"] = True
    return result


def stage_te_parity(dry_run: bool) -> dict:
    from areal_hpc.data.tiny_model import build_tiny_model
    from areal_hpc.trainer import hf_export
    from areal_hpc.trainer.engine import TrainEngine

    cfg = tiny_config()
    trajs = batch(1, 4, 4, 16, 50, cfg.model.vocab_size)
    sft = [(t.prompt_ids.tolist(), t.output_ids.tolist()) for t in trajs]
    plan = {"model": cfg.model.name, "dtype": "bf16", "trajectories": len(trajs), "ppo_steps": 3}
    if dry_run:
        cpu = tiny_config("device=cpu", "trainer.params_dtype=auto")
        with tempfile.TemporaryDirectory() as tmp:
            model_dir = build_tiny_model(cpu.model, Path(tmp) / "tiny")
            init_single_rank(cpu)
            engine = TrainEngine(cpu)
            engine.load_hf(model_dir)
            checked = export_check(engine, model_dir, Path(tmp) / "export")
        return {"plan": plan, "cpu": checked, "ok": not checked["export_unequal_tensors"]}
    import torch
    from transformers import AutoModelForCausalLM

    torch.backends.cuda.matmul.allow_tf32 = False
    work = Path(tempfile.mkdtemp())
    model_dir = build_tiny_model(cfg.model, work / "tiny")
    init_single_rank(cfg)
    engine = TrainEngine(cfg)
    engine.load_hf(model_dir)
    te_lp = engine.compute_logprobs(trajs)
    hf = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.bfloat16, attn_implementation="eager").cuda()
    hf_lp, hf_loss, tokens = [], 0.0, sum(len(c) for _, c in sft)
    for prompt, completion in sft:
        ids = torch.tensor([prompt + completion], device="cuda")
        logp = hf(ids).logits.float().log_softmax(-1)[0]
        picked = logp[len(prompt) - 1:-1].gather(1, ids[0, len(prompt):, None])[:, 0]
        hf_lp.append(picked.tolist())
        hf_loss = hf_loss - picked.sum() / tokens
    hf_loss.backward()
    engine_loss = engine._sft_backward(engine._sft_sequences(sft))
    te_grads = {n: g for bucket in hf_export.stream(engine.model, engine.rules, cfg.model, engine.ranks, 2**26,
                                                     lambda p: p.main_grad.detach()) for n, g in bucket}
    hf_grads = dict(hf.named_parameters())
    rel = {n: float((g.float() - hf_grads[n].grad.float()).norm() / hf_grads[n].grad.float().norm().clamp_min(1e-12))
           for n, g in te_grads.items()}
    unequal = export_check(engine, model_dir, work / "export")["export_unequal_tensors"]
    steps = [ppo_step(engine, batch(10 + s, 4, 4, 16, 50, cfg.model.vocab_size)) for s in range(3)]
    lp = differences(te_lp, hf_lp)
    worst = max(rel, key=rel.get)
    result = {"plan": plan, "logprob_diff": lp, "loss": {"te": engine_loss, "hf": float(hf_loss)},
              "grad_relative_error": {"max": rel[worst], "max_tensor": worst, "median": statistics.median(rel.values())},
              "export_unequal_tensors": unequal, "ppo_losses": [s["loss"] for s in steps],
              "version": engine.version}
    result["ok"] = (lp["mean"] < 0.02 and rel[worst] < 0.05 and not unequal and engine.version == 3
                    and all(abs(x) < 1e6 for x in result["ppo_losses"]))
    return result


def stage_mfu(dry_run: bool) -> dict:
    from areal_hpc.sim.hardware import H200
    from areal_hpc.sim.memory import config_memory
    from areal_hpc.trainer.engine import TrainEngine

    cfgs = {mb: mfu_config(mb) for mb in MFU_MICRO_BATCHES}
    batches = {mb: batch(0, 2 * c.rollout.batch_prompts, c.rollout.group_size, 1024, MFU_SEQUENCE - 1024,
                         c.model.vocab_size, fixed=True) for mb, c in cfgs.items()}
    plan = {mb: {"recompute": c.trainer.recompute, "logprob_chunk_tokens": c.trainer.logprob_chunk_tokens,
                 "sequences_per_micro_batch": mb // MFU_SEQUENCE, "micro_batches_per_step": 2,
                 "estimated_peak_gb_h200": config_memory(c, H200).train_peak / 1e9} for mb, c in cfgs.items()}
    if dry_run:
        return {"plan": plan}
    import torch

    init_single_rank(cfgs[MFU_MICRO_BATCHES[0]])
    name = torch.cuda.get_device_name()
    peak = next((v for k, v in PEAK_BF16.items() if k in name), None)
    result: dict = {"device": name, "peak_tflops": peak / 1e12 if peak else None, "by_micro_batch": {}}
    for mb, cfg in cfgs.items():
        engine = TrainEngine(cfg)
        per_seq = batches[mb]  # two steps' worth: the steps alternate between its halves
        steps = []
        torch.cuda.reset_peak_memory_stats()
        for step in range(3):
            torch.cuda.synchronize()
            start = time.perf_counter()
            ppo_step(engine, per_seq[:len(per_seq) // 2] if step % 2 else per_seq[len(per_seq) // 2:])
            torch.cuda.synchronize()
            if step:  # the first step pays for allocations and kernel selection
                steps.append(time.perf_counter() - start)
        tokens = len(per_seq) // 2 * MFU_SEQUENCE
        step_s = statistics.median(steps)
        # compute_logprobs (the behaviour stand-in) runs inside the timed step: one more forward.
        flops = tokens * model_flops_per_token(cfg.model, MFU_SEQUENCE) * (8 + 2) / 6
        result["by_micro_batch"][mb] = {
            "tokens_per_step": tokens, "step_s": step_s, "tokens_per_s": tokens / step_s,
            "model_tflops": flops / step_s / 1e12, "mfu": flops / step_s / peak if peak else None,
            "peak_memory_gb": torch.cuda.max_memory_allocated() / 1e9, **plan[mb]}
        del engine
        torch.cuda.empty_cache()
    mfus = [r["mfu"] for r in result["by_micro_batch"].values() if r["mfu"] is not None]
    result["ok"] = bool(mfus) and min(mfus) >= GOAL_MFU
    return result


def random_hf_model(model_cfg, out: Path) -> Path:
    """A Hugging Face directory of model_cfg's shape, random bf16 weights made on the GPU, and the
    tiny tokenizer (prompts use its ids; the model's own vocabulary is larger)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from areal_hpc.config.hf import hf_config_dict
    from areal_hpc.data.arithmetic import make_splits
    from areal_hpc.data.tokenizer import train_tokenizer

    train, _ = make_splits(0, 2000, 1)
    train_tokenizer((p.prompt + p.solution for p in train), 512, out)
    hf = hf_config_dict(model_cfg, torch_dtype="bfloat16")
    config = AutoConfig.for_model(hf.pop("model_type"), **hf)
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(str(out), safe_serialization=True)
    return out


async def _throughput(cfg, model_dir: Path, prompts: int, group: int, new_tokens: int) -> dict:
    from areal_hpc.rollout.generator import Generator

    gen = Generator(cfg, model_dir)
    start = time.perf_counter()
    await gen.start()
    started = time.perf_counter() - start
    rng = random.Random(0)
    start = time.perf_counter()
    for p in range(prompts):
        gen.submit(GenerateRequest(p, [rng.randrange(3, 500) for _ in range(256)], group,
                                   SamplingParams(new_tokens, temperature=1.0, seed=p)))
    tokens = sum([len((await gen.finished()).output_ids) for _ in range(prompts * group)])
    wall = time.perf_counter() - start
    await gen.shutdown()
    return {"engine_start_s": started, "samples": prompts * group, "output_tokens": tokens, "wall_s": wall,
            "tokens_per_s": tokens / wall}


def stage_vllm(dry_run: bool) -> dict:
    import transformers  # noqa: F401  what random_hf_model and the engine need, before any CUDA call

    from areal_hpc.rollout.generator import Generator  # noqa: F401

    cfg = load_config(ROOT / "configs/experiments/math-1.5b.yaml", [*ONE_GPU, "generator.max_num_seqs=256",
                      "generator.gpu_memory_utilization=0.8"], check_files=False)
    plan = {"model": cfg.model.name, "prompts": 64, "group": 4, "prompt_tokens": 256, "max_new_tokens": 1024,
            "max_num_seqs": cfg.generator.max_num_seqs}
    if dry_run:
        return {"plan": plan}
    model_dir = random_hf_model(cfg.model, Path(tempfile.mkdtemp()) / "qwen2-1.5b-random")
    return {"plan": plan, **asyncio.run(_throughput(cfg, model_dir, 64, 4, 1024))}


# NCCL sees the sender and the engine as two hosts (see the module docstring); sockets on loopback.
NCCL_ONE_GPU = {"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1", "NCCL_NET": "Socket", "NCCL_SOCKET_IFNAME": "lo"}


def _trainer_process(model_dir: str, port: int, sequences, out) -> None:
    """The trainer side of weight_update: a PPO step, then its weights over NCCL, then log-probs."""
    os.environ.update(NCCL_ONE_GPU, NCCL_HOSTID="areal-gpu-check-trainer")
    try:
        from areal_hpc.rollout.weight_transfer import WeightSender
        from areal_hpc.trainer.engine import TrainEngine

        cfg = tiny_config()
        init_single_rank(cfg)
        engine = TrainEngine(cfg)
        engine.load_hf(model_dir)
        step = ppo_step(engine, batch(5, 4, 4, 16, 50, cfg.model.vocab_size))
        sender = WeightSender("127.0.0.1", port, 2, "nccl")
        start = time.perf_counter()
        sums = sender.send(engine.version, engine.iter_hf_weights(cfg.generator.weight_bucket_bytes))
        send_s = time.perf_counter() - start
        logprobs = engine.compute_logprobs([Trajectory(0, i, p, o, [0.0] * len(o), [0] * len(o), "stop")
                                            for i, (p, o) in enumerate(sequences)])
        out.put({"checksums": sums, "send_s": send_s, "version": engine.version, "loss": step["loss"],
                 "logprobs": logprobs})
        sender.close()
    except Exception as e:  # reported by the stage
        import traceback

        out.put({"error": f"{type(e).__name__}: {e}\n{traceback.format_exc()[-3000:]}"})


async def _weight_update(cfg, model_dir: Path, sequences) -> dict:
    import multiprocessing as mp

    from areal_hpc.rollout.generator import Generator

    os.environ.update(NCCL_ONE_GPU, NCCL_HOSTID="areal-gpu-check-generator")  # the engine inherits it
    gen = Generator(cfg, model_dir)
    await gen.start()
    before = await gen.recompute_logprobs(sequences)
    port = free_port()
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    trainer = ctx.Process(target=_trainer_process, args=(str(model_dir), port, sequences, out), daemon=True)
    trainer.start()
    await gen.init_weight_group("127.0.0.1", port, 2, 1)
    update = await gen.update_weights(1)
    sent = await asyncio.to_thread(out.get, True, 120)
    trainer.join(30)
    if "error" in sent:
        raise RuntimeError(f"trainer process: {sent['error']}")
    after = await gen.recompute_logprobs(sequences)
    await gen.shutdown()
    diff_after, diff_before = differences(after, sent["logprobs"]), differences(before, sent["logprobs"])
    same = update.checksums == sent["checksums"]
    return {"tensors": len(sent["checksums"]), "checksums_equal": same, "update_s": update.seconds,
            "send_s": sent["send_s"], "version": gen.version, "trainer_loss": sent["loss"],
            "logprob_diff_after_update": diff_after, "logprob_diff_before_update": diff_before,
            "ok": same and gen.version == 1 and diff_after["mean"] < 0.02 and diff_after["mean"] < diff_before["mean"]}


def stage_weight_update(dry_run: bool) -> dict:
    from areal_hpc.data.tiny_model import build_tiny_model
    from areal_hpc.rollout.generator import Generator  # noqa: F401  imported before any CUDA call
    from areal_hpc.rollout.weight_transfer import WeightSender  # noqa: F401

    cfg = tiny_config("generator.gpu_memory_utilization=0.25", "generator.max_num_seqs=32")
    sequences = [([(7 * i + 3 * j) % 500 + 3 for j in range(12)], [(11 * i + 5 * j) % 500 + 3 for j in range(40)])
                 for i in range(8)]
    plan = {"model": cfg.model.name, "backend": "nccl", "nccl_env": NCCL_ONE_GPU, "sequences": len(sequences),
            "bucket_bytes": cfg.generator.weight_bucket_bytes}
    if dry_run:
        return {"plan": plan}
    model_dir = build_tiny_model(cfg.model, Path(tempfile.mkdtemp()) / "tiny")
    return {"plan": plan, **asyncio.run(_weight_update(cfg, model_dir, sequences))}


STAGES = {"env": (30, stage_env), "te_parity": (90, stage_te_parity), "mfu": (120, stage_mfu),
          "vllm": (300, stage_vllm), "weight_update": (240, stage_weight_update)}


# ------------------------------------------------------------------------------------- driver


def run_stage(name: str, dry_run: bool, work: Path) -> dict:
    """Stage `name` in a child process under its time limit: its result, or why it has none."""
    limit, _ = STAGES[name]
    result_file = work / f"{name}.json"
    cmd = [sys.executable, __file__, "--stage", name, "--result", str(result_file)] + (["--dry-run"] if dry_run else [])
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "CUDA_DEVICE_MAX_CONNECTIONS": "1"}
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=limit)
        status = "ok" if proc.returncode == 0 and result_file.is_file() else "failed"
        log = proc.stderr
    except subprocess.TimeoutExpired as e:
        status, log = "timeout", (e.stderr or b"").decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
    report = {"status": status, "limit_s": limit, "wall_s": round(time.perf_counter() - start, 1)}
    if result_file.is_file():
        report["result"] = json.loads(result_file.read_text())
        if report["result"].get("ok") is False:
            report["status"] = "below goal"
    if status != "ok":
        report["log_tail"] = log[-4000:]
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="stop every stage before its first CUDA call")
    parser.add_argument("--out", type=Path, default=None, help=f"report file (default on a real run: {DEFAULT_OUT})")
    parser.add_argument("--stages", default=",".join(STAGES), help="comma-separated subset of " + ", ".join(STAGES))
    parser.add_argument("--stage", help=argparse.SUPPRESS)
    parser.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.stage:  # a child: one stage, its result as JSON
        result = STAGES[args.stage][1](args.dry_run)
        args.result.write_text(json.dumps(result, indent=1, default=str))
        return 0
    names = args.stages.split(",")
    unknown = [n for n in names if n not in STAGES]
    if unknown:
        parser.error(f"unknown stage(s) {', '.join(unknown)}; choose from {', '.join(STAGES)}")
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        stages = {}
        for name in names:
            stages[name] = run_stage(name, args.dry_run, Path(tmp))
            print(f"{name:<14} {stages[name]['status']:<10} {stages[name]['wall_s']:>6.1f} s"
                  f" (limit {stages[name]['limit_s']} s)", flush=True)
    report = {"dry_run": args.dry_run, "goal_s": GOAL_S, "wall_s": round(time.perf_counter() - start, 1),
              "stages": stages}
    out = args.out or (None if args.dry_run else DEFAULT_OUT)
    text = json.dumps(report, indent=1, default=str) + "\n"
    if out is None:
        print(text, end="")
    else:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
        print(f"wrote {out}")
    return 0 if all(s["status"] == "ok" for s in stages.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
