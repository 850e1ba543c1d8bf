"""`areal-hpc eval --model` given a training checkpoint, or a run's checkpoints directory, points
to the Hugging Face export to evaluate instead (hf/, or `areal-hpc export-hf`)."""

from __future__ import annotations

from pathlib import Path

from areal_hpc.cli import main
from areal_hpc.controller import checkpoint as ckpt
from areal_hpc.evaluation.commands import model_problem


def training_checkpoint(root: Path, step: int, hf: bool) -> Path:
    """The layout the controller writes (trainer shards, config, tokenizer; hf/ at hf_interval)."""
    path = ckpt.step_dir(root, step)
    ckpt.trainer_dir(path).mkdir(parents=True)
    ckpt.config_file(path).write_text("name: x\n")
    if hf:
        ckpt.hf_dir(path).mkdir()
        (ckpt.hf_dir(path) / "config.json").write_text("{}")
    ckpt.mark_complete(path)
    return path


def test_a_checkpoint_with_its_export_points_to_it(tmp_path) -> None:
    path = training_checkpoint(tmp_path, 100, hf=True)
    assert model_problem(path) == ("a training checkpoint, not a Hugging Face directory: evaluate its export,"
                                   f" --model {path}/hf")
    assert model_problem(path / "hf") is None


def test_a_checkpoint_without_export_says_how_to_export(tmp_path, capsys) -> None:
    path = training_checkpoint(tmp_path, 100, hf=False)
    assert main(["eval", "--model", str(path), "--data", "d.jsonl", "--out", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err == (
        f"error: --model {path}: a training checkpoint without a Hugging Face export (hf/, written at"
        f" checkpoint.hf_interval): export it first, areal-hpc export-hf {path} --out DIR, then evaluate --model DIR\n")


def test_a_runs_checkpoints_directory_names_its_latest_export(tmp_path) -> None:
    training_checkpoint(tmp_path, 10, hf=True)
    latest = training_checkpoint(tmp_path, 20, hf=True)
    assert model_problem(tmp_path) == f"a run's checkpoints directory: evaluate one checkpoint's hf/ export, e.g." \
                                      f" --model {latest}/hf"


def test_anything_else_has_no_config_json(tmp_path) -> None:
    assert model_problem(tmp_path / "missing") == "no config.json there (not a Hugging Face checkpoint directory)"
