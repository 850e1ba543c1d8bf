"""`areal-hpc config show|get`: the resolved config with the schema's comments, one value or a
section as YAML, and a wrong key answered with the closest one."""

from __future__ import annotations

import yaml

from areal_hpc.cli import main
from areal_hpc.config.load import load_config

TINY = "configs/experiments/tiny-cpu.yaml"
PAPER = "configs/experiments/code-32b.yaml"


def test_show_keeps_the_schema_comments_and_loads_back(capsys, tmp_path) -> None:
    assert main(["config", "show", PAPER, "--set", "rollout.eta=2"]) == 0
    text = capsys.readouterr().out
    assert "# Training steps (policy versions) to run.\ntotal_steps: " in text
    assert "\n  # Key/value heads (grouped-query attention); must divide num_attention_heads.\n" in text
    assert max(len(line) for line in text.splitlines() if line.lstrip().startswith("#")) <= 100
    (tmp_path / "shown.yaml").write_text(text)
    assert load_config(tmp_path / "shown.yaml", check_files=False) == load_config(PAPER, ["rollout.eta=2"],
                                                                                  check_files=False)


def get(capsys, *args: str) -> tuple[int, str, str]:
    code = main(["config", "get", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_get_prints_values_for_scripts(capsys) -> None:
    assert get(capsys, TINY, "rollout.eta") == (0, "4\n", "")
    assert get(capsys, TINY, "model.path") == (0, "null\n", "")
    assert get(capsys, TINY, "name", "--set", "name=my run") == (0, "my run\n", "")
    assert get(capsys, TINY, "trainer.recompute_modules") == (0, "- mlp\n", "")


def test_get_of_a_section_is_yaml(capsys) -> None:
    code, out, _ = get(capsys, PAPER, "trainer")
    assert code == 0 and out.startswith("tp: 8\npp: 2\ndp: 6\n")
    assert yaml.safe_load(out)["params_dtype"] == load_config(PAPER).trainer.params_dtype


def test_a_wrong_key_names_the_closest(capsys) -> None:
    assert get(capsys, TINY, "trainer.tpp") == (2, "", f"error: {TINY}: unknown key 'trainer.tpp'; did you mean"
                                                      " 'trainer.tp'?\n")
    assert get(capsys, TINY, "rollout.etaa")[2].endswith("did you mean 'rollout.eta'?\n")
    assert get(capsys, TINY, "rollout.eta.x") == (2, "", f"error: {TINY}: no key 'rollout.eta.x': 'rollout.eta'"
                                                         " has no 'x'\n")
