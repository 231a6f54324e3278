#!/usr/bin/env bash
# A small multi-node Slurm cluster on one machine, each node with a network link of its own:
# rehearse a multi-node study on a laptop, or check a prediction across nodes.
#
#   scripts/emulated-cluster.sh up --nodes 8 [--rate 1gbit] [--delay 1ms] [--cpus 4] [--burst 1mb]
#   scripts/emulated-cluster.sh rate 200mbit   every link shaped again; daemons and jobs go on
#   scripts/emulated-cluster.sh env      what a shell needs to submit to it (source it)
#   scripts/emulated-cluster.sh status   daemons, links and sinfo; exit 0 only if all is up
#   scripts/emulated-cluster.sh down     stop everything and remove every namespace and link
#
# What `up` builds (root needed):
#   - a network namespace per node (wbemu-n1 ...), its link `wbemu0` addressed 10.77.0.<i>/24;
#   - a switch: a bridge in a namespace of its own (wbemu-sw), a veth from each node to it;
#   - each node's link shaped in both directions with tc tbf at --rate, its bucket --burst (the
#     node's egress on its side, its ingress on the switch's side); --delay adds netem where the kernel has it
#     (said plainly where it has not: the links then have the veth's own latency);
#   - a slurmd inside each node's namespace (NodeName emu-n<i>, NodeAddr 10.77.0.<i>), and
#     slurmctld and munged on this machine, reached by the nodes through one more link on the
#     switch (10.77.0.254, the only change to this machine's own network: one interface, no
#     route beyond 10.77.0.0/24). Jobs get GLOO_SOCKET_IFNAME=wbemu0 from a task prolog, so
#     DDP's traffic crosses the shaped links, not loopback.
# A second `up` takes down the first; `down` (and a failed `up`) leave no namespace, link,
# qdisc or daemon behind. State, config and logs live in WORKBENCH_EMU_DIR
# (default /tmp/workbench-emu); slurmctld listens on WORKBENCH_EMU_PORT (default 6917).
set -euo pipefail

DIR="${WORKBENCH_EMU_DIR:-/tmp/workbench-emu}"
CTLD_PORT="${WORKBENCH_EMU_PORT:-6917}"
SLURMD_PORT=$((CTLD_PORT + 1))
PREFIX=wbemu
SUBNET=10.77.0
HOST_IP="$SUBNET.254"
PARTITION=emu
IFACE=wbemu0
# tbf's bucket (--burst): what a link may send at once after an idle moment. A real link has no
# such credit, but on a 2-core host a smaller bucket than 1 MB cannot keep an 800 Mbit/s link
# at its rate under DDP's traffic (64 kB and 256 kB: 58-75 MB/s measured of 100, and steps much
# slower than the link's own benchmark implies; BENCHMARKS.md, "DDP or FSDP, held out").
BURST="${WORKBENCH_EMU_BURST:-1mb}"

log() { echo "[emulated-cluster] $*" >&2; }
die() { echo "[emulated-cluster] ERROR: $*" >&2; exit 1; }

[[ "$DIR" = /* ]] || DIR="$(pwd)/$DIR"
DIR="${DIR%/}"
CONF="$DIR/slurm.conf"
ENV_FILE="$DIR/env.sh"
MUNGE_SOCKET="$DIR/munge/munge.socket"
RUN_DIR="$DIR/run"
LOG_DIR="$DIR/log"

# --------------------------------------------------------------------------- helpers

# shellcheck source=lib/daemons.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/daemons.sh"

nodes_of_state() { [[ -s "$DIR/nodes" ]] && cat "$DIR/nodes" || echo 0; }

# --------------------------------------------------------------------------- network

add_link() {   # add_link <i> <rate> <delay>: namespace, veth to the switch, address, shaping
  local i="$1" rate="$2" delay="$3" ns="$PREFIX-n$1" sw="$PREFIX-s$1"
  ip netns add "$ns"
  ip link add "$sw" type veth peer name "$IFACE" netns "$ns"
  ip link set "$sw" netns "$PREFIX-sw"
  ip -n "$PREFIX-sw" link set "$sw" master br0 up
  ip -n "$ns" link set lo up
  ip -n "$ns" addr add "$SUBNET.$i/24" dev "$IFACE"
  ip -n "$ns" link set "$IFACE" up
  shape "$ns" "$IFACE" "$rate" "$delay"          # what the node sends
  shape "$PREFIX-sw" "$sw" "$rate" "$delay"      # what the node receives
}

shape() {   # shape <namespace> <device> <rate> <delay>
  local ns="$1" dev="$2" rate="$3" delay="$4"
  if [[ -n "$delay" ]] && ip netns exec "$ns" tc qdisc add dev "$dev" root handle 1: netem delay "$delay" 2>/dev/null; then
    ip netns exec "$ns" tc qdisc add dev "$dev" parent 1: handle 2: tbf rate "$rate" burst "$BURST" latency 200ms
  else
    ip netns exec "$ns" tc qdisc replace dev "$dev" root tbf rate "$rate" burst "$BURST" latency 200ms
  fi
}

build_network() {   # build_network <nodes> <rate> <delay>
  local n="$1" rate="$2" delay="$3" i
  ip netns add "$PREFIX-sw"
  ip -n "$PREFIX-sw" link add br0 type bridge
  ip -n "$PREFIX-sw" link set br0 up
  ip -n "$PREFIX-sw" link set lo up
  for i in $(seq 1 "$n"); do add_link "$i" "$rate" "$delay"; done
  # this machine's one link to the switch: the controller's address for the nodes
  ip link add "$PREFIX-h" type veth peer name "$PREFIX-hs" netns "$PREFIX-sw"
  ip -n "$PREFIX-sw" link set "$PREFIX-hs" master br0 up
  ip addr add "$HOST_IP/24" dev "$PREFIX-h"
  ip link set "$PREFIX-h" up
  if [[ -n "$delay" ]] && ! ip netns exec "$PREFIX-n1" tc qdisc show dev "$IFACE" | grep -q netem; then
    log "NOTE: --delay $delay not applied: this kernel has no netem (sch_netem); the links have the veth's own latency (tens of us)"
  fi
}

remove_network() {   # every namespace and link of ours, whatever state an earlier run left
  local ns
  ip link del "$PREFIX-h" 2>/dev/null || true
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^$PREFIX-(n[0-9]+|sw)$" || true); do
    ip netns pids "$ns" 2>/dev/null | xargs -r kill -KILL 2>/dev/null || true
    ip netns del "$ns"
  done
}

# --------------------------------------------------------------------------- Slurm

write_config() {   # write_config <nodes> <cpus>
  local n="$1" cpus="$2" mem_mb i nodes=""
  mkdir -p "$DIR/munge" "$RUN_DIR" "$LOG_DIR" "$DIR/state" "$DIR/spool"
  chmod 755 "$DIR" "$DIR/munge"
  [[ -s "$DIR/munge/munge.key" ]] || dd if=/dev/urandom of="$DIR/munge/munge.key" bs=1024 count=1 status=none
  chmod 400 "$DIR/munge/munge.key"
  mem_mb=$(( $(awk '/^MemTotal:/ {print $2}' /proc/meminfo) / 1024 / n ))
  : >"$DIR/plugstack.conf"
  printf '#!/bin/sh\necho export GLOO_SOCKET_IFNAME=%s\n' "$IFACE" >"$DIR/task-prolog.sh"
  chmod 755 "$DIR/task-prolog.sh"
  cat >"$CONF" <<EOF
# Generated by scripts/emulated-cluster.sh: $n nodes, each in a network namespace of its own.
ClusterName=emulated
SlurmctldHost=$(hostname -s)($HOST_IP)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$MUNGE_SOCKET,cred_expire=10
PlugStackConfig=$DIR/plugstack.conf
TaskProlog=$DIR/task-prolog.sh
MailProg=/bin/true
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool/%n
SlurmctldPidFile=$RUN_DIR/slurmctld.pid
SlurmdPidFile=$RUN_DIR/slurmd-%n.pid
SlurmctldLogFile=$LOG_DIR/slurmctld.log
SlurmdLogFile=$LOG_DIR/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
MpiDefault=none
SwitchType=switch/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2,bf_interval=5
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MinJobAge=3600
JobRequeue=1
ReturnToService=2
KillWait=5
InactiveLimit=0
Waittime=0
EOF
  for i in $(seq 1 "$n"); do
    echo "NodeName=emu-n$i NodeAddr=$SUBNET.$i CPUs=$cpus Boards=1 SocketsPerBoard=1 CoresPerSocket=$cpus ThreadsPerCore=1 RealMemory=$mem_mb State=UNKNOWN" >>"$CONF"
    nodes+="${nodes:+,}emu-n$i"
  done
  echo "PartitionName=$PARTITION Nodes=$nodes Default=YES MaxTime=INFINITE State=UP" >>"$CONF"
  cat >"$ENV_FILE" <<EOF
# Generated by scripts/emulated-cluster.sh -- source this file.
export SLURM_CONF=$CONF
export WORKBENCH_SLURM_PARTITION=$PARTITION
EOF
}

start_daemons() {   # start_daemons <nodes>
  local n="$1" i t0=$SECONDS states
  rm -f "$MUNGE_SOCKET" "$MUNGE_SOCKET.lock"
  munged --socket="$MUNGE_SOCKET" --key-file="$DIR/munge/munge.key" --pid-file="$RUN_DIR/munged.pid" \
    --log-file="$LOG_DIR/munged.log" --seed-file="$DIR/munge/munged.seed" --num-threads=4
  wait_pidfile "$RUN_DIR/munged.pid" munged
  slurmctld -f "$CONF" >>"$LOG_DIR/slurmctld.stdout" 2>&1
  wait_pidfile "$RUN_DIR/slurmctld.pid" slurmctld
  for i in $(seq 1 "$n"); do
    mkdir -p "$DIR/spool/emu-n$i"
    # nsenter, not ip netns exec: the node's network only, this machine's /sys (cgroups) kept
    nsenter --net="/run/netns/$PREFIX-n$i" slurmd -f "$CONF" -N "emu-n$i" >>"$LOG_DIR/slurmd-emu-n$i.stdout" 2>&1
    wait_pidfile "$RUN_DIR/slurmd-emu-n$i.pid" "slurmd emu-n$i"
  done
  while true; do
    states="$(SLURM_CONF="$CONF" sinfo -h -N -p "$PARTITION" -o '%N %t' 2>/dev/null | sort -u || true)"
    if [[ "$(grep -cE ' (idle|mix|alloc)$' <<<"$states")" -ge "$n" ]]; then
      log "$n nodes up after $((SECONDS - t0)) s"
      return 0
    fi
    (( SECONDS - t0 < 60 )) || { echo "$states" >&2; die "nodes not idle after 60 s; see $LOG_DIR"; }
    sleep 0.5
  done
}

stop_daemons() {
  if our_pid "$RUN_DIR/slurmctld.pid" >/dev/null; then
    SLURM_CONF="$CONF" scancel --partition "$PARTITION" 2>/dev/null || true
  fi
  stop_all "$RUN_DIR"/slurmd-*.pid
  stop_all "$RUN_DIR/slurmctld.pid"
  stop_all "$RUN_DIR/munged.pid"
}

# --------------------------------------------------------------------------- commands

cmd_down() {
  stop_daemons
  remove_network
  rm -f "$DIR/nodes" "$DIR/shape" "$ENV_FILE"
  log "down: no namespace, link, qdisc or daemon of the emulated cluster is left"
}

cmd_up() {
  local nodes=2 rate=1gbit delay="" cpus=4
  while [[ $# -gt 0 ]]; do
    case "$1" in
      --nodes) nodes="$2"; shift 2 ;;
      --rate) rate="$2"; shift 2 ;;
      --delay) delay="$2"; shift 2 ;;
      --cpus) cpus="$2"; shift 2 ;;
      --burst) BURST="$2"; shift 2 ;;
      *) die "unknown option '$1' (valid: --nodes N, --rate RATE, --delay TIME, --cpus N, --burst SIZE)" ;;
    esac
  done
  [[ "$nodes" =~ ^[0-9]+$ ]] && (( nodes >= 1 && nodes <= 250 )) || die "--nodes '$nodes': a whole number from 1 to 250"
  [[ "$cpus" =~ ^[0-9]+$ ]] && (( cpus >= 1 )) || die "--cpus '$cpus': a whole number, 1 or more"
  valid_rate "$rate" || die "--rate '$rate': a tc rate such as 1gbit, 500mbit"
  [[ "$BURST" =~ ^[0-9]+([km]?b)?$ ]] || die "--burst '$BURST': a tc size such as 64kb, 1mb"
  [[ $EUID -eq 0 ]] || die "must run as root (namespaces, links and daemons)"
  command -v slurmd >/dev/null && command -v munged >/dev/null || die "Slurm and munge are not installed: bash scripts/install-system-deps.sh"
  cmd_down 2>/dev/null   # a second up replaces the first
  trap 'status=$?; if [[ $status -ne 0 ]]; then log "up failed: taking everything down"; cmd_down; fi' EXIT
  mkdir -p "$DIR"
  build_network "$nodes" "$rate" "$delay"
  echo "$nodes" >"$DIR/nodes"
  echo "$BURST $delay" >"$DIR/shape"   # what `rate` keeps
  write_config "$nodes" "$cpus"
  start_daemons "$nodes"
  trap - EXIT
  log "up: $nodes nodes, each link $rate both ways${delay:+, delay $delay where netem exists}; submit with:"
  cat "$ENV_FILE"
}

valid_rate() { [[ "$1" =~ ^[0-9.]+([kmg]?bit|[kmg]?bps)$ ]]; }

cmd_rate() {   # rate RATE: every link shaped again at RATE; the daemons and their jobs go on
  local rate="${1:-}" n i burst delay end ns dev
  valid_rate "$rate" || die "rate '$rate': a tc rate such as 1gbit, 500mbit"
  [[ $EUID -eq 0 ]] || die "must run as root (the links' qdiscs)"
  n="$(nodes_of_state)"
  (( n > 0 )) || die "the emulated cluster is down; run: $0 up --nodes N --rate $rate"
  # the bucket and delay `up` was given (a cluster from before `rate` existed: the defaults)
  burst="$BURST" delay=""
  [[ -s "$DIR/shape" ]] && read -r burst delay <"$DIR/shape"
  BURST="$burst"
  for i in $(seq 1 "$n"); do
    for end in "$PREFIX-n$i $IFACE" "$PREFIX-sw $PREFIX-s$i"; do
      read -r ns dev <<<"$end"
      ip netns exec "$ns" tc qdisc del dev "$dev" root 2>/dev/null || true
      shape "$ns" "$dev" "$rate" "$delay"
    done
  done
  log "every link now $rate both ways (the cluster kept running)"
}

cmd_status() {
  local n ok=0 i
  n="$(nodes_of_state)"
  (( n > 0 )) || { echo "down"; return 1; }
  for f in munged slurmctld; do our_pid "$RUN_DIR/$f.pid" >/dev/null && echo "$f running" || { echo "$f stopped"; ok=1; }; done
  for i in $(seq 1 "$n"); do
    our_pid "$RUN_DIR/slurmd-emu-n$i.pid" >/dev/null && echo "slurmd emu-n$i running" || { echo "slurmd emu-n$i stopped"; ok=1; }
    ip netns exec "$PREFIX-n$i" tc qdisc show dev "$IFACE" | head -1
  done
  [[ $ok -eq 0 ]] && SLURM_CONF="$CONF" sinfo -N -p "$PARTITION"
  return $ok
}

case "${1:-}" in
  up) shift; cmd_up "$@" ;;
  rate) shift; cmd_rate "$@" ;;
  down) cmd_down ;;
  status) cmd_status ;;
  env) [[ -f "$ENV_FILE" ]] || die "the emulated cluster is down (no $ENV_FILE); run: $0 up --nodes N"; cat "$ENV_FILE" ;;
  *) echo "usage: $0 up --nodes N [--rate 1gbit] [--delay 1ms] [--cpus 4] [--burst 1mb] | rate RATE | env | status | down" >&2; exit 2 ;;
esac
