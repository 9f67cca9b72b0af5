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
#   profile    bench/speed/profile_async.py: one asynchronous run (algo.max_staleness=1) per
#              decode priority (rollout.decode_priority normal, then high), each in a process
#              of its own: warm-up steps, then one step under torch.profiler; while the update
#              runs, does the decode wait for the GPU or for its host thread (the GIL)?
#              Random Qwen2.5-1.5B, 4,096 new tokens, 8 prompts x G 8, lengths imposed (as qwen)
# Knobs (environment): ASYNC_K ("0 1": the staleness values run; one call per value if a
#   stage outgrows 600 s, then `python -m bench.speed.longtail --analyze-only` here over both;
#   "none": the ASYNC_VARIANTS alone, e.g. after a call of ASYNC_K=0)
#   ASYNC_STEPS (each stage's own, below) ASYNC_LENGTHS (the distribution file)
#   ASYNC_TIMEOUT (per run, 270 s) ASYNC_VARIANTS (';'-separated NAME=OVERRIDES runs after
#   those, e.g. "k1high=algo.max_staleness=1 rollout.decode_priority=high"; partial rollouts:
#   "partial=algo.max_staleness=2 rollout.partial_pool=2", each row's imposed length carried
#   across the rounds that continue it) ASYNC_NPROC (processes, 1: on two GPUs, 2 runs the
#   synchronous and thread runs as 2 DDP ranks and a split variant, e.g. "split=algo.
#   max_staleness=1 rollout.placement=split", as a trainer and a generator: the same GPUs)
#   ASYNC_PROMPTS (qwen's prompts a step, 8: 4 fits a partial pool of two steps beside the
#   update on an 80 GB H100, where 8 ran out of memory)
#   ASYNC_SWITCH_MS (every run's sys.setswitchinterval in ms, e.g. 0.5: does the decode
#   thread wait for the GIL while the update's Python holds it? grpo_step --switch-interval-ms)
#   profile: PROFILE_ASYNC_SHAPE (qwen; lora8b: random Llama-3.1-8B, LoRA r=16, 4 prompts)
#   PROFILE_ASYNC_RUNS ("normal high": the priorities, one run each) PROFILE_ASYNC_OVERRIDES
#   (more config key=value, after the priority's) PROFILE_ASYNC_WARMUP (2) PROFILE_ASYNC_TIMEOUT
#   (per run, 260 s; killed 20 s after)
# Writes OUT/async_<stage>/{longtail.md,longtail.json,k0/,k1/}: each run's metrics.jsonl,
# config.yaml and generation records; profile: OUT/async_profile/profile_async_<priority>.
# {json,md,log} (6 files: a call brings back 8 at most).
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
    local ks=${ASYNC_K:-0 1}
    [ "$ks" = none ] && ks=  # the variants alone (the other half of a comparison across calls)
    # shellcheck disable=SC2086  (ks is a list)
    python3 -m bench.speed.longtail --out "$out/async_$stage" --staleness $ks "${variants[@]}" \
        --run-timeout "${ASYNC_TIMEOUT:-270}" -- --precision bf16 --steps "${ASYNC_STEPS:-$steps}" \
        --seed 0 --nproc "${ASYNC_NPROC:-1}" ${ASYNC_SWITCH_MS:+--switch-interval-ms "$ASYNC_SWITCH_MS"} \
        "$@" 2>&1 | grep -vE "it/s\]|Warning|warn" | tail -20
}
# profile_async: bench/speed/profile_async.py once per PROFILE_ASYNC_RUNS priority, into
# OUT/async_profile (the log: the run's last 150 lines)
profile_async() {
    local dir=$out/async_profile p code model
    mkdir -p "$dir"
    case ${PROFILE_ASYNC_SHAPE:-qwen} in
    qwen) model=(--model-dir random:bench/shapes/qwen2.5-1.5b --prompts 8) ;;
    lora8b) model=(--model-dir random:bench/shapes/llama-3.1-8b --override model.lora_rank=16 --prompts 4) ;;
    *) echo "unknown PROFILE_ASYNC_SHAPE ${PROFILE_ASYNC_SHAPE}: qwen or lora8b"; return 1 ;;
    esac
    for p in ${PROFILE_ASYNC_RUNS:-normal high}; do
        # shellcheck disable=SC2086  (PROFILE_ASYNC_OVERRIDES is a list)
        timeout -k 20 "${PROFILE_ASYNC_TIMEOUT:-260}" python3 -m bench.speed.profile_async "${model[@]}" \
            --G 8 --max-new 4096 --precision bf16 --length-dist "$LENGTHS" --seed 0 \
            --warmup "${PROFILE_ASYNC_WARMUP:-2}" --tag "$p" --out "$dir" \
            --override "rollout.decode_priority=$p" ${PROFILE_ASYNC_OVERRIDES:-} 2>&1 |
            tail -n 150 >"$dir/profile_async_$p.log"
        code=${PIPESTATUS[0]}
        echo "-- profile_async $p: exit $code"
        if [ -f "$dir/profile_async_$p.md" ]; then cat "$dir/profile_async_$p.md"; else tail -n 30 "$dir/profile_async_$p.log"; fi
    done
}
for stage in "$@"; do
    echo "== $stage $(date +%T)"
    t0=$SECONDS
    case $stage in
    qwen) # every row to the cap took 35.3 s a step (18.2 generate + 16.8 update) here; with
        # the tail ~27 s (all 4,096 decode steps: a third of the rows run to the cap; the
        # update over 54 % of the tokens): 5 steps a run (4 measured) + ~90 s of start
        async_run qwen 5 --model-dir random:bench/shapes/qwen2.5-1.5b --max-new 4096 \
            --prompts "${ASYNC_PROMPTS:-8}" --G 8 --length-dist "$LENGTHS" ;;
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
    profile) # an async qwen run took ~140 s with 5 steps (60-90 s of start-up); here start-up
        # + 2 warm-up steps (~30 s) + one profiled step (~17 s, slower under the profiler) and
        # reading ~10^5-10^6 kernels back: ~150-230 s a run, two in the call's 600 s (each
        # stopped at 260 s). The 8B update (~25 s) may fill CUPTI's buffers: the report says so.
        # The 8B LoRA run (a 48 s step) needs a call each: PROFILE_ASYNC_SHAPE=lora8b
        # PROFILE_ASYNC_RUNS=normal PROFILE_ASYNC_WARMUP=1 PROFILE_ASYNC_TIMEOUT=540, then high
        profile_async ;;
    *) echo "unknown stage $stage" ;;
    esac
    echo "== $stage took $((SECONDS - t0)) s"
done
