"""The config schema, loader, validation and `areal-hpc config` commands."""

from __future__ import annotations

import glob
import subprocess
import sys
from pathlib import Path

import pytest

from areal_hpc.cli import main
from areal_hpc.config import load_config, save_config, to_yaml
from areal_hpc.config.validate import check_world
from areal_hpc.errors import ConfigError

EXPERIMENTS = sorted(glob.glob("configs/experiments/*.yaml"))


def write(tmp_path: Path, text: str, name: str = "exp.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def run_cli(*args: str) -> subprocess.CompletedProcess:
    """The installed console script, as a user runs it."""
    exe = Path(sys.executable).with_name("areal-hpc")
    return subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=120)


def expect_error(capsys: pytest.CaptureFixture, path: Path, *fragments: str) -> str:
    assert main(["config", "check", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "Traceback" not in err
    for fragment in fragments:
        assert fragment in err, err
    return err


def test_experiments_exist() -> None:
    names = {Path(p).stem for p in EXPERIMENTS}
    assert {"math-1.5b", "math-7b", "code-14b", "code-32b", "tiny-cpu"} <= names


@pytest.mark.parametrize("path", EXPERIMENTS)
def test_shipped_experiment_validates(path: str) -> None:
    cfg = load_config(path)
    assert cfg.name == Path(path).stem


@pytest.mark.parametrize(
    "name,nodes,train_nodes,gen_tp",
    [("math-1.5b", 16, 4, 1), ("math-7b", 24, 6, 1), ("code-14b", 32, 8, 2), ("code-32b", 48, 12, 4)],
)
def test_paper_layouts(name: str, nodes: int, train_nodes: int, gen_tp: int) -> None:
    """The paper's node counts, a quarter training, three quarters generating, Table 3 settings."""
    cfg = load_config(f"configs/experiments/{name}.yaml")
    c = cfg.cluster
    assert c.train_nodes + c.rollout_nodes == nodes and c.train_nodes == train_nodes
    assert cfg.trainer_world == train_nodes * 8
    assert cfg.generator.count * cfg.generator.tensor_parallel_size == c.rollout_nodes * 8
    assert cfg.generator.tensor_parallel_size == gen_tp
    assert (cfg.rollout.batch_prompts, cfg.rollout.group_size, cfg.ppo.minibatches) == (512, 16, 4)
    assert cfg.rollout.max_new_tokens == 27648 and cfg.rollout.max_prompt_len == 1024
    assert cfg.optimizer.lr == 2e-5 and cfg.optimizer.weight_decay == 0.05
    assert cfg.rollout.eta == (8 if name.startswith("math") else 4)


def test_model_shapes_are_real() -> None:
    m = load_config("configs/experiments/code-32b.yaml").model
    assert (m.hidden_size, m.num_layers, m.num_attention_heads, m.num_query_groups) == (5120, 64, 40, 8)
    m = load_config("configs/experiments/tiny-cpu.yaml").model
    assert m.head_size >= 32  # vLLM's CPU attention supports head sizes from 32


def test_console_script_check_all() -> None:
    proc = run_cli("config", "check", *EXPERIMENTS)
    assert proc.returncode == 0, proc.stderr


# --- one test per class of bad input ---------------------------------------------------------


def test_unknown_key_names_closest(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = write(tmp_path, "ppo:\n  clip_epsilon: 0.1\n")
    expect_error(capsys, path, "unknown key 'ppo.clip_epsilon'", "did you mean 'ppo.clip_eps'")


def test_unknown_section(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = write(tmp_path, "optimiser:\n  lr: 1.0\n")
    expect_error(capsys, path, "unknown key 'optimiser'", "'optimizer'")


def test_wrong_type_names_key(tmp_path: Path) -> None:
    path = write(tmp_path, "rollout:\n  eta: four\n")
    proc = run_cli("config", "check", str(path))
    assert proc.returncode == 2
    assert "rollout.eta" in proc.stderr and "four" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_section_not_a_mapping(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    expect_error(capsys, write(tmp_path, "ppo: 3\n"), "ppo")


@pytest.mark.parametrize(
    "yaml_text,fragment",
    [
        ("rollout: {eta: -1}", "rollout.eta = -1: must be >= 0"),
        ("ppo: {clip_eps: 0}", "ppo.clip_eps = 0.0: must be in (0, 1)"),
        ("ppo: {dual_clip: 0.5}", "ppo.dual_clip"),
        ("rollout: {top_p: 0}", "rollout.top_p"),
        ("rollout: {top_p: 0.95}", "rollout.top_p = 0.95: must be 1.0 (the trainer's log-probs do not apply top-p"),
        ("rollout: {top_k: 20}", "rollout.top_k = 20: must be -1 (the trainer's log-probs do not apply top-k"),
        ("rollout: {staleness_gate: loose}", "rollout.staleness_gate = 'loose': must be one of strict, admission"),
        ("ppo: {adv_norm: batch}", "ppo.adv_norm = 'batch': must be one of global, group, grpo, none"),
        ("reward: {math_fallbacks: [last_digit]}", "reward.math_fallbacks = ['last_digit']: must list distinct items"),
        ("reward: {math_fallbacks: [last_number, last_number]}", "reward.math_fallbacks"),
        ("reward: {kind: rubric}", "reward.kind = 'rubric': must be one of math, code, custom"),
        ("reward: {by_source: {gsm8k: maths}}", "reward.by_source.gsm8k = 'maths': must be one of math, code, custom"),
        ("reward: {by_source: {mine: custom}}", "reward.function: must be set (module:function or path/to/file.py"),
        ("reward: {kind: custom, function: score.py}", "reward.function = 'score.py': must be module:function or"),
        ("generator: {interrupt_mode: pause}", "generator.interrupt_mode = 'pause': must be one of abort, keep"),
        ("device: tpu", "device = 'tpu'"),
    ],
)
def test_out_of_range(tmp_path: Path, capsys: pytest.CaptureFixture, yaml_text: str, fragment: str) -> None:
    expect_error(capsys, write(tmp_path, yaml_text + "\n"), fragment)


@pytest.mark.parametrize(
    "override,fragment",
    [
        ("trainer.tp=3", "trainer.tp = 3: must divide model.num_attention_heads"),
        ("trainer.pp=3", "trainer.pp = 3: must divide model.num_layers"),
        ("model.num_query_groups=3", "model.num_query_groups = 3: does not divide"),
        ("generator.tensor_parallel_size=8", "generator.tensor_parallel_size = 8"),
        ("trainer.micro_batch_tokens=100", "trainer.micro_batch_tokens = 100"),
        ("trainer.sequence_parallel=true", "needs trainer.tp > 1"),
        ("trainer.dp=17", "ppo.minibatches = 2 x trainer.dp = 17: more than the trajectories per step"),
    ],
)
def test_inconsistent_parallelism(override: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config("configs/experiments/tiny-cpu.yaml", [override])
    assert fragment in str(info.value)


def test_cluster_layout_mismatch() -> None:
    with pytest.raises(ConfigError) as info:
        load_config("configs/experiments/code-32b.yaml", ["generator.count=70"])
    assert "generator.count = 70" in str(info.value) and "rollout GPUs" in str(info.value)
    with pytest.raises(ConfigError) as info:
        load_config("configs/experiments/code-32b.yaml", ["trainer.dp=5"])
    assert "training GPUs" in str(info.value)


def test_world_size_mismatch() -> None:
    cfg = load_config("configs/experiments/tiny-cpu.yaml")
    assert check_world(cfg, 3) == []
    (problem,) = check_world(cfg, 4)
    assert "MPI world size 4" in problem and "= 3" in problem


def test_missing_files(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = write(tmp_path, f"model: {{path: {tmp_path}/nowhere}}\ndata: {{train_path: {tmp_path}/x.jsonl}}\n")
    expect_error(capsys, path, "model.path", "directory not found", "data.train_path", "file not found")
    empty = tmp_path / "empty-model"
    empty.mkdir()
    expect_error(capsys, write(tmp_path, f"model: {{path: {empty}}}\n"), "has no config.json")


def test_missing_config_file(capsys: pytest.CaptureFixture) -> None:
    assert main(["config", "check", "no/such/file.yaml"]) == 2
    assert "config file not found" in capsys.readouterr().err


def test_invalid_yaml(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    expect_error(capsys, write(tmp_path, "ppo: {clip_eps: [\n"), "not valid YAML")


def test_base_cycle(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    write(tmp_path, "base: [b.yaml]\n", "a.yaml")
    write(tmp_path, "base: [a.yaml]\n", "b.yaml")
    expect_error(capsys, tmp_path / "a.yaml", "includes itself")


# --- overrides and round trip -----------------------------------------------------------------


def test_overrides_apply_and_are_typed() -> None:
    cfg = load_config(
        "configs/experiments/tiny-cpu.yaml",
        ["ppo.clip_eps=0.1", "rollout.eta=0", "ppo.dual_clip=3", "ppo.decoupled=false", "model.path=null"],
    )
    assert cfg.ppo.clip_eps == 0.1 and isinstance(cfg.ppo.clip_eps, float)
    assert cfg.rollout.eta == 0 and isinstance(cfg.rollout.eta, int)
    assert cfg.ppo.dual_clip == 3.0 and isinstance(cfg.ppo.dual_clip, float)
    assert cfg.ppo.decoupled is False and cfg.model.path is None


def test_bad_overrides() -> None:
    with pytest.raises(ConfigError, match="key=value"):
        load_config("configs/experiments/tiny-cpu.yaml", ["ppo.clip_eps"])
    with pytest.raises(ConfigError, match="did you mean 'ppo.clip_eps'"):
        load_config("configs/experiments/tiny-cpu.yaml", ["ppo.clip_ep=0.1"])
    with pytest.raises(ConfigError, match="rollout.eta"):
        load_config("configs/experiments/tiny-cpu.yaml", ["rollout.eta=1.5"])


def test_show_prints_resolved_yaml(capsys: pytest.CaptureFixture) -> None:
    assert main(["config", "show", "configs/experiments/code-32b.yaml", "--set", "rollout.eta=2"]) == 0
    out = capsys.readouterr().out
    assert "eta: 2" in out and "hidden_size: 5120" in out and "base:" not in out


@pytest.mark.parametrize("path", EXPERIMENTS)
def test_round_trip_through_yaml(tmp_path: Path, path: str) -> None:
    cfg = load_config(path, ["ppo.dual_clip=2.5"])
    save_config(cfg, tmp_path / "resolved.yaml")
    again = load_config(tmp_path / "resolved.yaml")
    assert again == cfg
    assert to_yaml(again) == to_yaml(cfg)


@pytest.mark.parametrize("override, fragment", [
    ("model.vocab_size=511", "trainer.tp = 2: must divide model.vocab_size = 511"),
    ("model.intermediate_size=383", "trainer.tp = 2: must divide model.intermediate_size = 383"),
])
def test_the_config_check_knows_every_trainer_layout_rule(override: str, fragment: str) -> None:
    """The trainer's own start-up check and the config check are one rule set."""
    with pytest.raises(ConfigError) as info:
        load_config("configs/experiments/tiny-cpu.yaml", ["trainer.tp=2", override])
    assert fragment in str(info.value)


def test_eval_sets_must_exist_and_be_told_apart(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    for f in (tmp_path / "aime.jsonl", tmp_path / "a" / "aime.jsonl"):
        f.write_text('{"prompt": "q", "answer": "1"}\n')
    cfg = load_config("configs/experiments/tiny-cpu.yaml", [f"eval.paths=[{tmp_path}/aime.jsonl]", "eval.n=8"])
    assert (cfg.eval.paths, cfg.eval.n) == ([f"{tmp_path}/aime.jsonl"], 8)
    with pytest.raises(ConfigError, match=r"eval.paths\[1\] = .*nope.jsonl': file not found"):
        load_config("configs/experiments/tiny-cpu.yaml", [f"eval.paths=[{tmp_path}/aime.jsonl,{tmp_path}/nope.jsonl]"])
    with pytest.raises(ConfigError, match="two data sets share a name"):
        load_config("configs/experiments/tiny-cpu.yaml", [f"eval.paths=[{tmp_path}/aime.jsonl,{tmp_path}/a/aime.jsonl]"])
    with pytest.raises(ConfigError, match="eval.top_p"):
        load_config("configs/experiments/tiny-cpu.yaml", ["eval.top_p=0"])
