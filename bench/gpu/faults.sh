# Stage file of bench/gpu.sh: on a lent multi-GPU machine (root, no network), the Slurm GPU
# node of slurm/up.sh --real-gpus (from the Debian packages in .slurmdebs,
# slurm/offline-debs.sh), then the GPU fault campaign (python -m bench.faults.gpu_run) on it.
# Carry .whl and .slurmdebs.
#
#   bash bench/gpu.sh faults OUT [faults/gpu_run.py arguments]
#
# Results accumulate in OUT/gpu_faults.json, starting from bench/results/gpu_faults.json
# when an earlier call's file was copied there (it travels with the tree; trials run again
# replace their rows); written after every trial, so a call cut at its limit keeps them.
# Each trial's small files go to OUT/gpu_faults_evidence.tgz. No trial starts that would
# end (by its kind's usual length) later than GPU_FAULTS_DEADLINE s (default 570) after
# this script's start.
set -uo pipefail
OUT=${1:?usage: bash bench/gpu.sh faults OUT [faults/gpu_run.py arguments]}
shift
mkdir -p "$OUT"
device_env
t0=$SECONDS
GRPO_SLURM_DEBS=${SLURM_DEBS:-$PWD/.slurmdebs} bash slurm/up.sh --real-gpus >"$OUT/up.log" 2>&1 ||
    { tail -n 30 "$OUT/up.log"; exit 1; }
echo "cluster up in $((SECONDS - t0)) s: $(sinfo -h -N -o '%N %t %G')"
export GRPO_HPC_CACHE=/tmp/grpo_cache_faults
EV=/tmp/gpu_faults_evidence
rm -rf "$EV"
cp bench/results/gpu_faults.json "$OUT/" 2>/dev/null
deadline=$((${GPU_FAULTS_DEADLINE:-570} - (SECONDS - t0)))
python3 -m bench.faults.gpu_run --out "$OUT/gpu_faults.json" --evidence "$EV" \
    --deadline "$deadline" "$@"
rc=$?
tar czf "$OUT/gpu_faults_evidence.tgz" -C "$EV" . 2>/dev/null
exit $rc
