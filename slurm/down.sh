#!/usr/bin/env bash
# Stop the Slurm test cluster started by slurm/up.sh (also the namespaces and bridge of
# --nodes N).
#   bash slurm/down.sh           stop daemons (state and accounting DB are kept)
#   bash slurm/down.sh --purge   also wipe state, DB, generated configs and fake GPUs
# Only stops processes named in this toolkit's pid files (munged only if up.sh started it)
# and whatever is left inside its node namespaces (by the pids `ip netns pids` lists).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=slurm/lib.sh
source "$HERE/lib.sh"

PURGE=0
for arg in "$@"; do
    case "$arg" in
    --purge) PURGE=1 ;;
    -h | --help)
        sed -n '2,7s/^# \{0,1\}//p' "$0"
        exit 0
        ;;
    *)
        echo "slurm/down.sh: unknown argument: $arg" >&2
        exit 2
        ;;
    esac
done

[[ $EUID -eq 0 ]] || {
    echo "slurm/down.sh: must run as root" >&2
    exit 1
}
take_lock

# Cancel jobs first so no orphaned slurmstepd/job processes outlive slurmd.
if alive slurmctld; then
    jobs=$(squeue -h -o %A 2>/dev/null || true)
    if [[ -n $jobs ]]; then
        # shellcheck disable=SC2086
        scancel $jobs 2>/dev/null || true
        for ((i = 0; i < 100; i++)); do
            [[ -z $(squeue -h -o %A -t R,CG,S 2>/dev/null || true) ]] && break
            sleep 0.1
        done
    fi
fi

# Three rounds (each daemon takes 1-2 s to exit): Slurm, then slurmdbd (and munged if
# up.sh started it), then MariaDB last so slurmdbd can still flush to it.
# shellcheck disable=SC2046 # one word per daemon name
stop_daemons 15 slurmd $(node_slurmds) slurmctld
stop_netns_processes # whatever the cancelled jobs left in the node namespaces
remove_netns
if [[ -e $STATE/run/munged.ours ]]; then
    stop_daemons 15 slurmdbd munged
    rm -f "$STATE/run/munged.ours"
else
    stop_daemons 15 slurmdbd
fi
stop_daemons 30 mariadbd

if ((PURGE)); then
    for f in slurm.conf gres.conf slurmdbd.conf; do
        if [[ -f $CONF_DIR/$f ]] && grep -q "$MARKER" "$CONF_DIR/$f"; then
            rm -f "${CONF_DIR:?}/$f"
        fi
    done
    rm -f /dev/fakegpu[0-9]*
    rm -rf "${STATE:?}"
    echo "slurm: cluster stopped and purged ($STATE removed)"
else
    echo "slurm: cluster stopped (state kept in $STATE)"
fi
