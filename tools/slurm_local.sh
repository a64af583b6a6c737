#!/usr/bin/env bash
# A real single-node Slurm cluster on 127.0.0.1 for tests (Debian packages, runs as root).
#
#   tools/slurm_local.sh start [DIR]   install if needed, start munged/slurmctld/slurmd; prints SLURM_CONF
#   tools/slurm_local.sh stop  [DIR]   stop the daemons this script started from DIR
#   tools/slurm_local.sh install       only install the Debian packages (before a test run: no test skips for want of scontrol)
#
# DIR (default /tmp/eigtrain-slurm) holds slurm.conf, state, spool, logs and pid files.
# Idempotent: `start` on a running cluster only prints its SLURM_CONF. Use it with
#   export SLURM_CONF=$(tools/slurm_local.sh start | tail -n1)
set -euo pipefail

cmd=${1:-start}
dir=$(realpath -m "${2:-/tmp/eigtrain-slurm}")
conf="$dir/slurm.conf"
host=$(hostname -s)
log() { echo "[slurm_local] $*" >&2; }

install_packages() {
  if command -v sbatch >/dev/null && command -v slurmctld >/dev/null && command -v slurmd >/dev/null \
      && command -v munged >/dev/null; then
    return
  fi
  command -v apt-get >/dev/null || { log "sbatch missing and apt-get unavailable"; exit 3; }
  log "installing slurmctld slurmd slurm-client munge with apt-get"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2
  apt-get install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge >&2
}

start_munge() {
  # munged must run first: every Slurm RPC is authenticated through it.
  if [ -S /run/munge/munge.socket.2 ] && munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
    return
  fi
  mkdir -p /etc/munge /run/munge /var/lib/munge /var/log/munge
  if [ ! -s /etc/munge/munge.key ]; then
    mungekey --create --keyfile=/etc/munge/munge.key
  fi
  chown -R munge:munge /etc/munge /run/munge /var/lib/munge /var/log/munge
  chmod 0700 /etc/munge
  chmod 0400 /etc/munge/munge.key
  runuser -u munge -- munged
  touch "$dir/munged.ours"  # so that `stop` stops it too
  for _ in $(seq 50); do munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && return; sleep 0.1; done
  log "munged did not come up"; exit 1
}

write_conf() {
  mkdir -p "$dir/state" "$dir/spool" "$dir/log"
  # the machine's CPUs: GNU nproc would otherwise answer OMP_NUM_THREADS (a job asking 2 CPUs never starts)
  local cpus; cpus=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)
  # the node's memory (MB), as a real site declares it, so that jobs may ask for --mem / --mem-per-cpu
  local mem_mb; mem_mb=$(awk '/MemTotal/ {print int($2 / 1024)}' /proc/meminfo)
  # linuxproc/task none: no cgroups needed (containers). JobRequeue=1: batch jobs are requeueable.
  # KillWait short so tests do not wait 30 s after a signal; MinJobAge keeps finished jobs visible
  # to scontrol (there is no accounting database, so no sacct).
  cat >"$conf" <<EOF
ClusterName=eigtrain-local
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort=6817
SlurmdPort=6818
AuthType=auth/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool/slurmd-%n
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SwitchType=switch/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
ReturnToService=2
JobRequeue=1
KillWait=5
MinJobAge=600
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem_mb State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
EOF
}

running() {  # pid file names a live process
  [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null
}

node_ready() {
  SLURM_CONF=$conf sinfo -h -n "$host" -o '%T' 2>/dev/null | grep -qE '^(idle|mixed|allocated|completing)'
}

start() {
  mkdir -p "$dir"
  install_packages
  start_munge
  if running "$dir/slurmctld.pid" && running "$dir/slurmd.pid" && node_ready; then
    echo "$conf"; return
  fi
  write_conf
  export SLURM_CONF=$conf
  running "$dir/slurmctld.pid" || slurmctld -c -f "$conf"   # -c: clean start, no stale jobs
  for _ in $(seq 100); do scontrol ping 2>/dev/null | grep -q UP && break; sleep 0.1; done
  running "$dir/slurmd.pid" || slurmd -f "$conf"
  for _ in $(seq 200); do
    if node_ready; then echo "$conf"; return; fi
    scontrol update nodename="$host" state=resume >/dev/null 2>&1 || true
    sleep 0.2
  done
  log "node did not become idle; see $dir/log/"; sinfo >&2 || true; exit 1
}

stop() {
  # Cancel and drain the jobs first: slurmstepd processes outliving slurmd would linger.
  if running "$dir/slurmctld.pid"; then
    export SLURM_CONF=$conf
    squeue -h -o %i 2>/dev/null | xargs -r scancel 2>/dev/null || true
    for _ in $(seq 150); do [ -z "$(squeue -h -o %i 2>/dev/null)" ] && break; sleep 0.2; done
  fi
  local pidfile
  for pidfile in "$dir/slurmd.pid" "$dir/slurmctld.pid"; do
    if running "$pidfile"; then
      local pid; pid=$(cat "$pidfile")
      kill "$pid"
      for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    fi
  done
  if [ -e "$dir/munged.ours" ] && running /run/munge/munged.pid; then
    kill "$(cat /run/munge/munged.pid)"
  fi
  rm -f "$dir/munged.ours"
  log "stopped the Slurm daemons of $dir"
}

case "$cmd" in
  start) start ;;
  stop) stop ;;
  install) install_packages ;;
  *) echo "usage: $0 start|stop|install [DIR]" >&2; exit 2 ;;
esac
