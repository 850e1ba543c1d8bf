"""`areal-hpc slurm render`: the committed scripts are the rendering of their configs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from areal_hpc.cli import main
from areal_hpc.config.load import load_config
from areal_hpc.slurm.render import TEMPLATE, fill, render

SCRIPTS = {
    "slurm/train_1p5b.sh": "configs/experiments/math-1.5b.yaml",
    "slurm/train_7b.sh": "configs/experiments/math-7b.yaml",
    "slurm/train_14b_code.sh": "configs/experiments/code-14b.yaml",
    "slurm/train_32b.sh": "configs/experiments/code-32b.yaml",
}


def sbatch_sections(script: str) -> list[list[str]]:
    """The #SBATCH options of each het component (the first also holds the job-wide ones)."""
    sections: list[list[str]] = [[]]
    for line in script.splitlines():
        if line == "#SBATCH hetjob":
            sections.append([])
        elif line.startswith("#SBATCH "):
            sections[-1].append(line.removeprefix("#SBATCH "))
    return sections


@pytest.mark.parametrize("script,config", SCRIPTS.items())
def test_committed_script_equals_rendering(script: str, config: str) -> None:
    expected = render(load_config(config), config, script_path=script)
    assert Path(script).read_text() == expected, (
        f"{script} differs from its config; run: areal-hpc slurm render {config} -o {script}")


def test_32b_script_asks_for_the_paper_layout() -> None:
    text = Path("slurm/train_32b.sh").read_text()
    job, rollout = sbatch_sections(text)
    assert job == ["--job-name=code-32b", "--time=3-00:00:00", "--requeue", "--signal=B:USR1@300",
                   "--open-mode=append", "--output=%x-%j.out", "--partition=train", "--nodes=12",
                   "--ntasks=97", "--gpus-per-node=8", "--exclusive"]
    assert rollout == ["--partition=rollout", "--nodes=36", "--ntasks=72", "--gpus-per-node=8", "--exclusive"]
    assert "12 nodes x 8 GPUs = 96 GPUs" in text and "36 nodes x 8 GPUs = 288 GPUs" in text
    assert "96 trainer ranks (tp 8 x pp 2 x dp 6)" in text and "97 tasks, 9 on the first node" in text
    assert '"--mpi=${AREAL_MPI:-pmix}"' in text and "program=${AREAL_PROGRAM:-areal_hpc.launch}" in text


def test_cpu_profile_asks_for_no_gpus() -> None:
    text = render(load_config("configs/experiments/tiny-cpu.yaml"), "configs/experiments/tiny-cpu.yaml")
    job, rollout = sbatch_sections(text)
    assert job[-3:] == ["--partition=train", "--nodes=1", "--ntasks=2"]
    assert rollout == ["--partition=rollout", "--nodes=1", "--ntasks=1"]
    assert "gpus" not in " ".join(job + rollout) and '"--mpi=${AREAL_MPI:-pmi2}"' in text


def test_overrides_are_applied_and_passed_to_the_program(tmp_path: Path) -> None:
    out = tmp_path / "job.sh"
    args = ["slurm", "render", "configs/experiments/math-7b.yaml", "--set", "cluster.train_nodes=2",
            "--set", "trainer.dp=8", "--set", "logging.dir=runs/it's here", "-o", str(out)]
    assert main(args) == 0
    text = out.read_text()
    assert out.stat().st_mode & 0o111
    assert sbatch_sections(text)[0][-4:] == ["--nodes=2", "--ntasks=17", "--gpus-per-node=8", "--exclusive"]
    assert "settings=(--set cluster.train_nodes=2 --set trainer.dp=8 --set 'logging.dir=runs/it'\"'\"'s here')" in text


def test_template_placeholders_all_filled() -> None:
    text = render(load_config("configs/experiments/math-1.5b.yaml"), "x.yaml")
    assert not re.search(r"\{\{\w+\}\}", text)
    with pytest.raises(KeyError, match="config"):
        fill(TEMPLATE.read_text(), {})


def test_spare_nodes_add_a_component_of_warm_spares() -> None:
    """cluster.spare_nodes=1 at code-32b: a third component of one 8-GPU node, two spares of a
    tensor-parallel-4 engine, started as a step of their own with one engine's GPUs each."""
    cfg = load_config("configs/experiments/code-32b.yaml", ["cluster.spare_nodes=1"])
    text = render(cfg, "configs/experiments/code-32b.yaml", ["cluster.spare_nodes=1"])
    sections = sbatch_sections(text)
    assert len(sections) == 3
    assert sections[2] == ["--partition=rollout", "--nodes=1", "--ntasks=2", "--gpus-per-node=8", "--exclusive"]
    assert "component 2, partition rollout: 1 node, 2 warm spare generators" in text
    assert ("spare_args=(--het-group=2 --mpi=none --kill-on-bad-exit=0 --ntasks-per-node=2 --gpus-per-task=4)"
            in text)
    from areal_hpc.slurm.plan_report import describe

    assert ("component 2 (partition rollout): 1 node, 2 warm spare generators outside the MPI world, 8 GPUs"
            in describe(cfg))
    plain = render(load_config("configs/experiments/code-32b.yaml"), "configs/experiments/code-32b.yaml")
    assert len(sbatch_sections(plain)) == 2 and "spare_args=()" in plain


def test_spare_nodes_need_replacements() -> None:
    from areal_hpc.errors import ConfigError

    with pytest.raises(ConfigError, match="cluster.spare_nodes = 1: spares need rollout.max_replacements > 0"):
        load_config("configs/experiments/tiny-cpu.yaml", ["cluster.spare_nodes=1", "rollout.max_replacements=0"])
