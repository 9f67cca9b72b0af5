#!/usr/bin/env bash
# Issue 37, part 2, on a lent multi-GPU machine (root, no network): the Slurm GPU node of
# slurm/up.sh --real-gpus (from the Debian packages in .slurmdebs, slurm/offline-debs.sh),
# then the GPU fault campaign (python -m bench.gpu_faults) on it. Carry .whl and .slurmdebs.
#
#   bash bench/gpu_faults.sh OUT [gpu_faults.py arguments]
#
# Results accumulate in bench/results/gpu_faults.json (a copy of the file from an earlier
# call travels with the tree; trials run again replace their rows), copied to
# OUT/gpu_faults.json; each trial's small files go to OUT/gpu_faults_evidence.tgz.
# Stops starting trials 60 s before GPU_FAULTS_DEADLINE (default 540 s) from its start.
set -uo pipefail
OUT=${1:?usage: gpu_faults.sh OUT [gpu_faults.py arguments]}
shift
mkdir -p "$OUT"
# shellcheck source=bench/device_env.sh
source bench/device_env.sh
t0=$SECONDS
GRPO_SLURM_DEBS=${SLURM_DEBS:-$PWD/.slurmdebs} bash slurm/up.sh --real-gpus >"$OUT/up.log" 2>&1 ||
    { tail -n 30 "$OUT/up.log"; exit 1; }
echo "cluster up in $((SECONDS - t0)) s: $(sinfo -h -N -o '%N %t %G')"
export GRPO_HPC_CACHE=/tmp/grpo_cache_faults
EV=/tmp/gpu_faults_evidence
rm -rf "$EV"
deadline=$((${GPU_FAULTS_DEADLINE:-540} - 60 - (SECONDS - t0)))
python3 -m bench.gpu_faults --out bench/results/gpu_faults.json --evidence "$EV" \
    --deadline "$deadline" "$@"
rc=$?
cp bench/results/gpu_faults.json "$OUT/" 2>/dev/null
tar czf "$OUT/gpu_faults_evidence.tgz" -C "$EV" . 2>/dev/null
exit $rc
