"""One evaluation of a checkpoint: load and render each data set as training does, sample every
prompt n times on the engine pool, score each sample with the training reward service as it
finishes, and write the responses, summary.json and the printed table.

A multi-node evaluation runs one shard per node (`shard` = (index, count): the kept rows whose
position modulo count is index); each writes its responses and a shard file, and `merge`
computes the summary from all of them. A single run is shard (0, 1) and merges itself.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from areal_hpc.config.schema import ExperimentConfig
from areal_hpc.data.chat import load_tokenizer, render
from areal_hpc.data.prompts import load_prompts
from areal_hpc.errors import UserError
from areal_hpc.evaluation import responses
from areal_hpc.evaluation.engine_pool import EnginePool, plan_engines, visible_gpus
from areal_hpc.evaluation.engine_process import Finished, Prompt
from areal_hpc.evaluation.metrics import summarize_dataset
from areal_hpc.evaluation.presets import Sampling
from areal_hpc.evaluation.report import progress_line, table
from areal_hpc.evaluation.responses import Response
from areal_hpc.metrics.library_logs import quiet_libraries
from areal_hpc.reward.math_answer import extract_answer
from areal_hpc.reward.references import references
from areal_hpc.reward.task import Reference, kind_of
from areal_hpc.rollout.generator import device_of
from areal_hpc.wire.messages import SamplingParams

SUMMARY = "summary.json"
# Seconds between progress lines.
PROGRESS_S = 5.0


@dataclass(frozen=True)
class EvalJob:
    """What `areal-hpc eval` was asked to do."""

    model: Path
    data: list[Path]
    sampling: Sampling
    out: Path
    # Engines (None: one per GPU or tensor-parallel group; one on CPU).
    engines: int | None = None
    shard: tuple[int, int] = (0, 1)


@dataclass
class EvalSet:
    """One data set's prompts of this shard, ready to sample and score."""

    name: str
    # 0-based rows of the file, and per row its token ids, reward reference, kind and source.
    rows: list[int]
    ids: list
    refs: list[Reference]
    kinds: list[str]
    sources: list[str | None]


def dataset_names(paths: list[Path]) -> list[str]:
    """Each data file's stem, which names its entry in summary.json; two alike are an error."""
    names = [p.stem if p.is_file() else p.name for p in paths]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise UserError(f"--data: several files are named {', '.join(twice)}; summary.json names data sets"
                        " by file stem, so rename one")
    return names


def prompt_seed(seed: int, dataset: str, row: int) -> int:
    """The sampling seed of one prompt: the same whichever engine or shard samples it."""
    return random.Random(f"eval/{seed}/{dataset}/{row}").randrange(2**31)


def _shard_file(shard: tuple[int, int]) -> str:
    return f"shard-{shard[0]}-of-{shard[1]}.json"


def prepare(cfg: ExperimentConfig, job: EvalJob, tokenizer) -> list[EvalSet]:
    """Every data set loaded, rendered and its references built as for training; rows longer than
    rollout.max_prompt_len are left out (and said so), references that cannot score refuse it."""
    index, count = job.shard
    sets = []
    for name, path in zip(dataset_names(job.data), job.data, strict=True):
        what = str(path)
        rows = load_prompts(path, cfg.data)
        rendered = render(rows, tokenizer, cfg.data, cfg.rollout.max_prompt_len, what)
        for reason, numbers in rendered.filtered.items():
            print(f"eval: {what}: {len(numbers)} of {len(rows)} rows left out, {reason}: rows"
                  f" {', '.join(map(str, numbers[:10]))}{' ...' if len(numbers) > 10 else ''}", file=sys.stderr)
        refs = references(rows, cfg.reward, what)
        mine = [(row, ids) for pos, (row, ids) in enumerate(zip(rendered.kept, rendered.ids, strict=True))
                if pos % count == index]
        sets.append(EvalSet(
            name, [r for r, _ in mine], [ids for _, ids in mine], [refs[r] for r, _ in mine],
            [kind_of(rows[r].data_source, cfg.reward) for r, _ in mine], [rows[r].data_source for r, _ in mine],
        ))
    return sets


def _prompts(sets: list[EvalSet], s: Sampling) -> list[Prompt]:
    """One Prompt per (set, row); its key is its position in this list."""
    out = []
    for es in sets:
        for row, ids in zip(es.rows, es.ids, strict=True):
            sampling = SamplingParams(s.max_new_tokens, s.temperature, s.top_p, -1, prompt_seed(s.seed, es.name, row))
            out.append(Prompt(len(out), ids, s.n, sampling))
    return out


async def _sample_and_score(cfg: ExperimentConfig, job: EvalJob, sets: list[EvalSet], tokenizer,
                            slots) -> dict[str, list[Response]]:
    from areal_hpc.reward.pool import RewardPool

    prompts = _prompts(sets, job.sampling)
    where = [(es, i) for es in sets for i in range(len(es.rows))]  # prompt key -> (set, position)
    out: dict[str, list[Response]] = {es.name: [] for es in sets}
    fallbacks = cfg.reward.math_fallbacks

    async def score(f: Finished, pool) -> None:
        es, i = where[f.key]
        text = tokenizer.decode(f.output_ids.tolist(), skip_special_tokens=True)
        verdict = await pool.score(es.refs[i].task(text))
        answer = extract_answer(text, fallbacks).answer if es.kinds[i] == "math" else None
        out[es.name].append(Response(
            es.rows[i], f.sample, es.sources[i], es.kinds[i], text, answer, verdict.reward,
            verdict.correct, verdict.reason, len(f.output_ids), f.finish_reason,
        ))

    left = {p.key: p.n for p in prompts}
    tokens = 0
    async with RewardPool(cfg.reward) as pool, EnginePool(cfg, str(job.model), slots) as engines:
        print(f"eval: {len(prompts)} prompts x {job.sampling.n} samples on {len(slots)} engine(s)", file=sys.stderr)
        start = last = time.monotonic()
        tasks = []
        async for f in engines.samples(prompts):
            tasks.append(asyncio.get_running_loop().create_task(score(f, pool)))
            tokens += len(f.output_ids)
            left[f.key] -= 1
            if left[f.key] == 0:
                del left[f.key]
            now = time.monotonic()
            if now - last >= PROGRESS_S or not left:
                last = now
                print(progress_line(len(prompts) - len(left), len(prompts), tokens, now - start),
                      file=sys.stderr, flush=True)
        await asyncio.gather(*tasks)
    return out


def summary_of(model: str, sampling: dict, by_set: dict[str, list[Response]], wall_s: float) -> dict:
    """summary.json: the metrics of each data set (and of each data_source within it)."""
    n = int(sampling["n"])
    datasets = {name: summarize_dataset([r.sample_of() for r in rs], n) for name, rs in by_set.items() if rs}
    return {"model": model, "sampling": sampling, "datasets": datasets, "wall_s": wall_s}


def evaluate(job: EvalJob, cfg: ExperimentConfig) -> dict | None:
    """Run the job; the summary (also written to OUT/summary.json and printed), or None for one
    shard of several (then `merge` makes it)."""
    start = time.monotonic()
    cfg = dataclasses.replace(cfg, seed=job.sampling.seed)
    if cfg.logging.level != "DEBUG":
        quiet_libraries()  # before the engines start: their processes read VLLM_LOGGING_LEVEL
    tokenizer = load_tokenizer(cfg.model.tokenizer_path or job.model)
    sets = prepare(cfg, job, tokenizer)
    device = device_of(cfg)
    tp = cfg.generator.tensor_parallel_size
    slots = plan_engines(device, job.engines, tp, visible_gpus() if device == "cuda" else [])
    job.out.mkdir(parents=True, exist_ok=True)
    by_set = asyncio.run(_sample_and_score(cfg, job, sets, tokenizer, slots))
    for name, rs in by_set.items():
        responses.write(job.out / responses.file_name(name, job.shard), rs)
    wall_s = time.monotonic() - start
    if job.shard[1] > 1:
        meta = {"model": str(job.model), "sampling": job.sampling.to_json(), "datasets": list(by_set), "wall_s": wall_s}
        (job.out / _shard_file(job.shard)).write_text(json.dumps(meta, indent=1) + "\n")
        return None
    return _finish(job.out, summary_of(str(job.model), job.sampling.to_json(), by_set, wall_s))


def _finish(out: Path, summary: dict) -> dict:
    (out / SUMMARY).write_text(json.dumps(summary, indent=1) + "\n")
    print(table(summary))
    return summary


def merge(out: Path) -> dict:
    """summary.json and the responses of all shards of a multi-node evaluation in `out`; every
    shard must be there and agree on the model and the sampling."""
    metas = sorted(out.glob("shard-*-of-*.json"))
    if not metas:
        raise UserError(f"{out}: no shard-I-of-N.json files (nothing to merge)")
    loaded = [json.loads(p.read_text()) for p in metas]
    count = int(metas[0].stem.rsplit("-", 1)[1])
    want = {_shard_file((i, count)) for i in range(count)}
    missing = sorted(want - {p.name for p in metas})
    if missing:
        raise UserError(f"{out}: shards missing: {', '.join(missing)} (did every node finish?)")
    first = loaded[0]
    for p, meta in zip(metas, loaded, strict=True):
        if (meta["model"], meta["sampling"], meta["datasets"]) != (first["model"], first["sampling"], first["datasets"]):
            raise UserError(f"{p}: a different model, sampling or data sets than {metas[0]}")
    by_set: dict[str, list[Response]] = {}
    for name in first["datasets"]:
        rs = [r for i in range(count) for r in responses.read(out / responses.file_name(name, (i, count)))]
        responses.write(out / responses.file_name(name), rs)
        by_set[name] = rs
    return _finish(out, summary_of(first["model"], first["sampling"], by_set, max(m["wall_s"] for m in loaded)))
