"""Rank 0's live view: a progress bar on a terminal, one summary line per step otherwise."""

from __future__ import annotations

import sys
from typing import TextIO


def summary_line(step: int, total: int, m: dict[str, float]) -> str:
    """One line that says how the run is going."""
    parts = [f"step {step}/{total}"]
    for key, label, fmt in (
        ("reward_mean", "reward", "{:+.2f}"),
        ("accuracy", "acc", "{:.2f}"),
        ("effective_tokens_per_s", "eff tok/s", "{:.0f}"),
        ("generated_tokens_per_s", "gen tok/s", "{:.0f}"),
        ("staleness_max", "stale<=", "{:.0f}"),
        ("buffer_groups", "buffer", "{:.0f}"),
        ("weight_sync_s", "sync s", "{:.2f}"),
        ("elapsed_s", "t", "{:.0f}s"),
    ):
        if key in m:
            parts.append(f"{label} {fmt.format(m[key])}")
    return " | ".join(parts)


class Progress:
    """`speaker` starts every line, as the log format names each rank ("[rank 0 controller]")."""

    def __init__(self, total: int, start: int = 0, enabled: bool = True, stream: TextIO | None = None,
                 speaker: str = "[rank 0 controller]") -> None:
        self.total = total
        self.enabled = enabled
        self.stream = stream or sys.stderr
        self.speaker = speaker
        self._bar = None
        if enabled and self.stream.isatty():
            from tqdm import tqdm

            self._bar = tqdm(total=total, initial=start, file=self.stream, unit="step", dynamic_ncols=True,
                             desc=speaker)

    def update(self, step: int, metrics: dict[str, float]) -> None:
        if not self.enabled:
            return
        line = summary_line(step, self.total, metrics)
        if self._bar is None:
            print(f"{self.speaker} {line}", file=self.stream, flush=True)
            return
        self._bar.update(step - self._bar.n)
        self._bar.set_postfix_str(line.split(" | ", 1)[-1])

    def note(self, text: str) -> None:
        """A message that should not break the bar."""
        if self._bar is not None:
            self._bar.write(f"{self.speaker} {text}", file=self.stream)
        else:
            print(f"{self.speaker} {text}", file=self.stream, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
