"""Render the heterogeneous-job sbatch script of an experiment from the template hetjob.sh.in.

The committed slurm/train_*.sh scripts are this rendering of the paper configs (a test compares
them), so a script cannot drift from its config: node counts, tasks and GPUs come from the rank
plan, the time limit, partitions and MPI plugin from the config's `cluster` section.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from pathlib import Path

from areal_hpc.config.schema import ExperimentConfig
from areal_hpc.slurm.hetjob import Component, components, spare_component
from areal_hpc.slurm.plan_report import count

TEMPLATE = Path(__file__).with_name("hetjob.sh.in")
PLACEHOLDER = re.compile(r"\{\{(\w+)\}\}")


def _sbatch_lines(c: Component) -> str:
    lines = [f"--partition={c.partition}", f"--nodes={c.nodes}", f"--ntasks={c.tasks}"]
    if c.gpus_per_node:
        # Whole nodes: every GPU of a node belongs to this job, its CPUs to the reward pools.
        lines += [f"--gpus-per-node={c.gpus_per_node}", "--exclusive"]
    return "\n".join(f"#SBATCH {line}" for line in lines)


def _spare_srun_args(cfg: ExperimentConfig, spares: Component) -> list[str]:
    """srun options of the spares' step: every task of component 2, each with one engine's GPUs."""
    args = ["--het-group=2", "--mpi=none", "--kill-on-bad-exit=0", f"--ntasks-per-node={spares.tasks_per_node[0]}"]
    if spares.gpus_per_node:
        args.append(f"--gpus-per-task={cfg.generator.tensor_parallel_size}")
    return args


def arithmetic(cfg: ExperimentConfig) -> str:
    """The header's comment lines: how the nodes, GPUs and ranks of each component add up."""
    train, rollout = components(cfg)
    t, g = cfg.trainer, cfg.generator
    trainers = f"{count(cfg.trainer_world, 'trainer rank')} (tp {t.tp} x pp {t.pp} x dp {t.dp})"
    first = f", {train.tasks_per_node[0]} on the first node" if train.nodes > 1 else ""
    spares = spare_component(cfg)
    spare_line = (f"\n#   component 2, partition {spares.partition}: {count(spares.nodes, 'node')},"
                  f" {count(spares.tasks, 'warm spare generator')} (cluster.spare_nodes; outside the MPI world)"
                  if spares else "")
    if not train.gpus_per_node:
        return "\n".join([
            f"# {cfg.name}: CPU profile (device: cpu), no GPUs; one MPI world of {cfg.world_size} ranks,"
            " each component on one node.",
            f"#   component 0, partition {train.partition}: {count(train.tasks, 'task')} = 1 controller"
            " (MPI rank 0)",
            f"#     + {trainers}",
            f"#   component 1, partition {rollout.partition}: {count(rollout.tasks, 'task')} ="
            f" {count(g.count, 'generator rank')} (vLLM engines)",
        ]) + spare_line
    gpn = train.gpus_per_node
    return "\n".join([
        f"# {cfg.name}: one heterogeneous job, {train.nodes + rollout.nodes} nodes x {gpn} GPUs ="
        f" {train.gpus + rollout.gpus} GPUs, one MPI world of {cfg.world_size} ranks.",
        f"#   component 0, partition {train.partition}: {count(train.nodes, 'node')} x {gpn} GPUs ="
        f" {train.gpus} GPUs",
        f"#     = {trainers}, one GPU each,",
        f"#     + 1 controller (MPI rank 0, no GPU): {train.tasks} tasks{first}.",
        f"#   component 1, partition {rollout.partition}: {count(rollout.nodes, 'node')} x {gpn} GPUs ="
        f" {rollout.gpus} GPUs",
        f"#     = {count(g.count, 'generator rank')} (vLLM engines) x {count(g.tensor_parallel_size, 'GPU')}"
        f" (tensor parallel), {gpn // g.tensor_parallel_size} per node: {count(rollout.tasks, 'task')}.",
        f"#   Training : generation GPUs = {train.gpus} : {rollout.gpus}.",
    ]) + spare_line


def fill(template: str, values: dict[str, str]) -> str:
    """Replace every {{name}}; a placeholder without a value is a bug in the template."""
    missing = sorted(set(PLACEHOLDER.findall(template)) - values.keys())
    if missing:
        raise KeyError(f"template placeholders without a value: {', '.join(missing)}")
    return PLACEHOLDER.sub(lambda m: values[m.group(1)], template)


def render(cfg: ExperimentConfig, config_path: str, overrides: Sequence[str] = (),
           script_path: str | None = None) -> str:
    """The sbatch script that runs `config_path` (as the script will name it) with `overrides`.

    `overrides` (KEY=VALUE, already applied to `cfg`) are baked into the script and passed to the
    program as --set options; `script_path` is how the header names the script itself.
    """
    train, rollout = components(cfg)
    spares = spare_component(cfg)
    settings = [arg for item in overrides for arg in ("--set", item)]
    values = {
        "config": config_path,
        "settings_note": "".join(f" \\\n#     --set {shlex.quote(o)}" for o in overrides),
        "arithmetic": arithmetic(cfg),
        "script": script_path or "SCRIPT",
        "mpi": cfg.cluster.mpi,
        "max_restarts": str(cfg.cluster.max_restarts),
        "name": cfg.name,
        "time_limit": cfg.cluster.time_limit,
        "component0": _sbatch_lines(train),
        "component1": _sbatch_lines(rollout),
        "train_partition": train.partition,
        "rollout_partition": rollout.partition,
        "settings": " ".join(shlex.quote(a) for a in settings),
        "component2": f"\n#SBATCH hetjob\n{_sbatch_lines(spares)}" if spares else "",
        "spare_note": f": {count(spares.tasks, 'spare')} here" if spares else ": none here",
        "spare_srun_args": " ".join(_spare_srun_args(cfg, spares)) if spares else "",
    }
    return fill(TEMPLATE.read_text(), values)
