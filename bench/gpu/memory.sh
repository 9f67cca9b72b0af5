# Stage file of bench/gpu.sh: a run's GPU memory and step under bench/memory/probe.py on a lent
# 2-GPU machine (nvidia-h100-x2), in one call:
#   bash bench/gpu.sh memory OUT [STAGE...]   (default: 7b 7b_sync small)
#   7b        the 2-GPU ladder's 7B full-parameter plan (h100x2: FSDP2, checkpointing, engine
#             released) under bench/memory/probe.py, 2 steps, the allocator's history over
#             step 2's update (7b_plan.json)
#   7b_sync   the same plan reduce-scattering after every micro-batch, 3 steps
#             (PROBE_FSDP_SYNC_EACH=1; 7b_sync_each.json)
#   7b_offload  the plan with FSDP2 CPU offload (dist.cpu_offload) and the per-micro-batch
#             reduce-scatter, 2 steps (7b_offload.json; not run yet)
#   7b_int8   7B full-parameter on 2 GPUs with 8-bit AdamW moments (optim.state=int8, torchao
#             from .whl) and the engine kept: FSDP2, checkpointing, compiled, 4096-token
#             micro-batches, 8 prompts x G=8 per GPU, 512 tokens, capped at 80 GiB, 3 steps
#             under the probe (7b_int8.json; not run yet)
#   small     the weak-scaling shape of the `multi` stage of `bench/gpu.sh random` (SMALL_SHAPE, default
#             qwen2.5-0.5b; 8 prompts x G=8 per GPU, 256 new tokens) on 2 GPUs, the runs named
#             in SMALL_RUNS (default: ddp_auto fsdp_auto fsdp_compile_pack
#             fsdp_compile_pack_noreshard; also one_gpu, fsdp_noreshard): DDP auto, FSDP2
#             auto, FSDP2 with compiled layers + packing forced, that with
#             reshard_after_forward=False (on every fully_shard, through the probe), and
#             fsdp_cp_cfg: compiled + packed with the config key dist.reshard_after_forward=false
#             (decoder layers only); 5 steps, step 5 under torch.profiler (rank 0), medians of
#             steps 2-4 (small_<shape>.json). SMALL_FLAGS replaces the memory flags
#             (default "--micro 64 --no-grad-ckpt"; "" runs the project's defaults).
# PROBE_DEADLINE (s, default 480): start no run after this many seconds.
set -uo pipefail
out=${1:?usage: bash bench/gpu.sh memory OUT [STAGE...]}
shift
stages=${*:-7b 7b_sync small}
mkdir -p "$out"
device_env
start=$SECONDS
deadline=${PROBE_DEADLINE:-480}
late() {
    if ((SECONDS - start > deadline)); then
        echo "skip $1: past the ${deadline}s deadline"
        return 0
    fi
    return 1
}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch; print('torch', torch.__version__, torch.cuda.device_count())"
shape=${SMALL_SHAPE:-qwen2.5-0.5b}
small() { # name nproc strategy extra-args... (each run's probe files in /tmp/probe-$name)
    local name=$1 nproc=$2 strategy=$3
    shift 3
    late "$name" && return
    rm -rf "/tmp/probe-$name"
    echo "== $name $(date +%T)"
    PROBE_OUT=/tmp/probe-$name PROBE_PROFILE_STEP=5 timeout "${SMALL_TIMEOUT:-150}" \
        python3 -m bench.speed.grpo_step --shape "$shape" --precision bf16 --steps 5 \
        --prompts $((8 * nproc)) --G 8 --max-new 256 ${SMALL_FLAGS---micro 64 --no-grad-ckpt} \
        --nproc "$nproc" \
        --strategy "$strategy" --engine native --probe "$@" \
        --out "/tmp/probe-$name/step.json" >/dev/null 2>"/tmp/probe-$name.err" ||
        echo "$name failed: $(grep -E 'Error|error' "/tmp/probe-$name.err" | tail -3)"
    python3 -m bench.memory.probe merge --name "$name" --step-json "/tmp/probe-$name/step.json" \
        --probe-dir "/tmp/probe-$name" --into "$out/small_${shape#qwen2.5-}.json"
}
for stage in $stages; do
    case $stage in
    7b)
        late 7b && continue
        echo "== 7b $(date +%T)"
        PROBE_HISTORY_STEP=2 python3 -m bench.memory.probe ladder --shape qwen2.5-7b --nproc 2 \
            --steps 2 --timeout 210 --out /tmp/probe-7b --summary "$out/7b_plan.json" 2>&1 |
            tail -3 ;;
    7b_sync)
        late 7b_sync && continue
        echo "== 7b_sync $(date +%T)"
        PROBE_FSDP_SYNC_EACH=1 python3 -m bench.memory.probe ladder --shape qwen2.5-7b --nproc 2 \
            --steps 3 --timeout 200 --out /tmp/probe-7b-sync --summary "$out/7b_sync_each.json" \
            2>&1 | tail -3 ;;
    7b_offload)
        late 7b_offload && continue
        echo "== 7b_offload $(date +%T)"
        PROBE_FSDP_SYNC_EACH=1 python3 -m bench.memory.probe ladder --shape qwen2.5-7b --nproc 2 \
            --steps 2 --cpu-offload --timeout "${OFFLOAD_TIMEOUT:-300}" --out /tmp/probe-7b-off \
            --summary "$out/7b_offload.json" 2>&1 | tail -3 ;;
    7b_int8)
        late 7b_int8 && continue
        echo "== 7b_int8 $(date +%T)"
        rm -rf /tmp/probe-7b-int8
        PROBE_OUT=/tmp/probe-7b-int8 timeout "${INT8_TIMEOUT:-300}" python3 -m bench.speed.grpo_step \
            --shape qwen2.5-7b --precision bf16 --steps 3 --prompts 16 --G 8 --max-new 512 \
            --nproc 2 --strategy fsdp --engine native --grad-ckpt --micro-tokens 4096 \
            --cap-gib 80 --probe --override optim.state=int8 \
            --out /tmp/probe-7b-int8/step.json >/dev/null 2>/tmp/probe-7b-int8.err ||
            echo "7b_int8 failed: $(grep -E 'Error|error' /tmp/probe-7b-int8.err | tail -3)"
        python3 -m bench.memory.probe merge --name 7b_int8 --step-json /tmp/probe-7b-int8/step.json \
            --probe-dir /tmp/probe-7b-int8 --into "$out/7b_int8.json" ;;
    small)
        for run in ${SMALL_RUNS:-ddp_auto fsdp_auto fsdp_compile_pack fsdp_compile_pack_noreshard}; do
            case $run in
            one_gpu) small one_gpu 1 ddp ;;
            ddp_auto) small ddp_auto 2 ddp ;;
            fsdp_auto) small fsdp_auto 2 fsdp ;;
            fsdp_noreshard) PROBE_RESHARD_AFTER_FORWARD=0 small fsdp_noreshard 2 fsdp ;;
            fsdp_compile_pack) small fsdp_compile_pack 2 fsdp --compile --packing ;;
            fsdp_compile_pack_noreshard)
                PROBE_RESHARD_AFTER_FORWARD=0 small fsdp_compile_pack_noreshard 2 fsdp \
                    --compile --packing ;;
            fsdp_cp_cfg) small fsdp_cp_cfg 2 fsdp --compile --packing \
                --override dist.reshard_after_forward=false ;;
            *) echo "unknown small run $run" ;;
            esac
        done ;;
    *) echo "unknown stage $stage" ;;
    esac
done
echo "done in $((SECONDS - start)) s"
