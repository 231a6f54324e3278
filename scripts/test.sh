#!/usr/bin/env bash
# make test: the suite in two phases, so the cores are busy and no duration is measured under load.
#   1. every test but the timing ones, on two workers (pytest-xdist): a module runs whole on one
#      worker (its module fixtures launch once), and every Slurm test on one (one cluster);
#   2. the timing tests (their claim is a duration measured on this host), one at a time, with
#      nothing else running beside them.
# Both phases run; the status is the first phase's failure, else the second's. Arguments go to
# both (a phase that selects nothing of them counts as passed).
# WORKBENCH_TEST_WORKERS sets phase 1's workers (2: this project's CI machine has 2 cores).
set -uo pipefail
PY="${PY:-.venv/bin/python}"
workers="${WORKBENCH_TEST_WORKERS:-2}"

phase() {
    "$PY" -m pytest "$@"
    local rc=$?
    [ "$rc" -eq 5 ] && rc=0  # 5: nothing selected in this phase
    return "$rc"
}

echo "== phase 1 of 2: all but the timing tests, on $workers workers"
phase -m "not timing" -n "$workers" --dist loadgroup "$@"
first=$?
echo "== phase 2 of 2: the timing tests, one at a time"
phase -m timing "$@"
second=$?
[ "$first" -ne 0 ] && exit "$first"
exit "$second"
