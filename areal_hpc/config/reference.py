"""docs/config-reference.md, generated from the comments of config/schema.py.

The schema's comments are the one description of every setting; this module turns them into a
page (every key: dotted name, type, default, comment) so the page cannot drift from the code.
Comments are read with `tokenize` and fields with `ast`, so a `#` inside a string is never a
comment. A comment block documents the fields on the lines directly below it, up to a blank line
or the next comment (`top_p` and `top_k` share one).

    python -m areal_hpc.config.reference --out docs/config-reference.md
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import io
import sys
import tokenize
from pathlib import Path
from typing import Any, NamedTuple, get_type_hints

import yaml

from areal_hpc.config import schema
from areal_hpc.config.schema import ExperimentConfig

HEADER = """# Configuration reference

Every key of an experiment config, generated from the comments of
[areal_hpc/config/schema.py](../areal_hpc/config/schema.py) by
`areal-hpc config reference --out docs/config-reference.md` (tests/config/test_reference.py fails
when this page is out of date). Set a key in the YAML file or with `--set key=value`;
`areal-hpc config show CONFIG` prints the resolved values.
"""


@dataclasses.dataclass(frozen=True)
class Key:
    """One documented setting of the schema."""

    name: str  # dotted, e.g. "rollout.eta"
    type: str  # as the source spells it
    default: str  # as YAML writes it
    comment: str


class Comment(NamedTuple):
    text: str
    shared: bool  # taken from the field on the line above, not written above this one


def field_comments(source: str) -> dict[tuple[str, str], Comment]:
    """(class name, field name) -> the comment documenting that field in `source`.

    A field with no comment of its own shares the one of the field on the line directly above it;
    a field after a blank line and no comment gets "".
    """
    comments: dict[int, str] = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT and not tok.line[: tok.start[1]].strip():
            comments[tok.start[0]] = tok.string.removeprefix("#").strip()
    out: dict[tuple[str, str], Comment] = {}
    for cls in ast.parse(source).body:
        if not isinstance(cls, ast.ClassDef):
            continue
        previous: tuple[int, str] | None = None  # (end line, comment) of the field before
        for node in cls.body:
            if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
                previous = None
                continue
            block = []
            line = node.lineno - 1
            while line in comments:
                block.insert(0, comments[line])
                line -= 1
            if block:
                text = " ".join(part for part in block if part)
            elif previous is not None and previous[0] == node.lineno - 1:
                text = previous[1]
            else:
                text = ""
            out[cls.name, node.target.id] = Comment(text, shared=not block and bool(text))
            previous = (node.end_lineno or node.lineno, text)
    return out


def _yaml(value: Any) -> str:
    text = yaml.safe_dump(value, default_flow_style=True, sort_keys=False, width=10**6).strip()
    return text.removesuffix("...").strip()


def _default(f: dataclasses.Field) -> Any:
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return f.default


def _source_types(source: str) -> dict[tuple[str, str], str]:
    """(class name, field name) -> the annotation as written."""
    return {(cls.name, node.target.id): ast.unparse(node.annotation)
            for cls in ast.parse(source).body if isinstance(cls, ast.ClassDef)
            for node in cls.body if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)}


def sections(root: type = ExperimentConfig, source: str | None = None) -> list[tuple[str, str, list[Key]]]:
    """(section name, its description, its keys) for `root` and every dataclass below it, in
    declaration order; the top level's section name is ""."""
    source = inspect.getsource(schema) if source is None else source
    comments, types = field_comments(source), _source_types(source)
    found: list[tuple[str, str, list[Key]]] = []

    def visit(cls: type, prefix: str, description: str) -> None:
        keys: list[Key] = []
        nested: list[tuple[type, str, str]] = []
        hints = get_type_hints(cls)
        for f in dataclasses.fields(cls):
            name = f"{prefix}{f.name}"
            comment = comments.get((cls.__name__, f.name), Comment("", False))
            if dataclasses.is_dataclass(hints[f.name]):
                doc = "" if comment.shared else comment.text
                sub = hints[f.name]
                nested.append((sub, f"{name}.", " ".join(filter(None, [inspect.getdoc(sub), doc]))))
                continue
            keys.append(Key(name, types[cls.__name__, f.name], _yaml(_default(f)), comment.text))
        found.append((prefix.removesuffix("."), description, keys))
        for sub, sub_prefix, doc in nested:
            visit(sub, sub_prefix, doc)

    visit(root, "", inspect.getdoc(root) or "")
    return found


def _cell(text: str) -> str:
    """`text` in a table cell: pipes escaped."""
    return text.replace("|", "\\|")


def _prose(text: str) -> str:
    """A comment as Markdown: "<" outside code spans escaped, so "<file stem>" is no HTML tag."""
    parts = " ".join(text.split()).split("`")
    return "`".join(part if i % 2 else part.replace("<", "&lt;") for i, part in enumerate(parts))


def render(root: type = ExperimentConfig, source: str | None = None) -> str:
    """The whole page."""
    parts = [HEADER]
    all_sections = sections(root, source)
    index = ", ".join(f"[`{name}`](#{name.replace('.', '')})" for name, _, _ in all_sections if name)
    parts.append(f"Sections: [top level](#top-level), {index}.\n")
    for name, description, keys in all_sections:
        parts.append(f"## {name or 'top level'}\n")
        if description:
            parts.append(_prose(description) + "\n")
        parts.append("| key | type | default | description |\n|---|---|---|---|")
        parts.extend(f"| `{k.name}` | `{_cell(k.type)}` | `{_cell(k.default)}` | {_cell(_prose(k.comment))} |"
                     for k in keys)
        parts.append("")
    return "\n".join(parts)


def undocumented(root: type = ExperimentConfig, source: str | None = None) -> list[str]:
    """Dotted names of the keys that have no comment."""
    return [k.name for _, _, keys in sections(root, source) for k in keys if not k.comment]


def write(out: str | None) -> int:
    """Print the page, or write it to `out`."""
    text = render()
    if out is None:
        sys.stdout.write(text)
    else:
        Path(out).write_text(text)
        print(f"wrote {out}")
    return 0


def register(cmds: argparse._SubParsersAction) -> None:
    """`areal-hpc config reference [--out FILE]`."""
    p = cmds.add_parser("reference", help="print the Markdown reference of every key (docs/config-reference.md)")
    p.add_argument("--out", help="write it to this file instead of standard output")
    p.set_defaults(func=lambda args: write(args.out))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m areal_hpc.config.reference", description=__doc__.split("\n")[0])
    parser.add_argument("--out", help="write it to this file instead of standard output")
    sys.exit(write(parser.parse_args().out))
