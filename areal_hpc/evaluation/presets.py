"""Sampling protocols of evaluation: the named presets and how command-line flags override them."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from areal_hpc.errors import UserError


@dataclass(frozen=True)
class Sampling:
    """How every prompt of an evaluation is sampled (summary.json's "sampling")."""

    # Samples per prompt.
    n: int
    temperature: float
    top_p: float
    # Most generated tokens per sample.
    max_new_tokens: int
    # Seed of every prompt's samples (with the data set and the prompt's row).
    seed: int

    def to_json(self) -> dict:
        return asdict(self)


# Named protocols; a flag given explicitly overrides its preset's value.
PRESETS: dict[str, dict[str, int | float]] = {
    # The paper's AIME protocol (AReaL, Table 2): 32 samples, temperature 0.6, top-p 0.95, 32k tokens.
    "aime": {"n": 32, "temperature": 0.6, "top_p": 0.95, "max_new_tokens": 32768},
}

_FLAGS = {"n": "--n", "temperature": "--temperature", "top_p": "--top-p", "max_new_tokens": "--max-new-tokens"}


def resolve(preset: str | None, given: dict[str, int | float | None], seed: int) -> Sampling:
    """The preset's values with the flags given (not None) on top; raises UserError for an unknown
    preset, a value neither gives, or one out of range."""
    if preset is not None and preset not in PRESETS:
        raise UserError(f"--preset {preset!r}: unknown (presets: {', '.join(sorted(PRESETS))})")
    values = {**(PRESETS[preset] if preset else {}), **{k: v for k, v in given.items() if v is not None}}
    missing = [flag for key, flag in _FLAGS.items() if key not in values]
    if missing:
        raise UserError(f"missing {', '.join(missing)} (or a --preset that sets them: {', '.join(sorted(PRESETS))})")
    s = Sampling(int(values["n"]), float(values["temperature"]), float(values["top_p"]),
                 int(values["max_new_tokens"]), seed)
    if s.n < 1:
        raise UserError(f"--n {s.n}: must be at least 1")
    if s.temperature < 0:
        raise UserError(f"--temperature {s.temperature}: must be >= 0 (0 is greedy)")
    if not 0 < s.top_p <= 1:
        raise UserError(f"--top-p {s.top_p}: must be in (0, 1]")
    if s.max_new_tokens < 1:
        raise UserError(f"--max-new-tokens {s.max_new_tokens}: must be at least 1")
    return s
