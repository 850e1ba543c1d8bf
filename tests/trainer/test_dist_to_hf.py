"""`areal-hpc export-hf`: trainer checkpoints of a tp=2 and a pp=2 (tied) layout exported offline, in
this one process, equal what the trainer ranks exported themselves at the same state, and
transformers runs the export with the trainer's logits."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from conftest import run_worker

from areal_hpc.cli import main
from areal_hpc.controller import checkpoint as ck
from areal_hpc.trainer import dist_to_hf
from areal_hpc.trainer.hf_checkpoint import INDEX, HFCheckpoint

pytestmark = pytest.mark.slow

EXPORT_WORKER = Path(__file__).with_name("export_worker.py")


@pytest.fixture(scope="module")
def written(trainer_out: Path, tiny_model_dir: Path, tied_model_dir: Path) -> list[dict]:
    return run_worker("checkpoints", 2, trainer_out, tiny_model_dir, tied_model_dir, worker=EXPORT_WORKER)


def tensors(path: Path) -> dict[str, torch.Tensor]:
    hf = HFCheckpoint(path)
    return {n: hf.get(n) for n in hf.names()}


def export_cli(*args: str) -> int:
    return main(["export-hf", *map(str, args)])


@pytest.mark.parametrize("layout", ["tp2", "pp2tied"])
def test_export_equals_the_trainer_ranks_export_at_the_same_state(written, tmp_path, layout):
    step = written[0][f"{layout}_dir"]
    out = tmp_path / "hf"
    assert export_cli(step, "--out", out) == 0
    mine, theirs = tensors(out), tensors(ck.hf_dir(step))
    assert sorted(mine) == sorted(theirs)
    for name, t in theirs.items():
        assert mine[name].dtype == t.dtype and torch.equal(mine[name], t), name
    for file in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"):
        assert json.loads((out / file).read_text()) == json.loads((ck.hf_dir(step) / file).read_text()), file
    generation = json.loads((out / "generation_config.json").read_text())
    assert set(generation) == {"bos_token_id", "eos_token_id"}  # no sampling defaults
    assert [p.name for p in out.glob("*.safetensors")] == ["model-00001-of-00001.safetensors"]


def test_shards_split_at_the_given_size_and_the_index_names_every_tensor(written, tmp_path):
    step = written[0]["tp2_dir"]
    out = dist_to_hf.export(step, tmp_path / "hf", dtype="bf16", shard_bytes=2**19)
    files = sorted(p.name for p in out.glob("*.safetensors"))
    assert len(files) > 2 and files[-1] == f"model-{len(files):05d}-of-{len(files):05d}.safetensors"
    index = json.loads((out / INDEX).read_text())
    assert set(index["weight_map"].values()) == set(files)
    sizes = [p.stat().st_size for p in out.glob("*.safetensors")]
    assert max(sizes) < 2**19 + 2**17  # a shard is one tensor over the size at most (the embedding: 128 KiB)
    mine, theirs = tensors(out), tensors(ck.hf_dir(step))
    assert index["metadata"]["total_size"] == sum(t.numel() * 2 for t in theirs.values())
    for name, t in theirs.items():
        assert mine[name].dtype == torch.bfloat16 and torch.equal(mine[name], t.to(torch.bfloat16)), name
    assert json.loads((out / "config.json").read_text())["torch_dtype"] == "bfloat16"


def test_transformers_loads_the_export_with_the_trainers_logits(written, tmp_path):
    from transformers import AutoModelForCausalLM

    out = tmp_path / "hf"
    assert export_cli(written[0]["tp2_dir"], "--out", out) == 0
    model = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(written[0]["prompt"]).logits[0]
    trainer = torch.cat([written[0]["tp2_logits"], written[1]["tp2_logits"]], dim=-1)  # vocabulary halves
    assert logits.shape == trainer.shape
    torch.testing.assert_close(logits, trainer, atol=1e-4, rtol=1e-4)
    assert (logits.argmax(-1) == trainer.argmax(-1)).all()


def test_a_directory_that_is_not_a_complete_checkpoint_exits_2_naming_it(written, tmp_path, capsys):
    step = written[0]["tp2_dir"]
    torn = tmp_path / "torn" / step.name
    shutil.copytree(step, torn)
    (torn / ck.MARKER).unlink()
    no_trainer = tmp_path / "no-trainer" / step.name
    shutil.copytree(step, no_trainer)
    shutil.rmtree(ck.trainer_dir(no_trainer))
    cases = [
        (torn, "not a complete checkpoint (no COMPLETE file"),
        (no_trainer, "damaged: trainer/"),
        (step.parent, "not a complete checkpoint"),  # the checkpoint root, not a step-N directory
        (tmp_path / "missing", "no such checkpoint directory"),
    ]
    for path, message in cases:
        assert export_cli(path, "--out", tmp_path / "out") == 2
        err = capsys.readouterr().err
        assert f"error: {path}: {message}" in err, err
    assert not (tmp_path / "out").exists()
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    assert export_cli(step, "--out", tmp_path / "full") == 2
    assert "not an empty directory" in capsys.readouterr().err
