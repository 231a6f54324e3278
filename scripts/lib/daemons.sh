# Daemons whose pid files live in one folder ($DIR), shared by scripts/slurm/cluster.sh and
# scripts/emulated-cluster.sh. Source it after setting DIR and LOG_DIR and defining log and die.

# pid from a pid file, only if that process is alive AND its command line mentions our folder
# (so a recycled pid or someone else's daemon is never touched).
our_pid() {
  local pidfile="$1" pid
  [[ -s "$pidfile" ]] || return 1
  pid="$(tr -dc '0-9' <"$pidfile")"
  [[ -n "$pid" && -r "/proc/$pid/cmdline" ]] || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF -- "$DIR/" || return 1
  echo "$pid"
}

wait_pidfile() {   # wait_pidfile <pidfile> <name>: until the daemon wrote its pid file
  local pidfile="$1" name="$2" i
  for i in $(seq 1 100); do
    our_pid "$pidfile" >/dev/null && return 0
    sleep 0.1
  done
  die "$name did not start; see $LOG_DIR"
}

stop_all() {   # stop_all <pidfile>...: SIGTERM to each at once, SIGKILL to any left after 10 s;
  # the pid files removed. At once: each daemon takes about 2 s to leave, one after another
  # that was 2 s a node.
  local pidfile pid i left
  local -a pids=() names=()
  for pidfile in "$@"; do
    if pid="$(our_pid "$pidfile")"; then
      kill -TERM "$pid" 2>/dev/null || true
      pids+=("$pid")
      names+=("$(basename "$pidfile" .pid)")
    fi
    rm -f "$pidfile"
  done
  for i in $(seq 1 100); do
    left=0
    for pid in "${pids[@]}"; do [[ -d "/proc/$pid" ]] && left=1; done
    (( left )) || break
    sleep 0.1
  done
  for i in "${!pids[@]}"; do
    if [[ -d "/proc/${pids[$i]}" ]]; then
      log "${names[$i]} (pid ${pids[$i]}) ignored SIGTERM; sending SIGKILL"
      kill -KILL "${pids[$i]}" 2>/dev/null || true
    fi
    log "stopped ${names[$i]} (pid ${pids[$i]})"
  done
}
