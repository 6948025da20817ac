#!/usr/bin/env bash
# A Slurm cluster for the slurm and multihost tests, and for trying
# deploy/slurm/ by hand: munged, slurmctld and slurmd from Debian's packages,
# every file under DIR, on free ports.
#
#   bash tests/slurm/test_cluster.sh DIR &     # one node: this machine
#   until [[ -e DIR/ready ]]; do sleep 0.2; done
#   export SLURM_CONF=DIR/slurm.conf   # then sbatch, srun, squeue, scancel as usual
#
#   bash tests/slurm/test_cluster.sh DIR HOSTS CONTROLLER NODE... &
#
# The second form runs on test hosts (tests/multihost/test_hosts.h: network
# namespaces; HOSTS is their file, a line each `ADDRESS NAMESPACE HOSTNAME`):
# slurmctld on test host CONTROLLER and a slurmd on each test host NODE, each
# under its host's hostname and with a /tmp of its own (DIR/hosts/NAME/tmp on
# DIR/tmp, as Slurm's TmpFS), nodes addressed by their host's address. The
# Slurm commands then reach slurmctld only from a test host; this script runs
# its own (squeue, scancel, sinfo) on CONTROLLER. munged runs here, outside
# the hosts: its socket is a file, which every host sees, as every node of a
# real cluster has its own munged with the same key.
#
# DIR gets slurm.conf, munge/ (key, seed, log), run/ (munge socket, pid files),
# state/, spool/NODE/, log/ (the daemons' logs), pids (the daemons' pids) and,
# once every node is idle, ready. The cluster runs until this script gets
# SIGTERM or SIGINT, or until the process that started it ends (a test killed
# by its timeout). Then it cancels every job, stops the daemons by pid, and
# kills by pid whatever is left that carries SLURM_CONF=DIR/slurm.conf in its
# environment: slurmstepd and the jobs' processes (Slurm passes SLURM_CONF to
# every step, and sbatch passes on the submitter's environment).
set -uo pipefail

usage="usage: test_cluster.sh DIR [HOSTS CONTROLLER NODE...]"
dir=${1:?$usage}
hosts_file=${2:-}
controller=${3:-}
nodes=("${@:4}")
[[ -z $hosts_file || ${#nodes[@]} -gt 0 ]] || { echo "$usage" >&2; exit 1; }
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
conf=$dir/slurm.conf
parent=$PPID

log() { echo "test_cluster: $(date '+%T') $*" >&2; }
die() {
  log "$*"
  exit 1
}

tools=(munged mungekey slurmctld slurmd sinfo squeue scancel python3)
[[ -n $hosts_file ]] && tools+=(nsenter unshare mount)
for tool in "${tools[@]}"; do
  command -v "$tool" >/dev/null ||
    die "$tool is not installed: run deploy/setup.sh (Debian's munge, slurmctld, slurmd, slurm-client)"
done

# munged refuses a key readable by others and a socket directory others
# cannot enter.
mkdir -p "$dir/munge" "$dir/run" "$dir/state" "$dir/spool" "$dir/log" "$dir/tmp"
chmod 700 "$dir/munge"
chmod 755 "$dir" "$dir/run"
rm -f "$dir/ready" "$dir/pids"
[[ -f $dir/munge/munge.key ]] || mungekey --create --keyfile="$dir/munge/munge.key" ||
  die "mungekey failed"

read -r ctld_port slurmd_port < <(python3 -c '
import socket
socks = [socket.socket() for _ in range(2)]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(*(s.getsockname()[1] for s in socks))')

# A node as slurmd sees this machine: its real CPUs, sockets and memory (on
# test hosts every node has all of them).
node_line=$(slurmd -C | head -n 1)
hardware=$(sed -n 's/^NodeName=[^ ]* //p' <<<"$node_line")
[[ -n $hardware ]] || die "slurmd -C printed no node: $node_line"

# host_of NAME: "ADDRESS NAMESPACE" of test host NAME.
host_of() {
  local address namespace hostname
  while read -r address namespace hostname; do
    [[ $hostname == "$1" ]] && { echo "$address $namespace"; return 0; }
  done <"$hosts_file"
  die "$1 is not a test host in $hosts_file"
}
node_lines=()
if [[ -z $hosts_file ]]; then
  controller=$(sed -n 's/^NodeName=\([^ ]*\).*/\1/p' <<<"$node_line")
  controller_address=127.0.0.1
  nodes=("$controller")
  mkdir -p "$dir/spool/$controller"
  node_lines=("NodeName=$controller $hardware NodeAddr=127.0.0.1 State=UNKNOWN")
else
  read -r controller_address _ < <(host_of "$controller") || exit 1
  for node in "${nodes[@]}"; do
    read -r address _ < <(host_of "$node") || exit 1
    node_lines+=("NodeName=$node $hardware NodeAddr=$address State=UNKNOWN")
    mkdir -p "$dir/hosts/$node/tmp" "$dir/spool/$node"
  done
fi
node_list=$(IFS=,; echo "${nodes[*]}")

cat >"$conf" <<EOF
# Test cluster written by tests/slurm/test_cluster.sh.
ClusterName=deltaserve-test
SlurmctldHost=$controller($controller_address)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/run/munge.socket
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool/%n
SlurmctldPidFile=$dir/run/slurmctld.pid
SlurmdPidFile=$dir/run/slurmd-%n.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd-%n.log
# The mpi/pmix plugin's per-step directories (spmix_appdir_UID_JOB.STEP):
# another test cluster has the same job and step ids.
TmpFS=$dir/tmp
# Job ids of their own (this cluster's port, unique among the clusters alive
# on this machine, times 1000): Open MPI names a step's shared-memory
# segments (/dev/shm/vader_segment.HOST.JOBID...) after a hash of the job and
# step ids, so two test clusters both at job 1 had their ranks attach to each
# other's segments and crash (two Slurm tests side by side under ctest -j).
FirstJobId=$((ctld_port * 1000))
# No cgroups: processes are tracked by parentage, tasks are not bound.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
# The scripts ask for their MPI plugin; nothing relies on the default.
MpiDefault=none
SchedulerType=sched/backfill
ReturnToService=2
MailProg=/bin/true
# scancel: SIGTERM, then SIGKILL after KillWait seconds (30 by default).
KillWait=10
$(printf '%s\n' "${node_lines[@]}")
PartitionName=debug Nodes=$node_list Default=YES MaxTime=INFINITE State=UP
EOF

# on HOST: sets `prefix` to the words that run a command on test host HOST:
# in its network namespace, under its hostname, with its own /tmp for a node.
# Nothing on one node.
on() {
  local namespace tmp
  prefix=()
  [[ -n $hosts_file ]] || return 0
  read -r _ namespace < <(host_of "$1") || return 1
  tmp=$dir/hosts/$1/tmp
  [[ -d $tmp ]] || tmp=$dir/tmp
  # nsenter, not `ip netns exec`: that mounts a /sys of the namespace's own,
  # without the cgroup file system slurmd needs.
  # shellcheck disable=SC2016  # the inner shell expands them
  prefix=(nsenter --net="/run/netns/$namespace" unshare --uts --mount /bin/sh -c
    'hostname "$1" && mount --bind "$2" "$3" && shift 3 && exec "$@"' sh "$1" "$tmp" "$dir/tmp")
}
slurm() {
  local prefix
  on "$controller" && "${prefix[@]}" "$@"
}

export SLURM_CONF=$conf
daemons=()

# This cluster's slurmstepd processes and the jobs' processes: what carries
# its SLURM_CONF and is a slurmstepd or has a SLURM_JOB_ID (a shell that
# merely exported SLURM_CONF, this script's helpers included, has none).
marked() {
  local f pid
  grep -lxsFz "SLURM_CONF=$conf" /proc/[0-9]*/environ | while read -r f; do
    pid=${f#/proc/}
    pid=${pid%/environ}
    if [[ $(cat "/proc/$pid/comm" 2>/dev/null) == slurmstepd ]] ||
      grep -qsz '^SLURM_JOB_ID=' "$f"; then
      echo "$pid"
    fi
  done
}

running() {  # not gone and not a zombie (the state follows "PID (COMM) ")
  local stat
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  stat=${stat##*) }
  [[ ${stat:0:1} != Z ]]
}

stop_pid() {  # SIGTERM, then SIGKILL after $2 seconds
  local pid=$1 i
  running "$pid" || return 0
  kill -TERM "$pid" 2>/dev/null
  for ((i = 0; i < $2 * 10; i++)); do
    running "$pid" || return 0
    sleep 0.1
  done
  log "pid $pid ($(cat "/proc/$pid/comm" 2>/dev/null)) ignored SIGTERM: SIGKILL"
  kill -KILL "$pid" 2>/dev/null
}

stopped=0
stop_cluster() {
  ((stopped)) && return
  stopped=1
  trap '' TERM INT
  rm -f "$dir/ready"
  local jobs i pid
  if running "${daemons[1]:-0}"; then
    jobs=$(slurm squeue -h -o %A 2>/dev/null | tr '\n' ' ')
    if [[ -n ${jobs// /} ]]; then
      log "cancelling jobs $jobs"
      # shellcheck disable=SC2086
      slurm scancel $jobs 2>/dev/null
      for ((i = 0; i < 150; i++)); do
        [[ -z $(slurm squeue -h 2>/dev/null) && -z $(marked) ]] && break
        sleep 0.2
      done
    fi
  fi
  # slurmd, then slurmctld (it saves its state), then munged.
  for ((i = ${#daemons[@]} - 1; i >= 0; i--)); do
    stop_pid "${daemons[i]}" 10
  done
  for pid in $(marked); do
    log "left behind: pid $pid ($(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null)): SIGKILL"
    kill -KILL "$pid" 2>/dev/null
  done
  wait 2>/dev/null
  for f in "$dir"/core*; do
    [[ -e $f ]] && log "core file $f (a daemon crashed; see the comment above start())"
  done
  log "stopped"
}
trap 'stop_cluster; exit 0' TERM INT
trap stop_cluster EXIT

# Each daemon in the foreground, in its own session: a signal to this
# script's process group (Ctrl-C) reaches only this script, which stops them
# in order. They run in DIR, so a core file lands there (not in the caller's
# directory): Debian's slurmstepd (Slurm 22.05, PMIx 4.2) now and then
# crashes in PMIx_server_finalize as an mpi/pmix step ends, after its tasks
# have exited; the stop below names any core file.
cd "$dir" || die "cannot enter $dir"
start() {  # NAME LOG COMMAND...
  local name=$1 out=$2
  shift 2
  setsid "$@" >"$dir/log/$out.out" 2>&1 &
  daemons+=($!)
  echo "$name $!" >>"$dir/pids"
}
start munged munged munged --foreground --socket="$dir/run/munge.socket" \
  --key-file="$dir/munge/munge.key" --seed-file="$dir/munge/munged.seed" \
  --log-file="$dir/munge/munged.log" --pid-file="$dir/run/munged.pid"
for ((i = 0; i < 50; i++)); do
  [[ -S $dir/run/munge.socket ]] && break
  sleep 0.1
done
[[ -S $dir/run/munge.socket ]] || die "munged did not start: $(cat "$dir/log/munged.out")"
on "$controller" || exit 1
start slurmctld slurmctld "${prefix[@]}" slurmctld -D -f "$conf"
for node in "${nodes[@]}"; do
  on "$node" || exit 1
  start slurmd "slurmd-$node" "${prefix[@]}" slurmd -D -f "$conf" -N "$node"
done

# idle_nodes: how many of the nodes sinfo reports idle.
idle_nodes() { slurm sinfo -h -N -n "$node_list" -o '%N %T' 2>/dev/null | grep -c ' idle$'; }
for ((i = 0; i < 300; i++)); do
  for d in "${daemons[@]}"; do
    running "$d" || die "a daemon ended: $(tail -n 5 "$dir"/log/*.out)"
  done
  (($(idle_nodes) == ${#nodes[@]})) && break
  sleep 0.1
done
(($(idle_nodes) == ${#nodes[@]})) ||
  die "nodes $node_list are not idle after 30 s: $(slurm sinfo -N 2>&1; tail -n 5 "$dir"/log/*.log)"
echo "SLURM_CONF=$conf" >"$dir/ready"
log "up: nodes $node_list ($hardware), slurmctld on $controller port $ctld_port, slurmd on" \
  "port $slurmd_port"

while kill -0 "$parent" 2>/dev/null; do
  sleep 0.5 &
  wait $!
done
log "the process that started me ($parent) ended"
exit 0
