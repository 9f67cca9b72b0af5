# Stage file of bench/gpu.sh: synchronous against asynchronous GRPO (algo.max_staleness 0
# and 1) on one GPU, the same config back to back, through bench/speed/longtail.py:
# tokens/s/GPU as NeMo RL counts them, each phase's idle share, the wait for the longest
# row, time/wait_rollouts (bench/speed/README.md, "Long tail, synchronous against
# asynchronous"). One stage per call: each fits the device's 600 s per call.
#   bash bench/gpu.sh async OUT STAGE...
#   qwen       random Qwen2.5-1.5B weights (bench/shapes), 4,096 new tokens, 8 prompts x G 8,
#              each row's length drawn from bench/speed/lengths/ (lengths imposed)
#   lora8b     random Llama-3.1-8B weights, LoRA r=16, 4,096 new tokens, 4 prompts x G 8,
#              lengths imposed as for qwen
#   smollm2_1k the real SmolLM2-135M-Instruct on GSM8K, its own lengths (no imposition),
#   smollm2_4k 8 prompts x G 8, caps 1,024 and 4,096; needs the model converted first, on
#              the same held machine: `bash bench/gpu.sh real OUT setup` twice and `model`
#              (bench/GPU_REAL.md, calls 1-2)
# Knobs (environment): ASYNC_K ("0 1": the staleness values run; one call per value if a
#   stage outgrows 600 s, then `python -m bench.speed.longtail --analyze-only` here over both)
#   ASYNC_STEPS (each stage's own, below) ASYNC_LENGTHS (the distribution file)
#   ASYNC_TIMEOUT (per run, 270 s) ASYNC_VARIANTS (';'-separated NAME=OVERRIDES runs after
#   those, e.g. "k1high=algo.max_staleness=1 rollout.decode_priority=high")
# Writes OUT/async_<stage>/{longtail.md,longtail.json,k0/,k1/}: each run's metrics.jsonl,
# config.yaml and generation records.
set -uo pipefail
out=${1:?usage: bash bench/gpu.sh async OUT STAGE...}
shift
mkdir -p "$out"
device_env # wheels, offline, NVLink multicast off: exported to every process started below
export GRPO_HPC_CACHE=/tmp/grpo_cache GRPO_HPC_LOGS=/tmp/runs
MODEL=${ASYNC_MODEL:-/tmp/grpo_cache/models/smollm2-135m-instruct}
LENGTHS=${ASYNC_LENGTHS:-bench/speed/lengths/smollm2_gsm8k_cap1024.json}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
# async_run STAGE STEPS GRPO_STEP_ARGS...: the runner over each ASYNC_K value
async_run() {
    local stage=$1 steps=$2 variants=() v
    shift 2
    IFS=';' read -ra vs <<<"${ASYNC_VARIANTS:-}"
    for v in "${vs[@]}"; do [ -n "$v" ] && variants+=(--variant "$v"); done
    # shellcheck disable=SC2086  (ASYNC_K is a list)
    python3 -m bench.speed.longtail --out "$out/async_$stage" --staleness ${ASYNC_K:-0 1} "${variants[@]}" \
        --run-timeout "${ASYNC_TIMEOUT:-270}" -- --precision bf16 --steps "${ASYNC_STEPS:-$steps}" \
        --seed 0 "$@" 2>&1 | grep -vE "it/s\]|Warning|warn" | tail -20
}
for stage in "$@"; do
    echo "== $stage $(date +%T)"
    t0=$SECONDS
    case $stage in
    qwen) # every row to the cap took 35.3 s a step (18.2 generate + 16.8 update) here; with
        # the tail ~27 s (all 4,096 decode steps: a third of the rows run to the cap; the
        # update over 54 % of the tokens): 5 steps a run (4 measured) + ~90 s of start
        async_run qwen 5 --model-dir random:bench/shapes/qwen2.5-1.5b --max-new 4096 \
            --prompts 8 --G 8 --length-dist "$LENGTHS" ;;
    lora8b) # no recorded 8B step at 4,096: ~5.5 ms a decode step (16 GB of weights read)
        # x 4,096 + a LoRA update of ~45k tokens (~6 s) ~ 30 s; 5 steps a run (4 measured).
        # 4 prompts: the async copy doubles weights, packed weights and KV cache
        async_run lora8b 5 --model-dir random:bench/shapes/llama-3.1-8b --max-new 4096 \
            --prompts 4 --G 8 --override model.lora_rank=16 --length-dist "$LENGTHS" ;;
    smollm2_1k | smollm2_4k)
        [ -f $MODEL/config.json ] || { echo "no converted model: bash bench/gpu.sh real OUT setup model first"; exit 1; }
        # 512 new tokens took 1.09 s a step (2026-11-27); ~2-3 s at 1,024, ~10 s at 4,096
        cap=1024 steps=20
        [ "$stage" = smollm2_4k ] && cap=4096 steps=10
        async_run "$stage" "$steps" --model-dir $MODEL --shape smollm2-135m --source gsm8k \
            --num-train 512 --max-new "$cap" --prompts 8 --G 8 ;;
    *) echo "unknown stage $stage" ;;
    esac
    echo "== $stage took $((SECONDS - t0)) s"
done
