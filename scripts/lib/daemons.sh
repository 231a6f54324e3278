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

stop_one() {   # stop_one <pidfile> <name>: SIGTERM, SIGKILL after 10 s; the pid file removed
  local pidfile="$1" name="$2" pid i
  if ! pid="$(our_pid "$pidfile")"; then
    [[ -e "$pidfile" ]] && rm -f "$pidfile"
    return 0
  fi
  kill -TERM "$pid" 2>/dev/null || true
  for i in $(seq 1 100); do
    [[ -d "/proc/$pid" ]] || break
    sleep 0.1
  done
  if [[ -d "/proc/$pid" ]]; then
    log "$name (pid $pid) ignored SIGTERM; sending SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -f "$pidfile"
  log "stopped $name (pid $pid)"
}
