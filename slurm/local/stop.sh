#!/usr/bin/env bash
# Stop the local test cluster started by slurm/local/start.sh (same environment): cancel its
# jobs, then stop every slurmd, slurmctld and munged by the pid in its pid file. Idempotent.
# The state directory stays (logs for debugging); the next start clears the job state.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=slurm/local/common.sh
source "$here/common.sh"

# Stop the processes named by the pid files given: TERM to all at once, then KILL whatever is left
# after 15 s (one shared wait, not one per daemon).
stop_pids() {
    local pid_file pids=() pid i
    for pid_file in "$@"; do
        if alive "$pid_file"; then
            pids+=("$(cat "$pid_file")")
        fi
    done
    for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    for ((i = 0; i < 150; i++)); do
        local left=0
        for pid in "${pids[@]}"; do
            if kill -0 "$pid" 2>/dev/null; then left=1; fi
        done
        ((left)) || break
        sleep 0.1
    done
    for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
    rm -f "$@"
}

# Jobs' processes outlive slurmd: cancel them and wait (up to 10 s) while slurmd can still clean up.
cancel_jobs() {
    local i jobs
    alive "$CTLD_PID" || return 0
    export SLURM_CONF=$CONF
    jobs=$(squeue -h -o %A 2>/dev/null || true)
    if [[ -n $jobs ]]; then
        # shellcheck disable=SC2086  # one argument per job id
        scancel --quiet $jobs 2>/dev/null || true
    fi
    for ((i = 0; i < 20; i++)); do
        [[ -z $(squeue -h -t PENDING,RUNNING,SUSPENDED,COMPLETING -o %i 2>/dev/null) ]] && return 0
        sleep 0.5
    done
    log "jobs still listed after 10 s; stopping the daemons anyway"
}

[[ -d $STATE ]] || exit 0
cancel_jobs
shopt -s nullglob
stop_pids "$STATE"/run/slurmd-*.pid "$CTLD_PID"
stop_pids "$MUNGE_PID"  # last: the others authenticate through it while they stop
log "stopped (state kept in $STATE)"
