"""Data as users bring it, for the data tests and the end-to-end run: verl's parquet rows and a
small chat template with plain-text role markers."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

# `enable_thinking: false` (data.chat_template_kwargs) changes the ending, so a test can see that
# the kwargs reach the template.
TEMPLATE = (
    "{% for m in messages %}{{ m['role'] | upper }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}ASSISTANT:"
    "{% if enable_thinking is defined and not enable_thinking %} /no_think{% endif %}{% endif %}"
)


def verl_row(i: int, question: str, answer: str, source: str = "openai/gsm8k", system: bool = False) -> dict:
    """One row as verl's data preprocessing scripts write it."""
    prompt = [{"role": "user", "content": question}]
    if system:
        prompt.insert(0, {"role": "system", "content": "Put the answer in \\boxed{}."})
    return {"data_source": source, "prompt": prompt, "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": answer},
            "extra_info": {"split": "train", "index": i}}


def write_verl(path: Path, rows: list[dict]) -> Path:
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path
