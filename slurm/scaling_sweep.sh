#!/usr/bin/env bash
# The paper's strong-scaling series (Figure 4): one experiment at several GPU counts, the batch size
# fixed, each point a separate heterogeneous job of AREAL_SWEEP_STEPS training steps.
#
# Usage, from the repository root:  slurm/scaling_sweep.sh MODEL CONTEXT [--dry-run]
#   MODEL    1.5b | 7b | 14b | 32b  (configs/experiments/math-1.5b, math-7b, code-14b, code-32b)
#   CONTEXT  longest sequence, prompt + generation: 16k, 32k or a number of tokens
#   --dry-run  render the job scripts and print the sbatch commands without submitting
# Environment:
#   AREAL_SWEEP_GPUS   GPU counts (default: 1.5b 32-512, 7b 64-512, 14b 128-512, 32b 256 512),
#                      each a multiple of 4 x gpus_per_node (a quarter of the nodes train)
#   AREAL_SWEEP_STEPS  training steps per point (default 20)
#   AREAL_SWEEP_DIR    the sweep's directory (default runs/scaling/MODEL-CONTEXT)
#   AREAL_HPC          the areal-hpc command (default .venv/bin/areal-hpc if present, else areal-hpc)
#   and whatever the job scripts read (AREAL_MPI, AREAL_CONTAINER_IMAGE, SBATCH_ACCOUNT, ...).
# Each point's directory, AREAL_SWEEP_DIR/gpusN, holds its rendered job.sh, point.json (model,
# context, GPUs, steps, job id), the job's output and the run's metrics.jsonl. When the jobs are
# done: .venv/bin/python benchmarks/scaling_report.py AREAL_SWEEP_DIR
set -euo pipefail

usage() { echo "usage: $0 1.5b|7b|14b|32b CONTEXT(16k|32k|tokens) [--dry-run]" >&2; exit 2; }
(($# == 2 || $# == 3)) || usage
model=$1 context=$2 dry_run=0
if (($# == 3)); then
    [[ $3 == --dry-run ]] || usage
    dry_run=1
fi
case $model in
    1.5b) config=configs/experiments/math-1.5b.yaml default_gpus="32 64 128 256 512" ;;
    7b) config=configs/experiments/math-7b.yaml default_gpus="64 128 256 512" ;;
    14b) config=configs/experiments/code-14b.yaml default_gpus="128 256 512" ;;
    32b) config=configs/experiments/code-32b.yaml default_gpus="256 512" ;;
    *) usage ;;
esac
if [[ -n ${AREAL_HPC:-} ]]; then
    read -r -a areal_hpc <<<"$AREAL_HPC"
elif [[ -x .venv/bin/areal-hpc ]]; then
    areal_hpc=(.venv/bin/areal-hpc)
else
    areal_hpc=(areal-hpc)
fi
read -r -a gpu_counts <<<"${AREAL_SWEEP_GPUS:-$default_gpus}"
steps=${AREAL_SWEEP_STEPS:-20}
sweep_dir=${AREAL_SWEEP_DIR:-runs/scaling/$model-$context}

# Render every point first, so that a layout that cannot work stops the sweep before any submission.
for gpus in "${gpu_counts[@]}"; do
    dir=$sweep_dir/gpus$gpus
    mkdir -p "$dir"
    "${areal_hpc[@]}" slurm scale "$config" "$gpus" --context "$context" --steps "$steps" \
        --run-dir "$dir" -o "$dir/job.sh"
done

for gpus in "${gpu_counts[@]}"; do
    dir=$sweep_dir/gpus$gpus
    submit=(sbatch --parsable "--output=$dir/slurm-%j.out" "$dir/job.sh")
    if ((dry_run)); then
        echo "${submit[*]}"
        job_json=null
    else
        job_id=$("${submit[@]}")
        job_id=${job_id%%;*}
        job_json=\"$job_id\"
        echo "submitted $gpus GPUs: job $job_id, $dir"
    fi
    printf '{"model": "%s", "context": "%s", "gpus": %d, "steps": %d, "job_id": %s}\n' \
        "$model" "$context" "$gpus" "$steps" "$job_json" >"$dir/point.json"
done
