"""What `areal-hpc eval` prints: a progress line while it generates, a table of summary.json at the end."""

from __future__ import annotations


def progress_line(done: int, total: int, tokens: int, elapsed_s: float) -> str:
    rate = tokens / elapsed_s if elapsed_s > 0 else 0.0
    return f"eval: {done}/{total} prompts done | {tokens} tokens | {rate:.0f} tok/s | {elapsed_s:.0f} s"


def _cell(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def table(summary: dict) -> str:
    """One line per data set and per data source in it (indented), a column per metric."""
    n = summary["sampling"]["n"]
    first = next(iter(summary["datasets"].values()), None)
    ks = list(first["pass@k"]) if first else []
    head = ["data set", "rows", f"avg@{n}", "stderr", *(f"pass@{k}" for k in ks), f"maj@{n}", "tokens"]
    lines = []

    def row(name: str, m: dict) -> None:
        lines.append([name, str(m["rows"]), _cell(m["avg@n"]), _cell(m["stderr"]),
                      *(_cell(m["pass@k"][k]) for k in ks), _cell(m["maj@n"]), f"{m['mean_response_tokens']:.0f}"])

    for name, m in summary["datasets"].items():
        row(name, m)
        for source, sm in m["by_source"].items():
            row(f"  {source}", sm)
    widths = [max(len(r[i]) for r in [head, *lines]) for i in range(len(head))]

    def line(cells: list[str]) -> str:
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True)))

    return "\n".join(line(r) for r in [head, *lines])
