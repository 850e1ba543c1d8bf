"""Every problem of a config and its overrides in one error, each naming where its value came
from; the paper configs take their shape from a shipped config.json and any model's from its own."""

from __future__ import annotations

import glob
import json
from pathlib import Path

import pytest

from areal_hpc.cli import main
from areal_hpc.config.hf import shape_from_hf
from areal_hpc.config.load import expected, load_config
from areal_hpc.config.validate import missing_weights
from areal_hpc.errors import ConfigError

TINY = "configs/experiments/tiny-cpu.yaml"
PAPER = {"math-1.5b": "DeepSeek-R1-Distill-Qwen-1.5B", "math-7b": "DeepSeek-R1-Distill-Qwen-7B",
         "code-14b": "DeepSeek-R1-Distill-Qwen-14B", "code-32b": "DeepSeek-R1-Distill-Qwen-32B"}
# The published config.json shapes: hidden, intermediate, layers, heads, key/value heads, vocabulary,
# rope_theta, rms_norm_eps.
PUBLISHED = {
    "DeepSeek-R1-Distill-Qwen-1.5B": (1536, 8960, 28, 12, 2, 151936, 10000.0, 1e-6),
    "DeepSeek-R1-Distill-Qwen-7B": (3584, 18944, 28, 28, 4, 152064, 10000.0, 1e-6),
    "DeepSeek-R1-Distill-Qwen-14B": (5120, 13824, 48, 40, 8, 152064, 1e6, 1e-5),
    "DeepSeek-R1-Distill-Qwen-32B": (5120, 27648, 64, 40, 8, 152064, 1e6, 1e-5),
}
SHAPE = ("hidden_size", "intermediate_size", "num_layers", "num_attention_heads", "num_query_groups",
         "vocab_size", "rope_theta", "rms_norm_eps")
# A model of another family and shape that every paper layout can split (tp 8, pp 2, generator tp 4).
QWEN3_32B = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 5120, "head_dim": 128,
             "intermediate_size": 25600, "num_hidden_layers": 64, "num_attention_heads": 64,
             "num_key_value_heads": 8, "vocab_size": 151936, "max_position_embeddings": 40960,
             "rope_theta": 1000000, "rms_norm_eps": 1e-6, "tie_word_embeddings": False}


def problems(path: str | Path | None, *overrides: str) -> list[str]:
    """The lines of the ConfigError loading `path` with `overrides` raises."""
    with pytest.raises(ConfigError) as info:
        load_config(path, list(overrides))
    lines = str(info.value).splitlines()
    return [line.strip() for line in lines[1:]] if len(lines) > 1 else lines


def test_every_bad_key_and_value_is_named_with_its_source(tmp_path: Path) -> None:
    exp = tmp_path / "exp.yaml"
    exp.write_text(f"base: [{Path(TINY).resolve()}]\nppo: {{clip_epsilon: 0.1}}\nrollout: {{eta: four}}\n"
                   "optimizer: {lr: -1.0}\n")
    found = problems(exp, "model.hidden_size=abc", "trainer.tpp=2", "reward.kind=rubric", "ppo.minibatches=[2]")
    assert sorted(found) == sorted([
        f"unknown key 'ppo.clip_epsilon'; did you mean 'ppo.clip_eps'? (from {exp})",
        "unknown key 'trainer.tpp'; did you mean 'trainer.tp'? (from --set)",
        "model.hidden_size: expected an integer or null, got 'abc' (from --set)",
        f"rollout.eta: expected an integer, got 'four' (from {exp})",
        "ppo.minibatches: expected an integer, got [2] (from --set)",
        f"optimizer.lr = -1.0: must be > 0 (from {exp})",
        "reward.kind = 'rubric': must be one of math, code, custom (from --set)",
    ])
    with pytest.raises(ConfigError, match=r"^7 problems in the config:\n  "):
        load_config(exp, ["model.hidden_size=abc", "trainer.tpp=2", "reward.kind=rubric", "ppo.minibatches=[2]"])


def test_a_bad_override_is_blamed_on_set_not_on_the_file() -> None:
    assert problems(TINY, "rollout.eta=1.5") == ["rollout.eta: expected an integer, got 1.5 (from --set)"]
    assert problems(TINY, "rollout.eta=-1") == ["rollout.eta = -1: must be >= 0 (from --set)"]
    assert problems(TINY, "ppo.clip_eps") == ["--set 'ppo.clip_eps': not of the form key=value (e.g. ppo.clip_eps=0.1)"]


def test_a_value_is_blamed_on_the_base_file_that_set_it() -> None:
    # micro_batch_tokens comes from the shared Table 3 settings, max_new_tokens from --set
    (line,) = problems("configs/experiments/math-1.5b.yaml", "rollout.max_new_tokens=40000")
    assert line.startswith("trainer.micro_batch_tokens = 32768: smaller than the longest sequence")
    assert line.endswith("(from configs/base/paper-table3.yaml, --set)")


def test_a_check_that_would_repeat_a_reported_value_is_left_out() -> None:
    # tp left at its default by the bad value must not also fail the layout checks
    assert problems("configs/experiments/code-32b.yaml", "trainer.tp=eight") == [
        "trainer.tp: expected an integer, got 'eight' (from --set)"]


def test_field_types_read_as_words() -> None:
    assert expected(int) == "an integer" and expected(float | None) == "a number or null"
    assert expected(bool | None) == "true, false or null" and expected(list[str]) == "a list of strings"
    assert expected(dict[str, str]) == "a mapping"


def test_a_shape_that_contradicts_config_json_is_one_line_per_key(tmp_path: Path) -> None:
    found = problems("configs/experiments/math-1.5b.yaml", "model.hidden_size=1024", "model.num_layers=10")
    file = "configs/models/DeepSeek-R1-Distill-Qwen-1.5B/config.json"
    assert found == [f"model.hidden_size = 1024 disagrees with {file}: hidden_size = 1536 (from --set)",
                     f"model.num_layers = 10 disagrees with {file}: num_hidden_layers = 28 (from --set)"]


def test_a_model_path_without_config_json_is_one_line(tmp_path: Path) -> None:
    assert problems("configs/experiments/math-7b.yaml", f"model.path={tmp_path}") == [
        f"model.path = '{tmp_path}': has no config.json; the model's shape comes from its config.json (from --set)"]
    (tmp_path / "config.json").write_text(json.dumps({**QWEN3_32B, "architectures": ["MambaForCausalLM"]}))
    (line,) = problems("configs/experiments/math-7b.yaml", f"model.path={tmp_path}")
    assert line.startswith(f"{tmp_path}/config.json: architecture MambaForCausalLM is not supported")


@pytest.mark.parametrize("name", PAPER)
def test_paper_configs_take_the_shape_of_their_shipped_config_json(name: str) -> None:
    directory = Path("configs/models") / PAPER[name]
    assert sorted(p.name for p in directory.iterdir()) == ["config.json"]  # no weights, no download
    m = load_config(f"configs/experiments/{name}.yaml").model
    assert m.path == str(directory) and (m.family, m.qkv_bias, m.qk_norm) == ("qwen2", True, False)
    assert tuple(getattr(m, f) for f in SHAPE) == PUBLISHED[PAPER[name]]
    shape = shape_from_hf(json.loads((directory / "config.json").read_text()), directory)
    assert tuple(shape[f] for f in SHAPE) == PUBLISHED[PAPER[name]]
    assert missing_weights(load_config(f"configs/experiments/{name}.yaml")) == [
        f"model.path = '{directory}': no weights there (no *.safetensors files), only the model's shape;"
        f" set model.path to the checkpoint directory (--set model.path=/path/to/{PAPER[name]})"]


@pytest.mark.parametrize("path", [p for p in sorted(glob.glob("configs/experiments/*.yaml"))
                                  if load_config(p).model.path is not None])
def test_any_supported_model_replaces_a_paper_model(tmp_path: Path, path: str) -> None:
    (tmp_path / "config.json").write_text(json.dumps(QWEN3_32B))
    m = load_config(path, [f"model.path={tmp_path}"]).model
    assert (m.family, m.hidden_size, m.num_layers, m.head_dim, m.qk_norm, m.qkv_bias) == ("qwen3", 5120, 64, 128,
                                                                                            True, False)
    assert len(glob.glob("configs/experiments/*.yaml")) > len(PAPER)  # the tiny ones pin their generated shape


def test_weights_make_a_model_directory_launchable(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(QWEN3_32B))
    cfg = load_config("configs/experiments/code-32b.yaml", [f"model.path={tmp_path}"])
    assert missing_weights(cfg) != []
    (tmp_path / "model-00001-of-00002.safetensors").write_bytes(b"")
    assert missing_weights(cfg) == []
    assert missing_weights(load_config(TINY)) == []  # the generated tiny model


def test_the_command_line_prints_every_problem(capsys: pytest.CaptureFixture) -> None:
    assert main(["config", "check", TINY, "--set", "model.hidden_size=abc", "--set", "trainer.tpp=1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: 2 problems in the config:\n") and "Traceback" not in err
    assert "  model.hidden_size: expected an integer or null, got 'abc' (from --set)\n" in err
