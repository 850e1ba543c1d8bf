# Shared settings of slurm/local/start.sh and stop.sh (sourced, not run).
# shellcheck shell=bash disable=SC2034  # the variables are used by the scripts sourcing this file
#
# Everything lives in one state directory outside the repository, chosen by the caller:
#   AREAL_SLURM_STATE  state directory (default /tmp/areal-hpc-slurm): config, logs, pid files,
#                      spool, the munge key and socket
#   AREAL_SLURM_NODES  simulated nodes node1..nodeN, one slurmd each (default 4, at least 2:
#                      a heterogeneous job needs two nodes)
#   AREAL_SLURM_CPUS   CPUs each simulated node claims (default 8; more than the machine has is fine)
#   AREAL_SLURM_GPUS   GPUs each simulated node claims (default 4): a `gpu` GRES whose device files
#                      are null devices, so GPU job scripts are scheduled and placed for real
#   AREAL_SLURM_PORT   slurmctld's port; slurmd K listens on PORT+K (default 16817)

STATE=${AREAL_SLURM_STATE:-/tmp/areal-hpc-slurm}
NODES=${AREAL_SLURM_NODES:-4}
CPUS=${AREAL_SLURM_CPUS:-8}
GPUS=${AREAL_SLURM_GPUS:-4}
CTLD_PORT=${AREAL_SLURM_PORT:-16817}

CONF=$STATE/slurm.conf
MUNGE_DIR=$STATE/munge
MUNGE_SOCKET=$MUNGE_DIR/munge.socket
MUNGE_PID=$MUNGE_DIR/munged.pid
CTLD_PID=$STATE/run/slurmctld.pid

# The pid file of simulated node $1 (node1, node2, ...).
slurmd_pid_file() { echo "$STATE/run/slurmd-$1.pid"; }

node_names() {
    local k
    for ((k = 1; k <= NODES; k++)); do echo "node$k"; done
}

# True when pid file $1 names a running process.
alive() { [[ -s $1 ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

log() { echo "slurm/local: $*" >&2; }
