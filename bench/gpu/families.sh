# Stage file of bench/gpu.sh: the model families the native engine decodes (docs/models.md) on one GPU,
# random weights of their published configs (bench/shapes/<name>/config.json).
#   bash bench/gpu.sh families OUT STAGE...
# Each stage fits one 10-minute call on an H100 (bench/GPU_REAL.md, "Model families"):
#   tests_native  tests/e2e/test_native_families_gpu.py: compiled decode + CUDA graphs + the
#                 Triton attention (sliding windows) against the eager path, log-probs
#                 against fp32, every family at fixture size (57 s on an H100, 2026-11-28)
#   tests_update  tests/e2e/test_update_families_gpu.py: the packed varlen update and the
#                 compiled layers per family (est. 1-3 min)
#                 (after another stage in the same call, tests get what is left of ~580 s)
#   decode        per shape (DECODE_SHAPES, default the first three of the six), one
#                 bench.decode run: native and HF generate tok/s at 64 rows x 256 tokens,
#                 the bf16 agreement with HF generate (32 rows x 128 greedy tokens), weights
#                 --init scaled (DECODE_INIT; bench/decode/run.py's docstring); no shape starts
#                 after DECODE_TIME_BUDGET s (default 400), each at most DECODE_TIMEOUT s
#                 (default 190): gemma-3-1b took 77 s on an H100 (2026-11-28)
#   decode2       the same for the other three (phi-4-mini olmo-2-1b smollm3-3b)
#   trl           Qwen3-1.7B's default step against TRL 1.16 (carry .whl; ~5-7 min)
# NVLink multicast stays off in every process (device_env, bench/gpu/env.sh).
set -uo pipefail
out=${1:?usage: bash bench/gpu.sh families OUT STAGE...}
shift
mkdir -p "$out"
device_env
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
start=$SECONDS
day=$(date +%F)
# the device in result names (h100, h200, ...), from the GPU the call got
dev=${GPU_TAG:-$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -oiE "[ahlv][0-9]+s?" | head -1 | tr "[:upper:]" "[:lower:]")}
decode_shapes() { # one bench.decode process per shape; JSON per shape as bench/results names it
    for shape in "$@"; do
        if ((SECONDS - start > ${DECODE_TIME_BUDGET:-400})); then
            echo "skipped $shape: past DECODE_TIME_BUDGET"
            continue
        fi
        echo "-- $shape $(date +%T)"
        timeout "${DECODE_TIMEOUT:-190}" python3 -m bench.decode --shape "$shape" --batch 64 \
            --max-new 256 --engines native hf --reps 3 --hf-reps 1 --prompts 32 \
            --agree-rows 32 --agree-new 128 --init "${DECODE_INIT:-scaled}" --out "$out/decode_${shape}_${dev:-gpu}_$day.json" 2>&1 |
            grep -E "^(model|agreement|native |hf |engine)|Error|error:" ||
            echo "$shape: no result (timed out or failed)"
    done
}
for stage in "$@"; do
    echo "== $stage $(date +%T)"
    case $stage in
    tests_native | tests_update) # the whole log goes to $out as it is written; after
        # another stage, only what is left of the call's ~580 s
        file=tests/e2e/test_${stage#tests_}_families_gpu.py
        limit=$((580 - (SECONDS - start)))
        limit=$((limit < ${TESTS_TIMEOUT:-560} ? limit : ${TESTS_TIMEOUT:-560}))
        if ((limit < 60)); then
            echo "skipped $stage: $limit s left"
            continue
        fi
        timeout "$limit" python3 -m pytest -v -m gpu -p no:cacheprovider "$file" 2>&1 |
            tee "$out/gpu_${stage}_families.log" | grep -E "PASSED|FAILED|SKIPPED|ERROR|passed|failed" ;;
    decode) # shellcheck disable=SC2086  (a list of shapes)
        decode_shapes ${DECODE_SHAPES:-qwen3-1.7b llama-3.2-1b gemma-3-1b} ;;
    decode2) # shellcheck disable=SC2086
        decode_shapes ${DECODE_SHAPES:-phi-4-mini olmo-2-1b smollm3-3b} ;;
    trl) # TRL once, then grpo_hpc's defaults on the same saved random Qwen3-1.7B
        timeout "${TRL_TIMEOUT:-570}" python3 -m bench.trl.baseline --shape "${TRL_SHAPE:-qwen3-1.7b}" \
            --micro 16 --engine native --variant-timeout 240 --variants "default=" \
            --out "$out/trl_vs_grpo_hpc_${TRL_SHAPE:-qwen3-1.7b}_${dev:-gpu}_$day.json" 2>&1 |
            grep -v "it/s\]" | tail -6 ;;
    *) echo "unknown stage $stage" ;;
    esac
done
