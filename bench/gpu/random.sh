# Stage file of bench/gpu.sh: the benchmarks on random weights of the Qwen shapes.
#   bash bench/gpu.sh random OUT STAGE...
# Stages start the benchmarks as python3 -m bench.<name>:
#   decode update step stepc (compiled training forward) trl lean defaults sizes tests ladder
#   profile          one default step at 1.5B and 3B under torch.profiler
#   packing          TRL, the defaults and algo.packing side by side
#   update_packed    the update alone, padded vs packed, full and ragged lengths
#   update_profile   the packed update's profile
#   update_compiled  the update with compiled layers
#   recompute        the default step with less gradient checkpointing
#   multi dcp ladder2 trl2 (2 GPUs)
# Extra wheels (grpo_hpc's own dependencies missing on the machine, TRL) are taken from .whl/.
set -uo pipefail
out=${1:?usage: bash bench/gpu.sh random OUT STAGE...}
shift
mkdir -p "$out"
device_env
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
for stage in "$@"; do
    echo "== $stage $(date +%T)"
    case $stage in
    decode) python3 -m bench.decode --shape qwen2.5-0.5b --batch 64 256 \
        --engines native native-eager hf --out "$out/decode.json" ;;
    step) python3 -m bench.speed.grpo_step --shape qwen2.5-0.5b --precision bf16 --steps 5 --prompts 8 \
        --G 8 --max-new 256 --micro 64 --no-grad-ckpt --engine native --out "$out/step_native.json" | tail -22 ;;
    trl) # TRL once, then grpo_hpc's defaults and the other memory variants
        python3 -m bench.trl.baseline --shape qwen2.5-0.5b --micro 16 --engine native \
            --out "$out/trl_vs_grpo_hpc.json" 2>&1 | grep -v "it/s\]" | tail -30 ;;
    stepc) python3 -m bench.speed.grpo_step --shape qwen2.5-0.5b --precision bf16 --steps 7 --prompts 8 \
        --G 8 --max-new 256 --micro 64 --no-grad-ckpt --engine native --compile --out "$out/step_compiled.json" \
        | tail -22 ;;
    trl2) # TRL under accelerate launch with FSDP2 (bench/trl/multi.py) on 2
        # GPUs beside grpo_hpc's step with FSDP2 and with DDP; 8 prompts x G=8 per GPU, 256
        # tokens (TRL2_SHAPE, default qwen2.5-1.5b; TRL2_MODE fsdp2, fsdp1 or ddp; a failed
        # launch is tried once more as TRL2_FALLBACK, default fsdp1)
        shape=${TRL2_SHAPE:-qwen2.5-1.5b}
        python3 -m bench.trl.baseline --shape "$shape" --nproc 2 --trl-mode "${TRL2_MODE:-fsdp2}" \
            --trl-fallback "${TRL2_FALLBACK:-fsdp1}" \
            --prompts 16 --micro 16 --engine native --variant-timeout "${TRL2_TIMEOUT:-400}" \
            --variants "fsdp=--strategy fsdp" "ddp=--strategy ddp" \
            --out "$out/trl2_${TRL2_MODE:-fsdp2}_$shape.json" 2>&1 | grep -v "it/s\]" | tail -8 ;;
    multi) # weak scaling: 8 prompts x G=8 per GPU; DDP and FSDP2 on 2 GPUs against 1 GPU
        # (MULTI_RUNS: "nproc strategy prompts [numa]" separated by ";", e.g. with 4 GPUs
        # "1 ddp 8;2 ddp 16;4 ddp 32;4 fsdp 32;4 ddp 32 node"; numa: torchrun's --numa-binding)
        IFS=';' read -ra runs <<<"${MULTI_RUNS:-1 ddp 8;2 ddp 16;2 fsdp 16}"
        nvidia-smi topo -m 2>&1 | tee "$out/topo.txt" | head -n 12
        for run in "${runs[@]}"; do
            set -- $run
            python3 -m bench.speed.grpo_step --shape qwen2.5-0.5b --precision bf16 --steps 4 \
                --prompts "$3" --G 8 --max-new 256 --micro 64 --no-grad-ckpt --nproc "$1" --strategy "$2" \
                ${4:+--numa-binding "$4"} --engine native --out "$out/step_${1}gpu_$2${4:+_$4}.json" >/dev/null &&
                python3 -c "import json,sys; m=json.load(open(sys.argv[1]))['median']; print(sys.argv[1], m)" \
                    "$out/step_${1}gpu_$2${4:+_$4}.json"
        done ;;
    dcp) python3 -m bench.speed.fsdp_dcp --nproc 2 --shape smollm2-135m --precision bf16 \
        --out "$out/h200x2_fsdp2_dcp_nccl.json" 2>&1 | tail -25 ;;
    ladder) # one GPU per row; resumable: rows already in bench/results/ladder_h100_2026-11-26.json are kept
        # (copy it back first); LADDER_* as for ladder2; LADDER_TRL=1 runs TRL beside each
        # row (LADDER_BUDGETS picks budgets); LADDER_OUT as for ladder2
        lout=${LADDER_OUT:-bench/results/ladder_h100_2026-11-26.json}
        python3 -m bench.memory.ladder ${LADDER_SHAPES:+--shapes $LADDER_SHAPES} ${LADDER_TRL:+--trl} \
            ${LADDER_BUDGETS:+--budgets $LADDER_BUDGETS} \
            --row-timeout "${LADDER_ROW_TIMEOUT:-150}" --time-budget "${LADDER_TIME_BUDGET:-420}" \
            --out "$lout" 2>&1 | grep -v "it/s\]" | tail -30
        cp "$lout" "$out/$(basename "$lout")" ;;
    ladder2) # the ladder on 2 GPUs per row, as the h100x2 / supercloud profiles run;
        # resumable like ladder. LADDER_SHAPES picks shapes (default all); a call of 10 min
        # starts no row after LADDER_TIME_BUDGET s (default 300), each row at most 240 s.
        # LADDER_OUT writes elsewhere (two ladders side by side on a 4-GPU machine, GPUS=0,1
        # and GPUS=2,3, each on a copy; python -m bench.memory.ladder --merge folds one into another).
        lout=${LADDER_OUT:-bench/results/ladder_h100_2026-11-26.json}
        python3 -m bench.memory.ladder --nproc 2 ${LADDER_SHAPES:+--shapes $LADDER_SHAPES} \
            --row-timeout "${LADDER_ROW_TIMEOUT:-240}" --time-budget "${LADDER_TIME_BUDGET:-300}" \
            --out "$lout" 2>&1 | grep -v "it/s\]" | tail -30
        cp "$lout" "$out/$(basename "$lout")" ;;
    lean) # peak memory vs step time at the 0.5B shape, grpo_hpc alone
        # (TRL's side of the same config: trl stage; 9.38 GiB, ~11 s/step measured before)
        for v in "8192" "4096" "2048" "8192 --ckpt-every 2" "4096 --ckpt-every 2" "4096 --grad-ckpt"; do
            tag=$(echo "$v" | tr -d ' -')
            python3 -m bench.speed.grpo_step --shape qwen2.5-0.5b --precision bf16 --steps 5 --prompts 8 \
                --G 8 --max-new 256 --micro 16 --engine native --no-grad-ckpt --micro-tokens $v \
                --out "$out/lean_$tag.json" 2>&1 | grep -E "time/step|gpu_mem|Error" | tail -3
        done ;;
    tests) # GPU_TESTS picks the tests (default: every GPU test under tests/e2e). The whole
        # log goes to $out as it is written: a call cut at its limit still brings it back.
        python3 -m pytest -v -x -m gpu -p no:cacheprovider ${GPU_TESTS:-tests/e2e} 2>&1 |
            tee "$out/gpu_tests.log" | grep -E "PASSED|FAILED|SKIPPED|ERROR|passed|failed" ;;
    defaults) # TRL once, then the defaults and the variants around them
        python3 -m bench.trl.baseline --shape qwen2.5-0.5b --micro 16 --engine native \
            --variant-timeout "${VARIANT_TIMEOUT:-160}" --variants "default=" \
            "tok16k=--micro-tokens 16384" "previous=--no-grad-ckpt --micro 16 --micro-tokens 8192" \
            --out "$out/h100_trl_vs_grpo_hpc_defaults.json" 2>&1 | grep -v "it/s\]" | tail -12 ;;
    sizes) # the defaults against TRL at the 1.5B and 3B shapes, one GPU (80 GB class);
        # SIZES_REPEAT=N runs each pair N times (TRL's step moves ~25 % between runs)
        for shape in ${SIZES_SHAPES:-qwen2.5-1.5b qwen2.5-3b}; do
            for r in $(seq "${SIZES_REPEAT:-1}"); do
                suffix=$([ "$r" = 1 ] && echo "" || echo "_repeat$r")
                timeout "${SIZES_TIMEOUT:-290}" python3 -m bench.trl.baseline --shape "$shape" \
                    --micro 16 --engine native --variant-timeout 200 --variants "default=" \
                    --out "$out/h100_trl_vs_grpo_hpc_$shape$suffix.json" 2>&1 | grep -v "it/s\]" | tail -4
            done
        done ;;
    profile) # kernel time by phase and category (PROFILE_SHAPES, PROFILE_ARGS)
        python3 -m bench.speed.profile_step --shapes ${PROFILE_SHAPES:-qwen2.5-1.5b qwen2.5-3b} \
            ${PROFILE_ARGS:-} --out "$out/profile" 2>&1 | grep -v "^\[Step" | tail -60 ;;
    packing) # TRL once, then the defaults and packed micro-batches, per shape
        # (SIZES_SHAPES picks shapes; one shape per call fits a 10-minute call at 3B)
        for shape in ${SIZES_SHAPES:-qwen2.5-1.5b qwen2.5-3b}; do
            timeout "${SIZES_TIMEOUT:-560}" python3 -m bench.trl.baseline --shape "$shape" \
                --micro 16 --engine native --variant-timeout 200 --variants "default=" \
                "packed=--packing" ${PACKING_VARIANTS:-} \
                --out "$out/h100_trl_vs_packing_$shape.json" 2>&1 | grep -v "it/s\]" | tail -6
        done ;;
    update_packed) # update MFU at 1.5B and 3B as the default step trains (64 rows of a
        # 300-token prompt + 256 new, 18432-token budget, checkpointing), padded vs packed
        for shape in ${SIZES_SHAPES:-qwen2.5-1.5b qwen2.5-3b}; do
            for lengths in "" "--ragged"; do
                python3 -m bench.speed.update_speed --shape "$shape" --prompt 300 --micro-tokens 18432 \
                    --grad-ckpt --paths fused packed $lengths \
                    --out "$out/h100_update_speed_${shape}${lengths:+_ragged}.json" 2>&1 | grep "^{'path'"
            done
        done ;;
    update_profile) # the packed update profiled (its kernels, not the padded path's)
        python3 -c "import inspect, torch; from torch.nn.attention import varlen as v; \
print(torch.__version__, inspect.signature(v.varlen_attn))" 2>&1 | tail -1
        python3 -m bench.speed.update_speed --shape qwen2.5-1.5b --prompt 300 --micro-tokens 18432 \
            --grad-ckpt --paths packed fused --ragged --reps 2 \
            --out "$out/h100_update_speed_qwen2.5-1.5b_ragged_packed_profile.json" 2>&1 |
            grep -E "^\{'path'|Error" ;;
    update_compiled) # dist.compile (each decoder layer compiled) in the update, per shape
        for shape in ${SIZES_SHAPES:-qwen2.5-1.5b qwen2.5-3b}; do
            python3 -m bench.speed.update_speed --shape "$shape" --prompt 300 --micro-tokens 18432 \
                --grad-ckpt --paths fused packed --ragged --compile --reps 2 \
                --out "$out/h100_update_speed_${shape}_ragged_compiled.json" 2>&1 |
                grep -E "^\{'path'|Error"
        done ;;
    recompute) # the default step with less recompute (CKPT_VARIANTS per shape, "name=flags"
        # separated by ";"), one model per shape built once; medians of steps 2-4
        for shape in ${SIZES_SHAPES:-qwen2.5-0.5b qwen2.5-1.5b qwen2.5-3b}; do
            python3 -c "from pathlib import Path; from bench.common import build_model; \
build_model(Path('/tmp/m-$shape'), '$shape')" || continue
            IFS=';' read -ra variants <<<"${CKPT_VARIANTS:-default=;none=--no-grad-ckpt;every2=--ckpt-every 2}"
            for v in "${variants[@]}"; do
                name=${v%%=*}
                timeout "${CKPT_TIMEOUT:-170}" python3 -m bench.speed.grpo_step --shape "$shape" \
                    --model-dir "/tmp/m-$shape" --steps 4 --engine native ${v#*=} \
                    --out "$out/h100_recompute_${shape}_$name.json" >/dev/null 2>"$out/err_${shape}_$name.txt"
                python3 -c "import json,sys; m=json.load(open(sys.argv[1]))['median']; \
print(sys.argv[2], {k: round(v, 3) for k, v in m.items()})" "$out/h100_recompute_${shape}_$name.json" \
                    "$shape $name" 2>/dev/null || echo "$shape $name failed: $(tail -c 300 "$out/err_${shape}_$name.txt")"
            done
        done ;;
    update) python3 -m bench.speed.update_speed --out "$out/update_speed.json" 2>&1 | tail -45 ;;
    *) echo "unknown stage $stage" ;;
    esac
done
