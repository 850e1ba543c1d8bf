#!/usr/bin/env bash
# Start a real SLURM cluster on this machine from Debian's packages, for tests and trying the
# sbatch scripts: munged, slurmctld and AREAL_SLURM_NODES slurmd daemons as simulated nodes
# node1..nodeN, partitions `train` and `rollout` (both over all nodes), loopback addresses only.
# Needs root on Debian; installs the packages with apt-get when they are missing.
# Idempotent: daemons already running are left alone (it then says "already running").
# Settings: see slurm/local/common.sh.
# Prints the line to evaluate for the client commands: export SLURM_CONF=<state>/slurm.conf
# Stop with slurm/local/stop.sh (same environment). Measured facts: ../shared/notes/slurm-local.md
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=slurm/local/common.sh
source "$here/common.sh"

PACKAGES=(munge slurmctld slurmd slurm-client)

require_machine() {
    if [[ $(id -u) -ne 0 ]]; then
        log "needs root (starts daemons, installs packages)"; exit 3
    fi
    if [[ ! -f /etc/debian_version ]]; then
        log "needs Debian (uses Debian's slurm and munge packages)"; exit 3
    fi
    if ((NODES < 2)); then
        log "AREAL_SLURM_NODES=$NODES: a heterogeneous job needs at least 2 nodes"; exit 3
    fi
}

apt_install() {
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q -o DPkg::Lock::Timeout=300 \
        --no-install-recommends "$@" >&2
}

install_packages() {
    local missing=() p
    for p in "${PACKAGES[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
    done
    ((${#missing[@]})) || return 0
    log "installing ${missing[*]}"
    apt_install "${missing[@]}" || { apt-get update -q >&2 && apt_install "${missing[@]}"; }
}

# SLURM resolves the controller's and the nodes' host name: the short name must resolve.
ensure_hostname() {
    local host
    host=$(hostname -s)
    getent hosts "$host" >/dev/null || echo "127.0.0.1 $host" >>/etc/hosts
}

started=0

start_munge() {
    alive "$MUNGE_PID" && return 0
    started=$((started + 1))
    install -d -o munge -g munge -m 0755 "$MUNGE_DIR"
    if [[ ! -s $MUNGE_DIR/munge.key ]]; then
        runuser -u munge -- mungekey --create --keyfile="$MUNGE_DIR/munge.key"
    fi
    runuser -u munge -- /usr/sbin/munged --socket="$MUNGE_SOCKET" --key-file="$MUNGE_DIR/munge.key" \
        --pid-file="$MUNGE_PID" --log-file="$MUNGE_DIR/munged.log" --seed-file="$MUNGE_DIR/munged.seed"
}

write_config() {
    local host k
    host=$(hostname -s)
    mkdir -p "$STATE/run" "$STATE/log" "$STATE/ctld"
    {
        echo "# Written by slurm/local/start.sh; rewritten on every start with no daemon running."
        echo "ClusterName=areal-local"
        echo "SlurmctldHost=$host(127.0.0.1)"
        echo "SlurmctldPort=$CTLD_PORT"
        echo "AuthType=auth/munge"
        echo "CredType=cred/munge"
        # A requeued job waits cred_expire + 1 s before it may start again (default 120 s).
        echo "AuthInfo=socket=$MUNGE_SOCKET,cred_expire=10"
        echo "CommunicationParameters=NoCtldInAddrAny,NoInAddrAny"
        echo "SlurmUser=root"
        echo "SlurmdUser=root"
        echo "StateSaveLocation=$STATE/ctld"
        echo "SlurmdSpoolDir=$STATE/spool/%n"
        echo "SlurmctldPidFile=$CTLD_PID"
        echo "SlurmdPidFile=$STATE/run/slurmd-%n.pid"
        echo "SlurmctldLogFile=$STATE/log/slurmctld.log"
        echo "SlurmdLogFile=$STATE/log/slurmd-%n.log"
        echo "ProctrackType=proctrack/linuxproc"
        echo "TaskPlugin=task/none"
        echo "MpiDefault=none"
        echo "AccountingStorageType=accounting_storage/none"
        echo "JobAcctGatherType=jobacct_gather/none"
        echo "JobCompType=jobcomp/none"
        echo "SelectType=select/cons_tres"
        echo "SelectTypeParameters=CR_Core"
        echo "SchedulerType=sched/backfill"
        echo "SchedulerParameters=bf_interval=1,bf_resolution=1"
        echo "SlurmdParameters=config_overrides"
        echo "ReturnToService=2"
        echo "JobRequeue=1"
        echo "KillWait=5"
        echo "MinJobAge=600"
        echo "SlurmdTimeout=30"
        echo "InactiveLimit=0"
        echo "GresTypes=gpu"
        for ((k = 1; k <= NODES; k++)); do
            echo "NodeName=node$k NodeHostname=$host NodeAddr=127.0.0.1 Port=$((CTLD_PORT + k))" \
                "CPUs=$CPUS Gres=gpu:$GPUS State=UNKNOWN"
        done
        echo "PartitionName=train Nodes=node[1-$NODES] Default=YES MaxTime=INFINITE State=UP"
        echo "PartitionName=rollout Nodes=node[1-$NODES] MaxTime=INFINITE State=UP"
    } >"$CONF"
    # SLURM drops GPUs without device files: each simulated GPU is a null character device.
    mkdir -p "$STATE/dev"
    for ((k = 0; k < GPUS; k++)); do
        [[ -c $STATE/dev/gpu$k ]] || mknod "$STATE/dev/gpu$k" c 1 3
    done
    echo "NodeName=node[1-$NODES] Name=gpu File=$STATE/dev/gpu[0-$((GPUS - 1))]" >"$STATE/gres.conf"
}

any_slurm_daemon() {
    local n
    alive "$CTLD_PID" && return 0
    for n in $(node_names); do alive "$(slurmd_pid_file "$n")" && return 0; done
    return 1
}

start_slurm() {
    local n
    any_slurm_daemon || write_config
    if ! alive "$CTLD_PID"; then
        slurmctld -c -f "$CONF"
        started=$((started + 1))
    fi
    for n in $(node_names); do
        mkdir -p "$STATE/spool/$n"
        if ! alive "$(slurmd_pid_file "$n")"; then
            slurmd -N "$n" -f "$CONF"
            started=$((started + 1))
        fi
    done
}

# Wait until every node is idle (or running jobs) and the partitions answer.
wait_ready() {
    local deadline=$((SECONDS + 60)) states
    export SLURM_CONF=$CONF
    while ((SECONDS < deadline)); do
        states=$(sinfo -h -N -p train -o '%T' 2>/dev/null | sort -u | tr '\n' ' ' || true)
        if [[ -n $states && ! $states =~ (down|drain|inval|unknown|not_responding|fail) ]] \
            && [[ $(sinfo -h -N -p train -o '%N' 2>/dev/null | sort -u | wc -l) -eq $NODES ]]; then
            return 0
        fi
        sleep 0.5
    done
    log "nodes not ready after 60 s (states: ${states:-none}); logs in $STATE/log"
    exit 1
}

require_machine
install_packages
ensure_hostname
mkdir -p "$STATE"
start_munge
start_slurm
wait_ready
if ((started)); then
    log "up: $NODES nodes, partitions train and rollout; started $started daemons; state in $STATE"
else
    log "already running: $NODES nodes, partitions train and rollout; state in $STATE"
fi
echo "export SLURM_CONF=$CONF"
