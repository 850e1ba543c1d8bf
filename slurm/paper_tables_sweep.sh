#!/usr/bin/env bash
# The paper's accuracy tables at full scale: every training run of Table 1 or Table 2 as its own
# heterogeneous job, each followed by an evaluation job of its final model (slurm/eval.sh, started
# only when the training job has completed: --dependency=afterok).
#
# Usage, from the repository root:  slurm/paper_tables_sweep.sh table1|table2 [--dry-run]
#   table1   synchronous (eta 0) and asynchronous (the config's eta) RL with the same steps, for
#            each model of AREAL_TABLE1_MODELS (default 1.5b; any of 1.5b 7b 14b 32b), plus an
#            evaluation of the base model when AREAL_BASE_MODEL names its directory
#   table2   the 1.5B model with generation capped at 8,192 tokens, eta 0 1 2 4 8 16 and unbounded,
#            each with and without the decoupled objective (eta 0 once: the two coincide there);
#            unbounded is eta = total_steps, a bound no run can reach
#   --dry-run  render the job scripts and print the sbatch commands without submitting
# Environment:
#   AREAL_SWEEP_SET    overrides for every run, split at spaces, e.g.
#                      "model.path=/models/r1-1.5b data.train_path=/data/math.parquet"
#   AREAL_EVAL_DATA    evaluation data, comma-separated files (default data/aime24.parquet)
#   AREAL_EVAL_PRESET  `areal-hpc eval` preset (default aime: avg@32, 32k tokens, T 0.6, top-p 0.95)
#   AREAL_BASE_MODEL   table1: the base model's directory (of the first model of
#                      AREAL_TABLE1_MODELS), evaluated once as its "base" column
#   AREAL_SWEEP_STEPS  training steps per run (default: the config's total_steps)
#   AREAL_SWEEP_DIR    the sweep's directory (default runs/paper-TABLE)
#   AREAL_HPC          the areal-hpc command (default .venv/bin/areal-hpc if present, else areal-hpc)
#   and whatever the job scripts read (AREAL_MPI, AREAL_CONTAINER_IMAGE, SBATCH_ACCOUNT, ...).
# Each run's directory, AREAL_SWEEP_DIR/NAME, holds its rendered job.sh, run.json (table, model,
# run, eta, decoupled, steps, job ids), the run's metrics.jsonl and checkpoints (the last one with
# its Hugging Face export, step-N/hf) and eval/ (summary.json of `areal-hpc eval`). When the jobs
# are done: .venv/bin/python benchmarks/paper_tables_report.py AREAL_SWEEP_DIR
set -euo pipefail

usage() { echo "usage: $0 table1|table2 [--dry-run]" >&2; exit 2; }
(($# == 1 || $# == 2)) || usage
table=$1 dry_run=0
if (($# == 2)); then
    [[ $2 == --dry-run ]] || usage
    dry_run=1
fi
[[ $table == table1 || $table == table2 ]] || usage
if [[ -n ${AREAL_HPC:-} ]]; then
    read -r -a areal_hpc <<<"$AREAL_HPC"
elif [[ -x .venv/bin/areal-hpc ]]; then
    areal_hpc=(.venv/bin/areal-hpc)
else
    areal_hpc=(areal-hpc)
fi
read -r -a common_set <<<"${AREAL_SWEEP_SET:-}"
eval_data=${AREAL_EVAL_DATA:-data/aime24.parquet}
eval_preset=${AREAL_EVAL_PRESET:-aime}
sweep_dir=${AREAL_SWEEP_DIR:-runs/paper-$table}

config_of() {
    case $1 in
        1.5b) echo configs/experiments/math-1.5b.yaml ;;
        7b) echo configs/experiments/math-7b.yaml ;;
        14b) echo configs/experiments/code-14b.yaml ;;
        32b) echo configs/experiments/code-32b.yaml ;;
        *) echo "$0: unknown model '$1' in AREAL_TABLE1_MODELS (use 1.5b 7b 14b 32b)" >&2; exit 2 ;;
    esac
}

# One value of the resolved config, e.g. `setting CONFIG rollout.eta`.
setting() {
    "${areal_hpc[@]}" config get "$1" "$2" "${common_set[@]/#/--set=}"
}

# The runs: NAME MODEL RUN ETA DECOUPLED, one per line; eta "config" keeps the config's.
runs=()
if [[ $table == table1 ]]; then
    read -r -a models <<<"${AREAL_TABLE1_MODELS:-1.5b}"
    for model in "${models[@]}"; do
        config_of "$model" >/dev/null
        runs+=("$model-sync $model sync 0 true" "$model-async $model async config true")
    done
else
    runs+=("eta0 1.5b eta0 0 true")
    for eta in 1 2 4 8 16 inf; do
        runs+=("eta$eta-standard 1.5b eta$eta $eta false" "eta$eta-decoupled 1.5b eta$eta $eta true")
    done
fi

# Render every run first, so that a config that cannot work stops the sweep before any submission.
for spec in "${runs[@]}"; do
    read -r name model run eta decoupled <<<"$spec"
    config=$(config_of "$model")
    dir=$sweep_dir/$name
    mkdir -p "$dir"
    steps=${AREAL_SWEEP_STEPS:-$(setting "$config" total_steps)}
    sets=("${common_set[@]}" "total_steps=$steps" "logging.dir=$dir" "ppo.decoupled=$decoupled"
        "checkpoint.hf_interval=$steps")
    case $eta in
        config) eta=$(setting "$config" rollout.eta) ;;
        inf) eta=$steps ;;
    esac
    sets+=("rollout.eta=$eta")
    if [[ $table == table2 ]]; then
        sets+=("rollout.max_new_tokens=8192")
    fi
    "${areal_hpc[@]}" slurm render "$config" "${sets[@]/#/--set=}" -o "$dir/job.sh"
    printf '{"table": "%s", "model": "%s", "run": "%s", "eta": %d, "decoupled": %s, "steps": %d}\n' \
        "$table" "$model" "$run" "$eta" "$decoupled" "$steps" >"$dir/run.json"
done

submit() { # prints the job id, or the command on a dry run
    if ((dry_run)); then
        echo "$*" >&2
        echo null
    else
        local id
        id=$("$@")
        echo "\"${id%%;*}\""
    fi
}

evaluate() { # MODEL_DIR OUT_DIR [DEPENDENCY]
    local dependency=()
    [[ -z ${3:-} || $3 == null ]] || dependency=("--dependency=afterok:${3//\"/}")
    submit sbatch --parsable "${dependency[@]}" "--output=$2/slurm-%j.out" slurm/eval.sh \
        "$1" "$eval_data" "$2" --preset "$eval_preset"
}

for spec in "${runs[@]}"; do
    read -r name _ <<<"$spec"
    dir=$sweep_dir/$name
    steps=$(grep -o '"steps": [0-9]*' "$dir/run.json" | grep -o '[0-9]*$')
    mkdir -p "$dir/eval"
    job=$(submit sbatch --parsable "--output=$dir/slurm-%j.out" "$dir/job.sh")
    final=$dir/checkpoints/$(printf 'step-%08d' "$steps")/hf
    eval_job=$(evaluate "$final" "$dir/eval" "$job")
    sed -i "s/}\$/, \"job_id\": $job, \"eval_job_id\": $eval_job}/" "$dir/run.json"
    ((dry_run)) || echo "submitted $name: job ${job//\"/}, then its evaluation ${eval_job//\"/}; $dir"
done

if [[ $table == table1 && -n ${AREAL_BASE_MODEL:-} ]]; then
    model=${models[0]}
    dir=$sweep_dir/$model-base
    mkdir -p "$dir/eval"
    eval_job=$(evaluate "$AREAL_BASE_MODEL" "$dir/eval")
    printf '{"table": "table1", "model": "%s", "run": "base", "job_id": null, "eval_job_id": %s}\n' \
        "$model" "$eval_job" >"$dir/run.json"
fi
