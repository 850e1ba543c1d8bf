"""Load an experiment config: YAML files, `base:` includes, dotted overrides, typed defaults.

OmegaConf structured configs do the typed merge; this module adds what users need on top of it:
every problem of the files and overrides found in one pass (unknown keys with the closest valid
name, values of the wrong type, shape fields that contradict the checkpoint's config.json, the
checks of config/validate.py) and reported as one ConfigError, a line each, naming where the
value came from: a YAML file, `--set`, or config.json.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import types
from collections.abc import Iterable, Iterator, Sequence
from functools import cache
from pathlib import Path
from typing import Any, Union, get_args, get_origin, get_type_hints

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from areal_hpc.config.hf import (
    FAMILIES,
    SHAPE_FIELDS,
    config_key,
    disagreements,
    read_hf_config,
    shape_from_hf,
)
from areal_hpc.config.schema import ExperimentConfig, ModelConfig
from areal_hpc.config.validate import REQUIRED_SHAPE, path_kind, validate
from areal_hpc.errors import ConfigError

# A YAML file may list other YAML files (paths relative to itself) to merge underneath it, so
# experiments can share settings (configs/base/) or a model shape (configs/models/).
BASE_KEY = "base"
# Where a value given on the command line comes from, in messages.
OVERRIDES = "--set"
# A dotted config key as messages write it: the first word of a line, or a dotted word anywhere.
_LEADING_KEY = re.compile(r"[A-Za-z_]\w*(?:\.\w+)*")
_DOTTED_KEY = re.compile(r"(?<![\w/.\-])[a-z_]\w*(?:\.\w+)+")
_SECTIONS = {f.name for f in dataclasses.fields(ExperimentConfig)}
# The shape fields only a checkpoint or the YAML can give (qkv_bias and qk_norm follow the family).
_FROM_CHECKPOINT = [f for f in REQUIRED_SHAPE if f not in ("qkv_bias", "qk_norm")]


@dataclasses.dataclass
class Report:
    """The problems found so far, and where each key's value came from (its file, --set or a
    config.json), so that every line can name its source."""

    origins: dict[str, str] = dataclasses.field(default_factory=dict)
    lines: list[str] = dataclasses.field(default_factory=list)
    # Keys whose own problem is reported: a later check that mentions one would only repeat it,
    # judged on the default put in its place.
    condemned: set[str] = dataclasses.field(default_factory=set)

    def sources(self, key: str) -> list[str]:
        """Where `key` came from: its own entry, its section's, or those of the keys below it."""
        key = key.split("[")[0]
        parts = key.split(".")
        for n in range(len(parts), 0, -1):
            if ".".join(parts[:n]) in self.origins:
                return [self.origins[".".join(parts[:n])]]
        return list(dict.fromkeys(s for k, s in self.origins.items() if k.startswith(key + ".")))

    def add(self, line: str, key: str | None = None) -> None:
        """Report `line` about `key` (condemning it), or, without a key, about the keys it names."""
        if key is not None:
            self.condemned.add(key)
            found = self.sources(key)
        else:
            keys = mentioned_keys(line)
            if any(k == c or k.startswith(c + ".") for k in keys for c in self.condemned):
                return
            found = list(dict.fromkeys(s for k in keys for s in self.sources(k)))
        self.lines.append(f"{line} (from {', '.join(found)})" if found else line)

    def error(self) -> ConfigError:
        """The problems as one error: the line alone, or a count and one indented line each."""
        if len(self.lines) == 1:
            return ConfigError(self.lines[0])
        return ConfigError(f"{len(self.lines)} problems in the config:\n" + "\n".join(f"  {p}" for p in self.lines))


def mentioned_keys(line: str) -> list[str]:
    """The config keys a problem line names: its first word and every dotted key, in order."""
    lead = _LEADING_KEY.match(line)
    words = ([lead.group()] if lead else []) + _DOTTED_KEY.findall(line)
    return list(dict.fromkeys(w for w in words if w.split(".")[0] in _SECTIONS))


def _label(path: Path) -> str:
    """A file as messages name it: relative to the working directory when it is below it."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def _read_yaml(path: Path) -> dict:
    if (kind := path_kind(path)) != "file":
        raise ConfigError(f"config file not found: {_label(path)}" if kind in ("dir", "missing") else
                          f"{_label(path)}: {kind}")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise ConfigError(f"{_label(path)}: not valid YAML: {e}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{_label(path)}: the top level must be a mapping, not {type(data).__name__}")
    return data


def _deep_merge(low: dict, high: dict) -> dict:
    out = dict(low)
    for k, v in high.items():
        out[k] = _deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _leaves(data: dict, prefix: str = "") -> Iterator[str]:
    """The dotted key of every value that is not a non-empty mapping."""
    for k, v in data.items():
        if isinstance(v, dict) and v:
            yield from _leaves(v, f"{prefix}{k}.")
        else:
            yield f"{prefix}{k}"


def _read_with_bases(path: Path, origins: dict[str, str], seen: tuple[Path, ...] = ()) -> dict:
    """The file merged over its bases; `origins` gets the file that set each key."""
    path = path.resolve()
    if path in seen:
        raise ConfigError(f"{_label(path)}: includes itself through '{BASE_KEY}'")
    data = _read_yaml(path)
    bases = data.pop(BASE_KEY, [])
    if isinstance(bases, str):
        bases = [bases]
    if not isinstance(bases, list):
        raise ConfigError(f"{_label(path)}: '{BASE_KEY}' must be a list of YAML paths")
    merged: dict = {}
    for base in bases:
        merged = _deep_merge(merged, _read_with_bases(path.parent / str(base), origins, seen + (path,)))
    origins.update(dict.fromkeys(_leaves(data), _label(path)))
    return _deep_merge(merged, data)


@cache
def _hints(cls: type) -> dict[str, Any]:
    return get_type_hints(cls)


def _section_type(cls: type, name: str) -> type | None:
    """The dataclass type of field `name` of `cls`, or None for a leaf field."""
    hint = _hints(cls)[name]
    return hint if dataclasses.is_dataclass(hint) else None


def _known(data: dict, report: Report, cls: type = ExperimentConfig, prefix: str = "") -> dict:
    """`data` without the keys the schema lacks and the sections that are not mappings, each
    reported (an unknown key with the closest valid one)."""
    names = [f.name for f in dataclasses.fields(cls)]
    out = {}
    for key, value in data.items():
        full = f"{prefix}{key}"
        if key not in names:
            close = difflib.get_close_matches(str(key), names, n=1, cutoff=0.5)
            hint = f"; did you mean '{prefix}{close[0]}'?" if close else f"; valid keys: {', '.join(names)}"
            report.add(f"unknown key '{full}'{hint}", full)
            continue
        sub = _section_type(cls, key)
        if sub is None:
            out[key] = value
        elif isinstance(value, dict):
            out[key] = _known(value, report, sub, f"{full}.")
        else:
            report.add(f"{full}: expected a mapping, got {_shown(value)}", full)
    return out


def _shown(value: Any) -> str:
    return "null" if value is None else repr(value)


def expected(hint: Any) -> str:
    """A field type as a user reads it: int -> "an integer", list[str] | None -> "a list of
    strings or null"."""
    args = get_args(hint)
    if get_origin(hint) in (Union, types.UnionType):
        kinds = [expected(a) for a in args if a is not type(None)]
        if type(None) in args:  # "true or false or null" reads better as "true, false or null"
            return ", ".join(k.replace(" or ", ", ") for k in kinds) + " or null"
        return " or ".join(kinds)
    if get_origin(hint) is list or hint is list:
        return f"a list of {expected(args[0]).split(' ', 1)[1]}s" if args else "a list"
    if get_origin(hint) is dict or hint is dict or dataclasses.is_dataclass(hint):
        return "a mapping"
    return {int: "an integer", float: "a number", bool: "true or false", str: "a string"}.get(hint, str(hint))


# How OmegaConf refuses a value: its own errors, and a TypeError for a mapping given to a list key
# (or a list to a mapping key).
_REFUSED = (OmegaConfBaseException, TypeError)


def _well_typed(data: dict, report: Report, cls: type = ExperimentConfig, prefix: str = "") -> dict:
    """`data` without the values its fields cannot take, each reported: every leaf is merged alone
    into its section's schema, so each bad one is named."""
    schema, hints = OmegaConf.structured(cls), _hints(cls)
    out = {}
    for key, value in data.items():
        sub = _section_type(cls, key)
        if sub is not None:
            out[key] = _well_typed(value, report, sub, f"{prefix}{key}.")
            continue
        try:
            OmegaConf.merge(schema, {key: value})
            out[key] = value
        except _REFUSED:
            report.add(f"{prefix}{key}: expected {expected(hints[key])}, got {_shown(value)}", f"{prefix}{key}")
    return out


def _to_object(data: dict) -> ExperimentConfig:
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(ExperimentConfig), OmegaConf.create(data)))


def _typed(data: dict, report: Report) -> ExperimentConfig:
    """The typed config; values of the wrong type are reported and left at their defaults."""
    try:
        return _to_object(data)
    except _REFUSED:
        pass
    try:
        return _to_object(_well_typed(data, report))
    except _REFUSED as e:  # a value no single field refuses: say what OmegaConf says
        report.add(f"{getattr(e, 'full_key', None) or 'config'}: {str(e).splitlines()[0]}")
        raise report.error() from None


def parse_overrides(overrides: Iterable[str], report: Report) -> dict:
    """`a.b=value` strings to a nested dict; values are parsed as YAML scalars. A later override
    of a key replaces an earlier one; malformed ones are reported."""
    out: dict = {}
    for item in overrides:
        if "=" not in item:
            report.lines.append(f"{OVERRIDES} '{item}': not of the form key=value (e.g. ppo.clip_eps=0.1)")
            continue
        key, raw = item.split("=", 1)
        try:
            value = yaml.safe_load(raw) if raw != "" else ""
        except yaml.YAMLError:
            value = raw
        node = out
        parts = key.strip().split(".")
        for part in parts[:-1]:
            if not isinstance(node.get(part), dict):
                node[part] = {}
            node = node[part]
        node[parts[-1]] = value
    return out


def fill_model_shape(model: ModelConfig, report: Report) -> ModelConfig:
    """The shape fields left null, from model.path's config.json, then qkv_bias and qk_norm from
    the family. A field set in the YAML that disagrees with config.json is reported, one line per
    field naming both values; so is a model.path that cannot give a shape the YAML lacks."""
    shape_keys = [f"model.{f}" for f in SHAPE_FIELDS]
    if model.path is not None:
        file = Path(model.path) / "config.json"
        if path_kind(file) == "file":
            try:
                shape = shape_from_hf(read_hf_config(model.path), file)
            except ConfigError as e:
                report.add(str(e), "model.path")
                report.condemned.update(shape_keys)
                shape = None
            if shape is not None:
                for field, ours, theirs in disagreements(model, shape, only_set=True):
                    report.add(f"model.{field} = {ours!r} disagrees with {file}: {config_key(field)} = {theirs!r}",
                               f"model.{field}")
                filled = {f: v for f, v in shape.items() if getattr(model, f) is None}
                report.origins.update({f"model.{f}": str(file) for f in filled})
                model = dataclasses.replace(model, **filled)
        elif any(getattr(model, f) is None for f in _FROM_CHECKPOINT):
            kind = path_kind(model.path)
            where = {"dir": "has no config.json", "file": "directory not found", "missing": "directory not found"}.get(
                kind, kind)
            report.add(f"model.path = {model.path!r}: {where}; the model's shape comes from its config.json",
                       "model.path")
            report.condemned.update(shape_keys)
    if "model.family" in report.condemned:  # reported and left unset: these follow from it
        report.condemned.update(("model.qkv_bias", "model.qk_norm"))
    family = FAMILIES.get(model.family)
    if family is not None:
        model = dataclasses.replace(
            model,
            qkv_bias=family.qkv_bias if model.qkv_bias is None else model.qkv_bias,
            qk_norm=family.qk_norm if model.qk_norm is None else model.qk_norm,
        )
    return model


def load_config(
    path: str | Path | None = None, overrides: Sequence[str] = (), check_files: bool = True
) -> ExperimentConfig:
    """Read, merge, type and validate a config. Raises one ConfigError listing every problem, one
    a line, each naming its source; a file that cannot be read at all is the only early stop."""
    report = Report()
    data = {} if path is None else _read_with_bases(Path(path), report.origins)
    extra = parse_overrides(overrides, report)
    # Each key as written (`name={x: 1}` sets `name`, not `name.x`) and each leaf below it.
    written = [item.split("=", 1)[0].strip() for item in overrides if "=" in item]
    report.origins.update(dict.fromkeys([*written, *_leaves(extra)], OVERRIDES))
    cfg = _typed(_known(_deep_merge(data, extra), report), report)
    cfg.model = fill_model_shape(cfg.model, report)
    for problem in validate(cfg, check_files=check_files):
        report.add(problem)
    if report.lines:
        raise report.error()
    return cfg


def to_yaml(cfg: ExperimentConfig) -> str:
    """The resolved config as YAML; load_config(to_yaml(cfg)) gives back an equal config."""
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))


def save_config(cfg: ExperimentConfig, path: str | Path) -> None:
    Path(path).write_text(to_yaml(cfg))
