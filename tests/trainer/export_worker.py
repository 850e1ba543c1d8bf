"""Trainer ranks that write checkpoints for the offline export tests (tests/trainer/test_dist_to_hf.py).

    python -m torch.distributed.run --nproc-per-node 2 tests/trainer/export_worker.py checkpoints OUT MODEL TIED

Scenario `checkpoints` (2 ranks): for tp=2 (MODEL) and pp=2 with tied embeddings (TIED), one PPO
step from the tiny model, then the step directory a run's checkpoint with checkpoint.hf_interval
writes: trainer/ (megatron dist checkpoint) and hf/ (TrainEngine.export_hf) by the trainer ranks,
config.yaml, tokenizer/ and COMPLETE as the controller writes them. tp=2 also saves each rank's
vocabulary half of the logits on a prompt.
"""

from __future__ import annotations

import os
import sys
import traceback
from pathlib import Path

import torch
import torch.distributed as dist
from trainer_worker import TIED, config, step, trajectories, with_behaviour

from areal_hpc.config.load import save_config
from areal_hpc.controller import checkpoint as ck
from areal_hpc.trainer.engine import TrainEngine
from areal_hpc.trainer.hf_checkpoint import write_tokenizer
from areal_hpc.trainer.parallel import init_trainer_world

LAYOUTS = {"tp2": (2, 1, ()), "pp2tied": (1, 2, (TIED,))}
PROMPT = torch.tensor([list(range(7, 107, 3))])


def checkpoints(out: Path, model_dir: str, tied_dir: str) -> dict:
    result = {}
    for name, (tp, pp, extra) in LAYOUTS.items():
        cfg = config(tp, pp, 1, *extra)
        source = Path(tied_dir if TIED in extra else model_dir)
        init_trainer_world(cfg, int(os.environ["RANK"]), 2, "env://")
        engine = TrainEngine(cfg)
        engine.load_hf(source)
        step(engine, with_behaviour(engine, trajectories(), 0))
        path = out / f"export-{name}" / "step-00000001"
        engine.save_checkpoint(ck.trainer_dir(path))
        engine.export_hf(ck.hf_dir(path), source_dir=source)
        if dist.get_rank() == 0:
            save_config(cfg, ck.config_file(path))
            write_tokenizer(ck.tokenizer_dir(path), source, source)
            ck.mark_complete(path)
        if tp == 2:
            with torch.no_grad():
                result[f"{name}_logits"] = engine.model(PROMPT, None, None)[0].clone()
        result[f"{name}_dir"] = path
        dist.barrier()
        del engine
    result["prompt"] = PROMPT
    return result


def main() -> None:
    scenario, out, model_dir, tied_dir = sys.argv[1], Path(sys.argv[2]), sys.argv[3], sys.argv[4]
    rank = int(os.environ.get("RANK", "0"))
    try:
        result = {"checkpoints": checkpoints}[scenario](out, model_dir, tied_dir)
    except Exception:
        result = {"error": traceback.format_exc()}
    torch.save(result, out / f"{scenario}-rank{rank}.pt")
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
