"""docs/config-reference.md is the rendering of config/schema.py's comments, as the committed
SLURM scripts are the rendering of their configs."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from areal_hpc.cli import main
from areal_hpc.config.reference import field_comments, render, sections, undocumented
from areal_hpc.config.schema import ExperimentConfig

PAGE = Path("docs/config-reference.md")


def test_committed_page_equals_rendering() -> None:
    assert PAGE.read_text() == render(), (
        "docs/config-reference.md is out of date; run: areal-hpc config reference --out docs/config-reference.md")


def test_every_key_has_a_comment() -> None:
    assert undocumented() == [], "schema keys without a comment above them in areal_hpc/config/schema.py"


def test_every_schema_key_is_on_the_page() -> None:
    def leaves(obj: object, prefix: str = "") -> list[str]:
        out = []
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            out += leaves(value, f"{prefix}{f.name}.") if dataclasses.is_dataclass(value) else [prefix + f.name]
        return out
    listed = [k.name for _, _, keys in sections() for k in keys]
    assert sorted(listed) == sorted(leaves(ExperimentConfig()))
    text = render()
    for name in ("rollout.eta", "reward.code.backend", "logging.wandb.mode", "seed"):
        assert f"| `{name}` |" in text


SOURCE = '''
@dataclass
class A:
    """Section A."""

    # One comment
    # over two lines; a "#" in it stays.
    x: int = 1
    y: str = "a # not a comment"
    # Shared by the two below.
    top_p: float = 1.0
    top_k: int = -1

    z: bool = False  # trailing comments are not documentation
'''


def test_comments_are_read_with_the_tokenizer() -> None:
    comments = field_comments(SOURCE)
    assert comments["A", "x"] == ('One comment over two lines; a "#" in it stays.', False)
    assert comments["A", "y"] == (comments["A", "x"].text, True)  # the line directly below shares it
    assert comments["A", "top_p"].text == comments["A", "top_k"].text == "Shared by the two below."
    assert comments["A", "z"] == ("", False)  # after a blank line, with no comment of its own


def test_types_with_pipes_are_escaped_and_defaults_are_yaml() -> None:
    text = render()
    assert "| `model.path` | `str \\| None` | `null` |" in text
    assert "| `rollout.staleness_gate` | `str` | `admission` |" in text
    assert "| `trainer.recompute_modules` | `list[str]` | `[mlp]` |" in text
    assert "eval_set/&lt;file stem>/" in text  # not an HTML tag <file stem> that hides the text
    assert "\n## reward.code\n" in text and "\n## top level\n" in text
    # a section's description is its class docstring and its own comment, not the field's above it
    assert "## model\n\nA dense decoder" in text and "join the weight groups" not in text.split("## model")[1]


def test_command_writes_the_page(tmp_path: Path, capsys) -> None:
    out = tmp_path / "ref.md"
    assert main(["config", "reference", "--out", str(out)]) == 0
    assert out.read_text() == render()
    assert main(["config", "reference"]) == 0
    assert capsys.readouterr().out.endswith(render())
