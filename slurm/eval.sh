#!/usr/bin/env bash
# Evaluate a checkpoint with `areal-hpc eval` on one or more GPU nodes: one task per node, each
# running one vLLM engine per GPU (or per generator.tensor_parallel_size GPUs, from --config or
# --set) on its shard of the prompts (--shard NODE/NODES); with several nodes `areal-hpc eval-merge`
# then writes OUT/summary.json and OUT/NAME.responses.jsonl from the shards.
#
# Usage, from the repository root:
#   sbatch [--nodes=N] [--partition=P] slurm/eval.sh MODEL_DIR DATA[,DATA...] OUT_DIR [EVAL OPTIONS ...]
#   e.g. sbatch --nodes=2 slurm/eval.sh /ckpt/step-200 aime24.jsonl,aime25.jsonl runs/eval/step-200 --preset aime
# EVAL OPTIONS are `areal-hpc eval`'s (--preset, --n, --temperature, --top-p, --max-new-tokens,
# --seed, --config, --set KEY=VALUE); bf16 weights are the default here (--set generator.dtype=...
# overrides it). Settable without editing this file:
#   account, QOS, time limit, GPUs per node: sbatch --account=A --qos=Q --time=T --gpus-per-node=G
#   AREAL_CONTAINER_IMAGE, AREAL_CONTAINER_MOUNTS
#                     run every task in this container (pyxis/enroot; the working directory stays
#                     the submit directory)
#   AREAL_SRUN_ARGS   more srun options, split at spaces
#   AREAL_PYTHON      command that runs Python on the nodes, split at spaces (default:
#                     .venv/bin/python of the submit directory if present, else python3)
#   AREAL_DRY_RUN=1   print the commands instead of running them
#
#SBATCH --job-name=areal-eval
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --exclusive
#SBATCH --time=12:00:00
#SBATCH --output=%x-%j.out
set -euo pipefail

usage() {
    echo "usage: sbatch [--nodes=N] $0 MODEL_DIR DATA[,DATA...] OUT_DIR [areal-hpc eval options ...]" >&2
    exit 2
}
(($# >= 3)) || usage
model=$1 data=$2 out=$3
shift 3
[[ -n $model && -n $data && -n $out ]] || usage

if [[ -n ${AREAL_PYTHON:-} ]]; then
    read -r -a python <<<"$AREAL_PYTHON"
elif [[ -x .venv/bin/python ]]; then
    python=(.venv/bin/python)
else
    python=(python3)
fi
nodes=${SLURM_JOB_NUM_NODES:-1}

srun_args=("--nodes=$nodes" "--ntasks=$nodes" --ntasks-per-node=1 --kill-on-bad-exit=1)
if [[ -n ${AREAL_CONTAINER_IMAGE:-} ]]; then
    srun_args+=("--container-image=$AREAL_CONTAINER_IMAGE" "--container-workdir=$PWD")
fi
if [[ -n ${AREAL_CONTAINER_MOUNTS:-} ]]; then
    srun_args+=("--container-mounts=$AREAL_CONTAINER_MOUNTS")
fi
read -r -a extra_srun_args <<<"${AREAL_SRUN_ARGS:-}"

eval_cmd=("${python[@]}" -m areal_hpc.cli eval --model "$model" --data "$data" --out "$out"
    --set generator.dtype=bf16 "$@")
# Each task evaluates the shard of its SLURM_PROCID, read on the node.
# shellcheck disable=SC2016  # expanded by the task's shell, not this one
shard='exec "$@" --shard "$SLURM_PROCID/$SLURM_NTASKS"'
step=(srun "${srun_args[@]}" "${extra_srun_args[@]}" bash -c "$shard" bash "${eval_cmd[@]}")
merge=("${python[@]}" -m areal_hpc.cli eval-merge --out "$out")

run() {
    if [[ ${AREAL_DRY_RUN:-0} == 1 ]]; then
        printf '%q ' "$@"
        echo
    else
        "$@"
    fi
}
run "${step[@]}"
if ((nodes > 1)); then
    run "${merge[@]}"
fi
