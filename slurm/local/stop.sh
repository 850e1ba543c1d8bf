#!/usr/bin/env bash
# Stop the local test cluster started by slurm/local/start.sh (same environment): cancel its
# jobs, then stop every slurmd, slurmctld and munged by the pid in its pid file. Idempotent.
# The state directory stays (logs for debugging); the next start clears the job state.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=slurm/local/common.sh
source "$here/common.sh"

# Stop the process named by pid file $1: TERM, then KILL after 15 s.
stop_pid() {
    local pid_file=$1 pid i
    if alive "$pid_file"; then
        pid=$(cat "$pid_file")
        kill -TERM "$pid" 2>/dev/null || true
        for ((i = 0; i < 150; i++)); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        if kill -0 "$pid" 2>/dev/null; then
            kill -KILL "$pid" 2>/dev/null || true
        fi
    fi
    rm -f "$pid_file"
}

# Jobs' processes outlive slurmd: cancel them and wait (up to 30 s) while slurmd can still clean up.
cancel_jobs() {
    local i jobs
    alive "$CTLD_PID" || return 0
    export SLURM_CONF=$CONF
    jobs=$(squeue -h -o %A 2>/dev/null || true)
    if [[ -n $jobs ]]; then
        # shellcheck disable=SC2086  # one argument per job id
        scancel --quiet $jobs 2>/dev/null || true
    fi
    for ((i = 0; i < 60; i++)); do
        [[ -z $(squeue -h -t PENDING,RUNNING,SUSPENDED,COMPLETING -o %i 2>/dev/null) ]] && return 0
        sleep 0.5
    done
    log "jobs still listed after 30 s; stopping the daemons anyway"
}

[[ -d $STATE ]] || exit 0
cancel_jobs
for pid_file in "$STATE"/run/slurmd-*.pid; do stop_pid "$pid_file"; done
stop_pid "$CTLD_PID"
stop_pid "$MUNGE_PID"
log "stopped (state kept in $STATE)"
