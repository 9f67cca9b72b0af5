#!/usr/bin/env bash
# The GPU benchmarks on a lent GPU machine, from the repository root (bench/README.md; the
# exact calls: bench/GPU_REAL.md; history: bench/results/LOG.md).
#
#   bash bench/gpu.sh SUBJECT OUT [STAGE... | ARGS...]
#
# SUBJECT picks the stage file bench/gpu/SUBJECT.sh; each lists its stages at its top:
#   random  random weights of the Qwen shapes: decode, update, step, trl, ladder, profile,
#           multi, dcp, the GPU tests, ... (OUT STAGE...)
#   families  the model families the native engine decodes (bench/shapes configs, random weights): the
#           families' GPU tests, decode vs HF generate per family, Qwen3-1.7B vs TRL:
#           tests_native, tests_update, decode, decode2, trl (OUT STAGE...)
#   real    the real SmolLM2-135M-Instruct: setup, model, decode, parity, learn2, gsm8k, supercloud,
#           reallen, ... (OUT STAGE...)
#   memory  a run's GPU memory under bench/memory/probe.py: 7b, 7b_sync, 7b_int8, small, ...
#           (OUT [STAGE...], default 7b 7b_sync small)
#   slurm   Slurm on the machine, a --gres job, a GSM8K run through grpo-submit to it:
#           probe, up, gres, submit (OUT [STAGE...], default all)
#   faults  the GPU fault campaign on the Slurm GPU node (OUT [bench.faults.gpu_run arguments])
#   code    the code task on one GPU, then the sandbox's throughput there (OUT)
#   async   synchronous against asynchronous GRPO (algo.max_staleness 0, 1) under a long tail
#           of lengths: qwen, lora8b, smollm2_1k, smollm2_4k; profile (one asynchronous step
#           under torch.profiler at each decode priority) (OUT STAGE...; one a call)
#   export  a GSM8K run exported and scored by grpo-eval against the trainer's figure ([OUT])
#   prep    run HERE, not on the GPU machine: the GGUF parts and wheels a call carries (no OUT;
#           `prep wheels`: the wheels alone)
# Shared helpers (wheels, import path, NVLink multicast off): bench/gpu/env.sh.
usage="usage: bash bench/gpu.sh random|families|real|memory|slurm|faults|code|async|export|prep OUT [STAGE...]"
subject=${1:?$usage}
shift
case $subject in
random | families | real | memory | slurm | faults | code | async | export | prep) ;;
*)
    echo "unknown subject $subject; $usage" >&2
    exit 2
    ;;
esac
# shellcheck source=bench/gpu/env.sh
source bench/gpu/env.sh
# shellcheck disable=SC1090  (one of bench/gpu/*.sh)
source "bench/gpu/$subject.sh"
