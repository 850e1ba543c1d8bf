"""`areal-hpc slurm verify`: every paper layout checked at its true shapes (real megatron-core on the
meta device under a fake process group, real transformers and vLLM rules), small families built
the same way, and each kind of problem named."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from areal_hpc.cli import main
from areal_hpc.config.load import load_config
from areal_hpc.config.schema import ModelConfig
from areal_hpc.errors import UserError
from areal_hpc.metrics.library_logs import quiet_libraries
from areal_hpc.runtime.preflight import check_layout
from areal_hpc.sim.hardware import H200, H800
from areal_hpc.slurm.render import render
from areal_hpc.slurm.scaling import parse_context, strong_scaling_overrides
from areal_hpc.slurm.verify import (
    Report,
    build_problems,
    mapped_memory,
    mapping,
    shape_tensors,
    verify,
    vllm_problems,
)

REPO = Path(__file__).resolve().parents[2]
TINY = "configs/experiments/tiny-cpu.yaml"
PAPER = ["math-1.5b", "math-7b", "code-14b", "code-32b"]


def paper(name: str) -> str:
    return f"configs/experiments/{name}.yaml"


def scale_point(name: str, gpus: int) -> list[str]:
    """The overrides `areal-hpc slurm scale` bakes into the point's script."""
    return strong_scaling_overrides(load_config(paper(name), check_files=False), gpus, parse_context("32k"), 20,
                                    "runs/point")


@pytest.fixture(autouse=True)
def quiet() -> None:
    """megatron-core's warnings that Transformer Engine and Apex are absent, as the CLI hides them."""
    quiet_libraries()


@pytest.fixture(scope="module")
def reports() -> dict[str, Report]:
    """Every paper layout and the 512-GPU points of the smallest and the largest, verified once."""
    quiet_libraries()
    out = {name: verify(load_config(paper(name), check_files=False), H800) for name in PAPER}
    for name in ("math-1.5b", "code-32b"):
        out[f"{name}@512"] = verify(load_config(paper(name), scale_point(name, 512), check_files=False), H800)
    return out


@pytest.mark.parametrize("name", [*PAPER, "math-1.5b@512", "code-32b@512"])
def test_paper_layouts_verify(reports: dict[str, Report], name: str) -> None:
    r = reports[name]
    cfg, t = r.cfg, r.cfg.trainer
    assert r.problems == []
    # Only the distinct shards are built (first and last stage leaders), whatever the world size.
    assert [(s, rank) for s, rank, _ in r.builds] == sorted({(0, 0), (t.pp - 1, (t.pp - 1) * t.tp * t.dp)})
    assert r.memory.train_peak < r.memory.train_limit
    assert r.kv.tokens >= r.kv.max_model_len >= r.kv.longest_sequence
    # Every stage leader sends its stage, to a group of itself and every generator's workers.
    assert [u.sender for u in r.updates] == [1 + s * t.tp * t.dp for s in range(t.pp)]
    assert {u.world for u in r.updates} == {1 + cfg.generator.count * cfg.generator.tensor_parallel_size}
    model_params = r.memory.generator_weights * cfg.generator.tensor_parallel_size / 2
    assert sum(u.bytes for u in r.updates) == model_params * 2  # fp16: the whole model once


def test_code_32b_shards_at_their_true_size(reports: dict[str, Report]) -> None:
    r = reports["code-32b"]
    # Stage 0 holds the embedding, stage 1 the output layer and the final norm (5120 more).
    assert r.megatron_params == [2_048_028_672, 2_048_033_792]
    assert r.hf_count == 771
    assert [u.buckets for u in r.updates] == [97, 98]
    assert r.updates[0].largest_bucket == 152064 * 5120 * 2  # the embedding alone
    # The 512-GPU point builds the same shards, in a world of 128 trainers, 96 engines.
    big = reports["code-32b@512"]
    assert big.megatron_params == r.megatron_params and big.cfg.trainer_world == 128
    assert {u.world for u in big.updates} == {1 + 96 * 4}


def test_the_plan_memory_is_verify_memory(reports: dict[str, Report]) -> None:
    """`slurm plan` asks memory.py the same question with the mapping's counts, which verify finds
    equal to the built shards' and the Hugging Face model's."""
    for name in PAPER:
        r = reports[name]
        assert mapped_memory(r.cfg, H800) == r.memory, name


def test_the_cli_prints_the_table_and_json(capsys: pytest.CaptureFixture) -> None:
    assert main(["slurm", "verify", TINY]) == 0
    captured = capsys.readouterr()
    assert "verify: building trainer rank 0 of 1 (stage 0 of 1) on the meta device" in captured.err
    assert captured.out.startswith("tiny-cpu: verified at full size in ")
    assert "megatron-core's local layer spec" in captured.out
    assert "weight update stage 0: 1 buckets" in captured.out
    assert main(["slurm", "verify", TINY, "--set", "trainer.tp=2", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["ok"] and data["trainer"]["tp"] == 2 and data["weight_update"][0]["group_world"] == 2
    assert main(["slurm", "verify", paper("code-32b")]) == 0
    out = capsys.readouterr().out
    assert "ranks 0 (stage 0, " in out and "48 (stage 1, " in out
    assert "weight update stage 1: 98 buckets, 32.76 GB (largest 1.56); group of 289: sender rank 49" in out


FAMILIES = {
    "qwen2 tp2 pp2": ["trainer.tp=2", "trainer.pp=2"],
    # q/k norms, no bias, a head size of its own (4 heads x 64 > hidden 128)
    "qwen3 tp2 pp2": ["model.family=qwen3", "model.head_dim=64", "trainer.tp=2", "trainer.pp=2"],
    "llama tp2": ["model.family=llama", "trainer.tp=2"],
    "tied pp1": ["model.tie_word_embeddings=true"],
    # the last stage's copy of the tied embedding is built, and not sent
    "tied tp2 pp2": ["model.tie_word_embeddings=true", "trainer.tp=2", "trainer.pp=2"],
    # first, one middle and last stage built; the other middle stage sends through stage 1's model
    "pp4": ["trainer.pp=4"],
    "sequence parallel": ["trainer.tp=2", "trainer.sequence_parallel=true"],
}


@pytest.mark.parametrize("overrides", FAMILIES.values(), ids=FAMILIES.keys())
def test_small_families_verify(overrides: list[str]) -> None:
    cfg = load_config(TINY, overrides, check_files=False)
    r = verify(cfg, H800)
    assert r.problems == []
    t, m = cfg.trainer, cfg.model
    assert [s for s, _, _ in r.builds] == sorted({0, min(1, t.pp - 1), t.pp - 1})
    assert len(r.updates) == t.pp
    sent = sum(u.bytes for u in r.updates) // 4  # fp32 on the CPU profile
    assert sent == sum(x.numel() for x in shape_tensors(m).values())  # every tensor once
    last = mapping(m, t.tp, t.pp, shape_tensors(m)).stages[-1]
    assert ("output_layer.weight" in last) == (not m.tie_word_embeddings or t.pp > 1)


def test_qwen3_shards_hold_the_head_norms() -> None:
    cfg = load_config(TINY, FAMILIES["qwen3 tp2 pp2"], check_files=False)
    stage = mapping(cfg.model, 2, 2, shape_tensors(cfg.model)).stages[0]
    assert stage["decoder.layers.0.self_attention.q_layernorm.weight"] == (64,)
    # 4 heads of 64 with 2 KV groups, half the groups per TP rank: (2 q + k + v) x 64 rows
    assert stage["decoder.layers.0.self_attention.linear_qkv.weight"] == (256, 128)
    assert "decoder.layers.0.self_attention.linear_qkv.bias" not in stage


@pytest.mark.parametrize(
    "config,overrides,message",
    [
        (TINY, ["trainer.tp=3"], "trainer.tp = 3: must divide model.num_attention_heads = 4"),
        (TINY, ["trainer.pp=3"], "trainer.pp = 3: must divide model.num_layers = 4"),
        (TINY, ["model.num_query_groups=1", "generator.tensor_parallel_size=2"],
         "generator.tensor_parallel_size = 2: must divide model.num_attention_heads = 4 and model.num_query_groups = 1"),
        (TINY, ["generator.kv_cache_bytes=1048576"],
         "generator KV cache: 512 tokens per engine, fewer than one sequence of 1024 (vLLM's max_model_len"),
        (paper("code-32b"), ["trainer.recompute=none"],
         "GB at the peak (first pipeline stage), over the 76.0 GB usable of an H800 (80 GB): lower"
         " trainer.micro_batch_tokens (now 32768)"),
        (paper("code-32b"), ["generator.gpu_memory_utilization=0.3"],
         "raise generator.gpu_memory_utilization (now 0.3) or generator.tensor_parallel_size (now 4)"),
    ],
    ids=["tp-heads", "pp-layers", "vllm-tp-kv-heads", "kv-cpu", "trainer-memory", "kv-gpu"],
)
def test_problems_are_named_and_exit_2(capsys: pytest.CaptureFixture, config: str, overrides: list[str],
                                       message: str) -> None:
    args = ["slurm", "verify", config]
    for o in overrides:
        args += ["--set", o]
    assert main(args) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    # One line per problem (the config's own checks list theirs under one "error:" line).
    assert any(message in line for line in captured.err.splitlines()), captured.err
    assert "error: " in captured.err and "Traceback" not in captured.err


def test_a_bigger_gpu_fits_what_an_h800_does_not() -> None:
    cfg = load_config(paper("code-32b"), ["generator.gpu_memory_utilization=0.3"], check_files=False)
    assert verify(cfg, H800, build=False).problems and not verify(cfg, H200, build=False).problems


def test_vllm_rules() -> None:
    m = ModelConfig(family="qwen2", vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_layers=28,
                    num_attention_heads=12, num_query_groups=2, max_position_embeddings=131072)
    assert vllm_problems(m, 4) == []  # 2 KV heads replicated over 4 ranks
    assert vllm_problems(m, 2) == []
    three = vllm_problems(m, 3)
    assert any("num_query_groups = 2 KV heads" in p for p in three)
    assert any("vocabulary padded by vLLM (model.vocab_size = 151936 -> 151936 rows)" in p for p in three)
    eight = vllm_problems(m, 8)
    assert any("model.num_attention_heads = 12" in p for p in eight)
    assert not any("KV heads" in p for p in eight)  # 8 % 2 == 0: replicated


def test_mapping_finds_what_a_checkpoint_lacks_or_adds() -> None:
    m = load_config(TINY, check_files=False).model
    good = shape_tensors(m)
    assert mapping(m, 2, 2, good).problems == []
    broken = dict(good)
    del broken["model.layers.3.mlp.down_proj.weight"]
    broken["model.layers.1.self_attn.q_proj.weight"] = torch.empty(64, 128, device="meta")
    broken["model.layers.9.mlp.up_proj.weight"] = torch.empty(384, 128, device="meta")
    problems = mapping(m, 2, 2, broken).problems
    assert any("of another shape than convert.py expects: model.layers.1.self_attn.q_proj.weight [64, 128]" in p
               for p in problems)
    assert any("stage 1 decoder.layers.1.mlp.linear_fc2.weight: maps from model.layers.3.mlp.down_proj.weight" in p
               for p in problems)
    assert any("in no pipeline stage: model.layers.9.mlp.up_proj.weight" in p for p in problems)


def test_mapping_finds_uneven_tensor_parallel_shards() -> None:
    m = load_config(TINY, check_files=False).model
    problems = mapping(m, 3, 1, shape_tensors(m)).problems
    assert any("decoder.layers.0.self_attention.linear_qkv.weight (qkv of" in p for p in problems), problems


def test_build_problems_name_every_difference() -> None:
    half = torch.float16
    mapped = {"a.weight": (4, 2), "b.weight": (3,), "norm.weight": (2,)}
    built = {"a.weight": ((2, 2), half), "c.weight": ((1,), torch.float32), "norm.weight": ((2,), torch.float32)}
    problems = build_problems(1, built, mapped, half, norms={"norm.weight"})
    assert problems == [
        "trainer stage 1: 1 built parameter(s) without a convert.py rule: c.weight",
        "trainer stage 1: 1 convert.py rule(s) for parameters the model lacks: b.weight",
        "trainer stage 1: 1 parameter(s) built in another shape than mapped: a.weight [2, 2] (mapped [4, 2])",
        "trainer stage 1: parameters in torch.float32, not the training dtype torch.float16",
    ]


def test_preflight_runs_the_cheap_part_only() -> None:
    """Mapping and memory at launch, without importing megatron-core or vLLM (seconds each)."""
    script = ("import sys; from areal_hpc.config.load import load_config; from areal_hpc.runtime.preflight import"
              f" check_layout; check_layout(load_config({TINY!r}, check_files=False));"
              " print(sorted(m for m in ('megatron', 'vllm') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
    with pytest.raises(UserError, match=r"^the layout cannot run: generator KV cache: 512 tokens per engine"):
        check_layout(load_config(TINY, ["generator.kv_cache_bytes=1048576"], check_files=False))
    with pytest.raises(UserError, match=r"^the layout cannot run \(memory against an H800; AREAL_GPU names"):
        check_layout(load_config(paper("code-32b"), ["trainer.recompute=none"], check_files=False))


def test_a_script_run_directly_verifies_before_it_submits_itself() -> None:
    text = render(load_config(TINY), TINY)
    direct = text[text.index('if [[ -z ${SLURM_JOB_ID:-} ]]; then'):]
    assert direct.index("-m areal_hpc.cli slurm verify \"$config\"") < direct.index("exec sbatch")
