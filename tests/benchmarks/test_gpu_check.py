"""benchmarks/gpu_check.py --dry-run on a machine without a GPU: every stage imports what it
runs, builds its configs and plan in its own process, te_parity's export check runs on the CPU
profile, and the report is written where asked and nowhere else (benchmarks/results/gpu_check.json
is a real run's)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from bench_scripts import loaded
from safetensors.torch import save_file

from areal_hpc.trainer.hf_checkpoint import write_index

SCRIPT = Path("benchmarks/gpu_check.py")
RESULT = Path("benchmarks/results/gpu_check.json")


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("gpu_check") / "report.json"
    before = RESULT.stat().st_mtime_ns if RESULT.exists() else None
    proc = subprocess.run([sys.executable, str(SCRIPT), "--dry-run", "--out", str(out)], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (RESULT.stat().st_mtime_ns if RESULT.exists() else None) == before, "a dry run wrote the real report"
    return json.loads(out.read_text())


def test_every_stage_runs_in_its_own_process_up_to_cuda(dry_run):
    assert dry_run["dry_run"] is True
    stages = dry_run["stages"]
    assert list(stages) == ["env", "te_parity", "mfu", "vllm", "weight_update"]
    assert all(s["status"] == "ok" and s["wall_s"] < s["limit_s"] for s in stages.values()), stages
    # the limits fit the goal, and the vLLM stages' allow for a cold torch.compile and CUDA-graph capture
    assert sum(s["limit_s"] for s in stages.values()) <= dry_run["goal_s"] == 780
    assert stages["vllm"]["limit_s"] >= 240 and stages["weight_update"]["limit_s"] >= 240


def test_stage_plans(dry_run):
    s = dry_run["stages"]
    versions = s["env"]["result"]["versions"]
    assert versions["megatron-core"] == "0.16.1" and versions["torch"].startswith("2.13.0")
    # the CPU profile is off the gpu pins, and says where
    assert s["env"]["result"]["off_pin"]["torch"]["pinned"] == "2.13.0"
    mfu = s["mfu"]["result"]["plan"]
    assert set(mfu) == {"16384", "32768"}
    assert all(p["recompute"] == "full" and p["logprob_chunk_tokens"] == 2048 for p in mfu.values())
    assert mfu["32768"]["estimated_peak_gb_h200"] > mfu["16384"]["estimated_peak_gb_h200"]
    assert s["te_parity"]["result"]["plan"]["dtype"] == "bf16"
    assert s["weight_update"]["result"]["plan"]["backend"] == "nccl"


def test_te_parity_reads_the_sharded_export_back(dry_run):
    """The stage's export check, on the CPU profile: an export is shards and an index (no
    model.safetensors), and what it reads back is the loaded checkpoint."""
    cpu = dry_run["stages"]["te_parity"]["result"]["cpu"]
    assert cpu["export_files"] == ["model-pp00-00000.safetensors", "model.safetensors.index.json"]
    assert cpu["export_unequal_tensors"] == []


def test_export_comparison_names_what_differs(tmp_path):
    """export_unequal over one model.safetensors against shards with an index: the tensor that
    differs, the one the export lacks, and every tensor when the dtype is not the export's."""
    a, b, c = torch.ones(4, 2), torch.arange(3.0), torch.zeros(2)
    (tmp_path / "source").mkdir()
    save_file({"a": a, "b": b, "c": c}, str(tmp_path / "source" / "model.safetensors"))
    export = tmp_path / "export"
    export.mkdir()
    save_file({"a": a.to(torch.bfloat16)}, str(export / "model-pp00-00000.safetensors"))
    save_file({"b": (b + 1).to(torch.bfloat16)}, str(export / "model-pp01-00000.safetensors"))
    write_index(export, {"a": "model-pp00-00000.safetensors", "b": "model-pp01-00000.safetensors"}, 14)
    with loaded("gpu_check") as module:
        assert module.export_unequal(tmp_path / "source", export, torch.bfloat16) == ["b", "c"]
        assert module.export_unequal(tmp_path / "source", export, torch.float32) == ["a", "b", "c"]


def test_a_stage_past_its_limit_is_reported_not_waited_for(tmp_path):
    with loaded("gpu_check") as module:
        module.STAGES["env"] = (0.01, module.STAGES["env"][1])
        report = module.run_stage("env", True, tmp_path)
    assert report["status"] == "timeout" and report["limit_s"] == 0.01 and "result" not in report


def test_unknown_stage_is_refused():
    proc = subprocess.run([sys.executable, str(SCRIPT), "--dry-run", "--stages", "env,nope"], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2 and "unknown stage(s) nope" in proc.stderr
