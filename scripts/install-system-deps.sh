#!/usr/bin/env bash
# Debian packages the slow tests need: Chromium (browser checks), Slurm and munge (local cluster),
# iproute2 and util-linux (network namespaces, tc and nsenter, for the emulated links and cluster).
# Idempotent; installs only what is missing. Without root it says what is missing: a note on a
# developer's machine (those tests are skipped), an error in CI (CI=true), where they must run.
set -euo pipefail
need=()
command -v chromium >/dev/null 2>&1 || need+=(chromium)
command -v slurmctld >/dev/null 2>&1 || need+=(slurm-wlm)
command -v munged >/dev/null 2>&1 || need+=(munge)
command -v tc >/dev/null 2>&1 || need+=(iproute2)
command -v nsenter >/dev/null 2>&1 || need+=(util-linux)
if [ ${#need[@]} -eq 0 ]; then
    exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    case "${CI:-}" in
    1 | true | TRUE | True | yes)
        echo "error: CI=true and missing ${need[*]}, which needs root and apt-get to install" >&2
        exit 1
        ;;
    esac
    echo "note: missing ${need[*]} (needs root and apt-get); the tests that need them will be skipped" >&2
    exit 0
fi
echo "installing ${need[*]} ..."
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
