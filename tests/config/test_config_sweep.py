"""Bad values swept over the whole config schema, every key of it: wrong types and extreme values
given as `--set` overrides of a valid config. Each is refused as one ConfigError whose lines name
the keys (the command's exit 2), never a traceback, or (an extreme value a key can take) accepted.
"""

from __future__ import annotations

import dataclasses
import types
from typing import Any, Union, get_args, get_origin, get_type_hints

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from areal_hpc.cli import main
from areal_hpc.config import load_config
from areal_hpc.config.schema import ExperimentConfig
from areal_hpc.errors import ConfigError

BASE = "configs/experiments/tiny-cpu.yaml"


def leaves(cls: type = ExperimentConfig, prefix: str = "") -> list[tuple[str, Any]]:
    """Every settable key of the schema with its type, sections walked."""
    out = []
    hints = get_type_hints(cls)
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        if dataclasses.is_dataclass(hint):
            out += leaves(hint, f"{prefix}{f.name}.")
        else:
            out.append((f"{prefix}{f.name}", hint))
    return out


LEAVES = leaves()


def _kinds(hint: Any) -> set[type]:
    """The plain kinds a key takes: int, float, bool, str, list, dict (None left out)."""
    if get_origin(hint) in (Union, types.UnionType):
        return set().union(*(_kinds(a) for a in get_args(hint) if a is not type(None)))
    return {get_origin(hint) or hint}


def wrong_values(hint: Any) -> list[str]:
    """YAML texts of values of a kind the key never takes."""
    kinds = _kinds(hint)
    out = []
    if dict not in kinds:
        out.append("{x: 1}")
    if list not in kinds:
        out.append("[1, 2]")
    if str not in kinds:
        out.append("not-a-value")
    return out


# Values at and beyond the edges of every kind (as YAML): zero, negative, beyond int64 and float64
# ranges, infinities and NaN, the empty string and a long one, an empty and a long list.
EXTREMES = ["0", "-1", "9223372036854775808", "-9223372036854775809", "1.0e+308", "-1.0e+308", ".inf", "-.inf",
            ".nan", "''", "x" * 300, "[]", "[" + ", ".join(["1"] * 2000) + "]", "true"]


def named(message: str, keys: list[str]) -> bool:
    return all(k in message for k in keys)


def problem_lines(message: str) -> list[str]:
    lines = message.splitlines()
    return [line.strip() for line in lines[1:]] if len(lines) > 1 and "problems in the config" in lines[0] else lines


def test_the_sweep_covers_every_key() -> None:
    assert len(LEAVES) > 100
    assert all(wrong_values(hint) for _, hint in LEAVES), [k for k, h in LEAVES if not wrong_values(h)]


def test_every_key_given_a_wrong_type_at_once_is_named_in_one_error(capsys) -> None:
    """One pass: each of the schema's keys with a value of the wrong kind, all reported."""
    overrides = [f"{key}={wrong_values(hint)[0]}" for key, hint in LEAVES]
    with pytest.raises(ConfigError) as e:
        load_config(BASE, overrides, check_files=False)
    message = str(e.value)
    missing = [key for key, _ in LEAVES if f"{key}: expected" not in message]
    assert missing == [], message
    argv = ["config", "check", BASE] + [a for o in overrides for a in ("--set", o)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "Traceback" not in err


@settings(max_examples=20, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(LEAVES), min_size=1, max_size=6, unique=True), st.data())
def test_wrong_types_are_each_named_with_their_source(keys, data) -> None:
    overrides = [f"{key}={data.draw(st.sampled_from(wrong_values(hint)))}" for key, hint in keys]
    with pytest.raises(ConfigError) as e:
        load_config(BASE, overrides, check_files=False)
    message = str(e.value)
    assert all(f"{key}: expected" in message for key, _ in keys), (overrides, message)
    assert all(line.endswith("(from --set)") or "(from --set" in line for line in problem_lines(message)), message


@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from([k for k, _ in LEAVES]), st.sampled_from(EXTREMES)), min_size=1,
                max_size=4, unique_by=lambda pair: pair[0]))
def test_extreme_values_are_taken_or_refused_by_name(pairs) -> None:
    """Whatever the values, load_config returns a config or raises ConfigError, and every line of
    the error names one of the keys set (the base config alone is valid)."""
    keys = [k for k, _ in pairs]
    try:
        load_config(BASE, [f"{k}={v}" for k, v in pairs], check_files=False)
    except ConfigError as e:
        for line in problem_lines(str(e)):
            assert any(k in line for k in keys) or "(from --set)" in line, (pairs, str(e))


@pytest.mark.parametrize("override, line", [
    # a key the file also sets, given a mapping by --set: blamed on --set, not on the file
    ("name={x: 1}", "name: expected a string, got {'x': 1} (from --set)"),
    # a mapping for a list key (OmegaConf raised a bare TypeError)
    ("reward.math_fallbacks={x: 1}", "reward.math_fallbacks: expected a list of strings, got {'x': 1} (from --set)"),
    # an unknown family (was reported as qkv_bias and qk_norm unset, which default to the family's)
    ("model.family=0", "model.family = '0': must be one of"),
    # a shape value out of range (the family's head_dim check divided by it)
    ("model.num_attention_heads=0", "model.num_attention_heads = 0: must be >= 1 (from --set)"),
    # a wrong-typed family (left unset, it was reported as qkv_bias and qk_norm unset as well)
    ("model.family=[]", "model.family: expected a string or null, got [] (from --set)"),
    # paths the file system cannot look up (pathlib's is_file raised)
    ("model.path=" + "x" * 300, "model.path = '" + "x" * 300 + "': File name too long (from --set)"),
    ("data.train_path=" + "y" * 300, "data.train_path = '" + "y" * 300 + "': File name too long (from --set)"),
])
def test_holes_the_sweep_found_are_named(override: str, line: str) -> None:
    with pytest.raises(ConfigError) as e:
        load_config(BASE, [override])
    assert line in str(e.value), str(e.value)
