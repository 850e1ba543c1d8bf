"""`areal-hpc data check FILE --config CFG`: a data set as a launch with that config would read it.

For users bringing their own data: the row count, the first prompt exactly as the model will see
it (chat template applied), prompt lengths in tokens, the rows that would be left out and why,
and the reward kind of each data source. The reward references are built as at launch, so a row
that would refuse the launch is named here (exit 2) before any job is queued.
"""

from __future__ import annotations

import argparse
from collections import Counter

import numpy as np

from areal_hpc.config.load import load_config
from areal_hpc.config.schema import RewardConfig
from areal_hpc.data.chat import keep_fitting, left_out, lengths_of, load_tokenizer, prompt_texts, token_ids
from areal_hpc.data.prompts import load_prompts
from areal_hpc.errors import UserError
from areal_hpc.prompt_row import PromptRow
from areal_hpc.reward.references import references
from areal_hpc.reward.task import kind_of

# Characters of the first prompt shown (a whole book as a prompt is not printed).
FIRST_CHARS = 20_000
# What a row without a data_source is called in the reward kinds.
NO_SOURCE = "(no data_source)"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("data", help="inspect a prompt data set as a run would read it")
    cmds = p.add_subparsers(dest="data_cmd", required=True)
    check = cmds.add_parser("check", help="rows, the first rendered prompt, prompt lengths, left-out rows,"
                                          " reward kinds; exit 2 naming the rows a launch would refuse")
    check.add_argument("file", help="a .jsonl, .json or .parquet file, a directory of shards or a datasets directory")
    check.add_argument("--config", required=True, help="experiment config (its data, rollout, reward and model)")
    check.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                       help="dotted override, e.g. --set data.layout=verl (repeatable)")
    check.add_argument("--tokenizer", help="tokenizer directory (default: model.tokenizer_path, else model.path)")
    check.set_defaults(func=_check)


def length_stats(lengths: list[int]) -> str:
    q = np.percentile(lengths, [50, 95], method="nearest")
    return f"min {min(lengths)}, median {int(q[0])}, p95 {int(q[1])}, max {max(lengths)}"


def reward_kinds(rows: list[PromptRow], reward: RewardConfig) -> list[str]:
    """One line per data source, most rows first: its row count and the reward kind that scores it."""
    counts = Counter(row.data_source for row in rows)
    return [f"{source or NO_SOURCE}: {n} rows, {kind_of(source, reward)}" for source, n in counts.most_common()]


def _check(args: argparse.Namespace) -> int:
    cfg = load_config(args.config, args.overrides, check_files=False)
    tokenizer_dir = args.tokenizer or cfg.model.tokenizer_path or cfg.model.path
    if tokenizer_dir is None:
        raise UserError("no tokenizer to render and count the prompts with: pass --tokenizer DIR, or set"
                        " model.tokenizer_path or model.path in the config")
    data, max_len, what = cfg.data, cfg.rollout.max_prompt_len, args.file
    rows = load_prompts(args.file, data)
    prompt_key, answer_key = data.row_keys()
    print(f"{what}: {len(rows)} rows (layout {data.layout}: prompt '{prompt_key}', answer '{answer_key}')")
    tokenizer = load_tokenizer(tokenizer_dir)
    texts = prompt_texts(rows, tokenizer, data, what)
    lengths = lengths_of(token_ids(texts, tokenizer, max_len))
    first = f"{len(texts[0])} characters" if lengths[0] is None else f"{lengths[0]} tokens"
    print(f"first prompt (row 1, {first}), as the model sees it:\n{texts[0][:FIRST_CHARS]}"
          f"{' ...' if len(texts[0]) > FIRST_CHARS else ''}\n--- end of prompt")
    tokenized = [n for n in lengths if n is not None]
    print(f"prompt tokens: {length_stats(tokenized) if tokenized else 'none tokenized'}"
          f"{'' if len(tokenized) == len(lengths) else f' ({len(lengths) - len(tokenized)} too long to tokenize)'}")
    kept, filtered = keep_fitting(lengths, max_len, data, what)
    print(left_out(what, len(rows), filtered) if filtered
          else f"none left out: every prompt fits in rollout.max_prompt_len = {max_len}")
    print("reward kinds (reward.by_source, else reward.kind):")
    for line in reward_kinds(rows, cfg.reward):
        print(f"  {line}")
    references(rows, cfg.reward, what)
    print(f"reward references: all {len(rows)} usable; {len(kept)} of {len(rows)} rows kept")
    return 0
