"""Load an experiment config: YAML files, `base:` includes, dotted overrides, typed defaults.

OmegaConf structured configs do the typed merge; this module adds what users need on top of it:
unknown keys reported with the closest valid name, and every failure as a ConfigError.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, get_type_hints

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from areal_hpc.config.hf import FAMILIES, config_key, disagreements, read_hf_config, shape_from_hf
from areal_hpc.config.schema import ExperimentConfig, ModelConfig
from areal_hpc.config.validate import validate
from areal_hpc.errors import ConfigError

# A YAML file may list other YAML files (paths relative to itself) to merge underneath it, so an
# experiment can take its model shape from configs/models/.
BASE_KEY = "base"


def _read_yaml(path: Path) -> dict:
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping, not {type(data).__name__}")
    return data


def _deep_merge(low: dict, high: dict) -> dict:
    out = dict(low)
    for k, v in high.items():
        out[k] = _deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _read_with_bases(path: Path, seen: tuple[Path, ...] = ()) -> dict:
    path = path.resolve()
    if path in seen:
        raise ConfigError(f"{path}: includes itself through '{BASE_KEY}'")
    data = _read_yaml(path)
    bases = data.pop(BASE_KEY, [])
    if isinstance(bases, str):
        bases = [bases]
    if not isinstance(bases, list):
        raise ConfigError(f"{path}: '{BASE_KEY}' must be a list of YAML paths")
    merged: dict = {}
    for base in bases:
        merged = _deep_merge(merged, _read_with_bases(path.parent / str(base), seen + (path,)))
    return _deep_merge(merged, data)


def _section_type(cls: type, name: str) -> type | None:
    """The dataclass type of field `name` of `cls`, or None for a leaf field."""
    hint = get_type_hints(cls)[name]
    return hint if dataclasses.is_dataclass(hint) else None


def check_keys(data: Any, cls: type = ExperimentConfig, prefix: str = "", source: str = "") -> None:
    """Reject keys the schema does not define, naming the closest valid key."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}{prefix.rstrip('.') or 'config'}: expected a mapping, got {data!r}")
    names = [f.name for f in dataclasses.fields(cls)]
    for key, value in data.items():
        full = f"{prefix}{key}"
        if key not in names:
            close = difflib.get_close_matches(str(key), names, n=1, cutoff=0.5)
            hint = f"; did you mean '{prefix}{close[0]}'?" if close else f"; valid keys: {', '.join(names)}"
            raise ConfigError(f"{source}unknown key '{full}'{hint}")
        sub = _section_type(cls, key)
        if sub is not None and value is not None:
            check_keys(value, sub, f"{full}.", source)


def parse_overrides(overrides: Iterable[str]) -> dict:
    """`a.b=value` strings to a nested dict; values are parsed as YAML scalars."""
    out: dict = {}
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override '{item}' is not of the form key=value (e.g. ppo.clip_eps=0.1)")
        key, raw = item.split("=", 1)
        try:
            value = yaml.safe_load(raw) if raw != "" else ""
        except yaml.YAMLError:
            value = raw
        node = out
        parts = key.strip().split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    return out


def _typed(data: dict, source: str) -> ExperimentConfig:
    try:
        schema = OmegaConf.structured(ExperimentConfig)
        merged = OmegaConf.merge(schema, OmegaConf.create(data))
        return OmegaConf.to_object(merged)
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", None) or "config"
        reason = str(e).splitlines()[0]
        raise ConfigError(f"{source}{key}: {reason}") from None


def fill_model_shape(model: ModelConfig) -> ModelConfig:
    """The shape fields left null, from model.path's config.json (when it has one; the file
    checks name a missing one), then qkv_bias and qk_norm from the family. A field set in the
    YAML that disagrees with config.json is an error naming both values and the file."""
    file = Path(model.path) / "config.json" if model.path is not None else None
    if file is not None and file.is_file():
        shape = shape_from_hf(read_hf_config(model.path), file)
        conflicts = disagreements(model, shape, only_set=True)
        if conflicts:
            raise ConfigError("; ".join(
                f"model.{field} = {ours!r} disagrees with {file}: {config_key(field)} = {theirs!r}"
                for field, ours, theirs in conflicts))
        model = dataclasses.replace(model, **{f: v for f, v in shape.items() if getattr(model, f) is None})
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
    """Read, merge, type and validate a config; raises ConfigError naming the first problem."""
    data: dict = {}
    source = ""
    if path is not None:
        data = _read_with_bases(Path(path))
        source = f"{path}: "
        check_keys(data, source=source)
    extra = parse_overrides(overrides)
    check_keys(extra, source="--set: ")
    cfg = _typed(_deep_merge(data, extra), source)
    try:
        cfg.model = fill_model_shape(cfg.model)
    except ConfigError as e:
        raise ConfigError(f"{source}{e}") from None
    problems = validate(cfg, check_files=check_files)
    if problems:
        raise ConfigError(source + ("\n" + " " * len(source)).join(problems))
    return cfg


def to_yaml(cfg: ExperimentConfig) -> str:
    """The resolved config as YAML; load_config(to_yaml(cfg)) gives back an equal config."""
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))


def save_config(cfg: ExperimentConfig, path: str | Path) -> None:
    Path(path).write_text(to_yaml(cfg))
