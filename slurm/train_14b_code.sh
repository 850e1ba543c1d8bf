#!/usr/bin/env bash
# Rendered from areal_hpc/slurm/hetjob.sh.in by: areal-hpc slurm render configs/experiments/code-14b.yaml
# Do not edit: change the config or the template and render again.
#
# code-14b: one heterogeneous job, 32 nodes x 8 GPUs = 256 GPUs, one MPI world of 161 ranks.
#   component 0, partition train: 8 nodes x 8 GPUs = 64 GPUs
#     = 64 trainer ranks (tp 4 x pp 1 x dp 16), one GPU each,
#     + 1 controller (MPI rank 0, no GPU): 65 tasks, 9 on the first node.
#   component 1, partition rollout: 24 nodes x 8 GPUs = 192 GPUs
#     = 96 generator ranks (vLLM engines) x 2 GPUs (tensor parallel), 4 per node: 96 tasks.
#   Training : generation GPUs = 64 : 192.
#   `areal-hpc slurm plan` with the same config and options prints every rank's node and GPUs.
#
# Submit from the repository root: sbatch slurm/train_14b_code.sh [--set KEY=VALUE ...]
# (arguments after the script go to the program on every rank).
# Settable without editing this file:
#   partitions        sbatch --partition=TRAIN : --partition=ROLLOUT slurm/train_14b_code.sh
#                     (a plain --partition would apply to both components), or run the script
#                     directly, not through sbatch, and it submits itself with the partitions
#                     AREAL_TRAIN_PARTITION and AREAL_ROLLOUT_PARTITION, after checking the
#                     layout (`areal-hpc slurm verify`; AREAL_GPU names the GPU, default h800)
#   account, QOS, time limit: sbatch --account=A --qos=Q --time=T, or SBATCH_ACCOUNT, SBATCH_QOS,
#                     SBATCH_TIMELIMIT in the environment (these apply to both components)
#   AREAL_CONFIG      experiment config (default configs/experiments/code-14b.yaml)
#   AREAL_MPI         srun's MPI plugin: pmix or pmi2 (default pmix)
#   AREAL_CONTAINER_IMAGE, AREAL_CONTAINER_MOUNTS
#                     run every rank in this container (pyxis/enroot: --container-image,
#                     --container-mounts, comma-separated SRC:DST; the submit directory is
#                     mounted at its own path and stays the working directory)
#   AREAL_SRUN_ARGS   more srun options, split at spaces
#   AREAL_PYTHON      command that runs Python on the nodes, split at spaces (default:
#                     .venv/bin/python of the submit directory if present, else python3), e.g.
#                     "apptainer exec --nv areal.sif python3"
#   AREAL_PROGRAM     module every rank runs (default areal_hpc.launch)
#   AREAL_STOP_GRACE_S  seconds the run gets to end after the stop before the time limit
#                     (default 240; then the job is requeued all the same)
#   AREAL_MAX_RESTARTS  requeues after a crash (default 3, cluster.max_restarts)
#
# Resilience: --requeue lets SLURM requeue the job after a node failure or a preemption. 300 s
# before the time limit SLURM sends SIGUSR1 to this batch shell only (--signal=B:USR1@300), never
# to the ranks (their children, vLLM engines, would die of it). The shell then sends SIGTERM to the
# controller alone: MPI rank 0, global task 0 of the step, found with `scontrol listpids` (it runs
# on this node: srun's block distribution starts on the batch node). The controller writes a
# checkpoint at its next step boundary and stops every rank; when the step has ended (or
# AREAL_STOP_GRACE_S later) the shell requeues the job (scontrol requeue), and the next run resumes
# from the latest complete checkpoint (checkpoint.resume: auto). SLURM holds a requeued job for its
# credential lifetime (cred_expire, 120 s by default) before starting it again.
# A crash (the program fails with any status but 2, a refused launch: a rank died, hung or raised)
# requeues the job too, at most AREAL_MAX_RESTARTS times, counted across requeues in the job's
# SLURM comment (areal-crashes=N); the next run resumes from the latest complete checkpoint. The output file is appended to across restarts; SLURM_RESTART_COUNT counts them.
#
#SBATCH --job-name=code-14b
#SBATCH --time=3-00:00:00
#SBATCH --requeue
#SBATCH --signal=B:USR1@300
#SBATCH --open-mode=append
#SBATCH --output=%x-%j.out
#SBATCH --partition=train
#SBATCH --nodes=8
#SBATCH --ntasks=65
#SBATCH --gpus-per-node=8
#SBATCH --exclusive
#SBATCH hetjob
#SBATCH --partition=rollout
#SBATCH --nodes=24
#SBATCH --ntasks=96
#SBATCH --gpus-per-node=8
#SBATCH --exclusive
set -euo pipefail

config=${AREAL_CONFIG:-configs/experiments/code-14b.yaml}
program=${AREAL_PROGRAM:-areal_hpc.launch}
settings=()
if [[ -n ${AREAL_PYTHON:-} ]]; then
    read -r -a python <<<"$AREAL_PYTHON"
elif [[ -x .venv/bin/python ]]; then
    python=(.venv/bin/python)
else
    python=(python3)
fi

if [[ -z ${SLURM_JOB_ID:-} ]]; then
    # Run directly: the layout is checked at its true shapes here first (`areal-hpc slurm verify`,
    # no GPU; memory against an AREAL_GPU, default h800), then the script submits itself.
    "${python[@]}" -m areal_hpc.cli slurm verify "$config" "${settings[@]}" "$@" >&2
    exec sbatch --partition="${AREAL_TRAIN_PARTITION:-train}" : \
        --partition="${AREAL_ROLLOUT_PARTITION:-rollout}" "$0" "$@"
fi

# One step across both components: srun numbers component 0's tasks first, so MPI rank 0 (the
# controller) and the trainer ranks are component 0 and the generators follow. Block distribution
# without packing puts the controller beside the first node's trainers, as the plan says.
# GPUs: no --gpus-per-task or --gpu-bind (the controller shares component 0 and needs none), so
# every task sees all of its node's GPUs; a trainer takes cuda:<its GPU of the plan>, and a
# generator sets CUDA_VISIBLE_DEVICES to its engine's GPUs before vLLM starts, after checking
# that SLURM_LOCALID is its slot of the plan (`areal-hpc slurm plan --ranks` lists both).
# A task that dies does not end the step (--kill-on-bad-exit=0): rank 0 sees every rank's
# lifeline end, goes on without a lost generator (rollout.min_generators) and ends the job itself,
# through MPI_Abort, for any other lost rank.
srun_args=("--het-group=0,1" "--mpi=${AREAL_MPI:-pmix}" --kill-on-bad-exit=0 "--distribution=block,NoPack")
container_args=()
if [[ -n ${AREAL_CONTAINER_IMAGE:-} ]]; then
    # The ranks run the submit directory's checkout: it is mounted where it is outside.
    container_args+=("--container-image=$AREAL_CONTAINER_IMAGE" "--container-workdir=$PWD"
        "--container-mounts=$PWD:$PWD${AREAL_CONTAINER_MOUNTS:+,$AREAL_CONTAINER_MOUNTS}")
elif [[ -n ${AREAL_CONTAINER_MOUNTS:-} ]]; then
    container_args+=("--container-mounts=$AREAL_CONTAINER_MOUNTS")
fi
read -r -a extra_srun_args <<<"${AREAL_SRUN_ARGS:-}"
# Warm spares (cluster.spare_nodes: none here): component 2 runs a step of spare generators
# outside the MPI world. Each waits for this run's rank 0 (its join file names AREAL_RUN_ID), loads
# its engine and waits; when a generator is lost, rank 0 offers its rank to a spare, which joins
# the next weight update (rollout.max_replacements). Spares not needed leave when the run ends;
# the job's end or requeue ends any still starting.
export AREAL_RUN_ID="$SLURM_JOB_ID.${SLURM_RESTART_COUNT:-0}"
spare_args=()

# GPU and NCCL settings; values already in the environment win.
# Megatron's tensor-parallel communication overlap needs kernels queued in issue order.
export CUDA_DEVICE_MAX_CONNECTIONS=${CUDA_DEVICE_MAX_CONNECTIONS:-1}
# A failed or timed-out NCCL collective aborts the rank (and the step) instead of hanging
# until the time limit.
export TORCH_NCCL_ASYNC_ERROR_HANDLING=${TORCH_NCCL_ASYNC_ERROR_HANDLING:-1}
export NCCL_DEBUG=${NCCL_DEBUG:-WARN}
# Variable-length packed batches fragment the CUDA caching allocator less with expandable segments.
export PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}
# Many ranks share a node's cores; each rank's thread pools stay small unless set otherwise.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
# MPI is the control plane only: MPICH's GPU support off, so that MPI_Init initialises no CUDA
# before a generator has narrowed CUDA_VISIBLE_DEVICES to its GPUs.
export MPIR_CVAR_ENABLE_GPU=${MPIR_CVAR_ENABLE_GPU:-0}
# Compile caches (vLLM's torch.compile artifacts, Inductor's and Triton's kernels) on node-local
# storage: otherwise every engine of the job compiles into one shared home directory. A requeued
# job keeps its id: on a node it ran on before, it finds the caches warm.
cache_dir=${TMPDIR:-/tmp}/areal-$SLURM_JOB_ID
export VLLM_CACHE_ROOT=${VLLM_CACHE_ROOT:-$cache_dir/vllm}
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-$cache_dir/inductor}
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-$cache_dir/triton}
# The interface between the nodes is the config's cluster.network_interface (e.g. --set
# cluster.network_interface=ib0): every rank publishes its address and sets GLOO_SOCKET_IFNAME and
# NCCL_SOCKET_IFNAME to it at start; null: the address and gloo's interface are those of the
# route to rank 0's node, and NCCL keeps its own choice.
# Site-specific, set them in the environment when needed: NCCL_IB_HCA (InfiniBand/RoCE adapters
# to use), NCCL_IB_GID_INDEX (RoCE v2, often 3), NCCL_NET_GDR_LEVEL (GPUDirect RDMA distance).

stop_requested=0
trap 'stop_requested=1; echo "areal-hpc: SIGUSR1, the time limit is near: stopping the run for a requeue"' USR1
# Seconds the run gets to end after the stop request; then the job is requeued all the same (its
# checkpoint is written first), so that a shutdown stuck in teardown cannot reach the time limit.
stop_grace=${AREAL_STOP_GRACE_S:-240}

# MPICH names a node's shared-memory segments after the MPI job (mpich_shm_<H>_<node> and
# mpich_vci_<H>_<node>, H = 32-bit FNV-1a of the PMI job id, "JOB.STEP" under pmi2), and ranks
# killed by a signal leave them behind. A requeued job keeps its job id and numbers its steps from
# 0 again, so its ranks would attach to the dead run's segments and hang or read garbage. Step 0
# removes every segment named for the program's step on every node of the job, the program runs as
# step 1, and a last step frees what a killed program left (tmpfs memory is the node's RAM).
fnv1a() {
    local s=$1 h=2166136261 i c
    for ((i = 0; i < ${#s}; i++)); do
        printf -v c '%d' "'${s:i:1}"
        h=$(((h ^ c) * 16777619 & 0xFFFFFFFF))
    done
    printf '%x' "$h"
}
remove_mpi_shm() {
    local pmi_job h c n paths=() tasks=()
    for pmi_job in "$SLURM_JOB_ID.1" "slurm.pmix.$SLURM_JOB_ID.1"; do # pmi2, pmix
        h=$(fnv1a "$pmi_job")
        paths+=("/dev/shm/mpich_shm_${h}_*" "/dev/shm/mpich_vci_${h}_*")
    done
    for c in 0 1; do # one task on each node of each component
        n=SLURM_JOB_NUM_NODES_HET_GROUP_$c
        ((c == 0)) || tasks+=(:)
        tasks+=("--het-group=$c" "--nodes=${!n}" "--ntasks=${!n}" bash -c 'rm -f $*' _ "${paths[@]}")
    done
    srun --mpi=none "${tasks[@]}" ||
        echo "areal-hpc: warning: could not remove MPI shared memory (${paths[*]}) on the job's nodes"
}
remove_mpi_shm

# Rank 0 (on this node) writes its exit status here: srun's also carries that of a generator that
# was lost and survived, which would make a completed run look like a crash.
AREAL_EXIT_FILE=$(mktemp "${TMPDIR:-/tmp}/areal-exit.XXXXXX")
export AREAL_EXIT_FILE
echo "areal-hpc: job $SLURM_JOB_ID, restart ${SLURM_RESTART_COUNT:-0}: ${python[*]} -m $program $config ${settings[*]} $*"
srun "${srun_args[@]}" "${container_args[@]}" "${extra_srun_args[@]}" "${python[@]}" -m "$program" "$config" \
    "${settings[@]}" "$@" &
step=$!
if ((${#spare_args[@]})); then
    srun "${spare_args[@]}" "${container_args[@]}" "${extra_srun_args[@]}" "${python[@]}" -m areal_hpc.launch --spare \
        "$config" "${settings[@]}" "$@" &
fi
delivered=0
while kill -0 "$step" 2>/dev/null; do
    if ((stop_requested && !delivered)); then
        # Global task 0 of the program's srun step on this node: columns PID JOBID STEPID LOCALID GLOBALID.
        controller=$({ scontrol listpids "$SLURM_JOB_ID" 2>/dev/null || true; } \
            | awk '$3 ~ /^[0-9]+$/ && $5 == "0" {print $1; exit}')
        if [[ -n $controller ]] && kill -TERM "$controller"; then
            delivered=1
            stop_deadline=$((SECONDS + stop_grace))
            echo "areal-hpc: asked the controller (pid $controller) for a checkpoint and a stop"
        fi
    elif ((delivered && SECONDS > stop_deadline)); then
        echo "areal-hpc: the run has not ended $stop_grace s after the stop request"
        break
    fi
    sleep 1
done
rc=0
if kill -0 "$step" 2>/dev/null; then
    rc=1
else
    wait "$step" || rc=$?
    if [[ -s $AREAL_EXIT_FILE ]]; then
        rc=$(<"$AREAL_EXIT_FILE")
    fi
    remove_mpi_shm
fi
rm -f "$AREAL_EXIT_FILE"
if ((delivered)); then
    echo "areal-hpc: stopped before the time limit (exit $rc): requeueing job $SLURM_JOB_ID"
    scontrol requeue "$SLURM_JOB_ID"
elif ((rc != 0 && rc != 2)); then
    crashes=$(scontrol -o show job "$SLURM_JOB_ID" 2>/dev/null | grep -o 'Comment=areal-crashes=[0-9]*' | head -n 1 |
        cut -d= -f3 || true)
    crashes=${crashes:-0}
    max_restarts=${AREAL_MAX_RESTARTS:-3}
    if ((crashes < max_restarts)); then
        scontrol update JobId="$SLURM_JOB_ID" Comment="areal-crashes=$((crashes + 1))"
        echo "areal-hpc: the run failed (exit $rc): requeueing job $SLURM_JOB_ID (crash restart $((crashes + 1)) of $max_restarts)"
        scontrol requeue "$SLURM_JOB_ID"
    else
        echo "areal-hpc: the run failed (exit $rc) after $crashes crash restarts (AREAL_MAX_RESTARTS = $max_restarts): not requeued"
    fi
fi
exit "$rc"
