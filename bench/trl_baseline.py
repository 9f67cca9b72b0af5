"""Benchmark: TRL's ``GRPOTrainer`` and grpo_hpc's trainer on the same machine, the same
random model, batch, lengths and beta, in one command; writes ``speedup_vs_trl``.

TRL is configured like the issue's reference run: HF generate (no vLLM), gradient
checkpointing, bf16 autocast over fp32 weights, ``prompts x G`` completions per
optimizer step in micro-batches of ``--micro`` completions. Steps are timed with a
callback (optimizer step to optimizer step, first step dropped as warm-up). grpo_hpc
runs through ``bench/grpo_step.py`` (``torchrun -m grpo_hpc.train``) with the same shape.

    python bench/trl_baseline.py --shape qwen2.5-0.5b --out bench/results/trl_vs_grpo_hpc.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import SHAPES, build_model, env_info, write_result  # noqa: E402


def digit_fraction(completions: list, **kwargs: object) -> list[float]:
    """Cheap reward (the cost under test is generation and update, not scoring)."""
    texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
    return [sum(ch.isdigit() for ch in t) / max(len(t), 1) for t in texts]


def same_prompts(n: int) -> list[list[dict]]:
    """The messages grpo_hpc's trainer sends (system instruction + arithmetic question,
    from its own data module), so both sides prefill and train on the same lengths."""
    from grpo_hpc.config import DataConfig
    from grpo_hpc.train.data import ANSWER_INSTRUCTION, load_problems

    train, _ = load_problems(DataConfig(num_train=n, num_eval=0), seed=0)
    return [
        [
            {"role": "system", "content": ANSWER_INSTRUCTION},
            {"role": "user", "content": p["question"]},
        ]
        for p in train
    ]


def run_trl(args: argparse.Namespace, model_dir: Path, work: Path) -> dict:
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    class StepTimer(TrainerCallback):
        def __init__(self) -> None:
            self.times: list[float] = []
            self.t0 = 0.0

        def on_step_begin(self, *a: object, **k: object) -> None:
            torch.cuda.synchronize()
            self.t0 = time.perf_counter()

        def on_step_end(self, *a: object, **k: object) -> None:
            torch.cuda.synchronize()
            self.times.append(time.perf_counter() - self.t0)

    data = Dataset.from_dict({"prompt": same_prompts(args.prompts * (args.steps + 1))})
    completions = args.prompts * args.G
    config = GRPOConfig(
        output_dir=str(work / "trl"),
        per_device_train_batch_size=args.micro,
        gradient_accumulation_steps=completions // args.micro,
        num_generations=args.G,
        max_completion_length=args.max_new,
        beta=args.beta,
        learning_rate=1e-6,
        bf16=True,
        gradient_checkpointing=True,
        max_steps=args.steps,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        temperature=1.0,
        top_p=1.0,
        seed=0,
    )
    timer = StepTimer()
    trainer = GRPOTrainer(
        model=str(model_dir),
        reward_funcs=digit_fraction,
        args=config,
        train_dataset=data,
        callbacks=[timer],
    )
    torch.cuda.reset_peak_memory_stats()
    trainer.train()
    steps = timer.times[1:]
    tokens = completions * args.max_new
    return {
        "s_per_step_median": statistics.median(steps),
        "s_per_step_all": timer.times,
        "completion_tok_per_s_upper": tokens / statistics.median(steps),
        "peak_gib": torch.cuda.max_memory_allocated() / 2**30,
    }


def run_ours(args: argparse.Namespace, work: Path) -> dict:
    out = work / "ours.json"
    cmd = [
        sys.executable,
        str(Path(__file__).with_name("grpo_step.py")),
        f"--shape={args.shape}",
        "--precision=bf16",
        f"--prompts={args.prompts}",
        f"--G={args.G}",
        f"--max-new={args.max_new}",
        f"--micro={args.micro}",
        f"--micro-tokens={args.micro_tokens}",
        f"--steps={args.steps}",
        f"--engine={args.engine}",
        f"--out={out}",
        *args.ours_extra,
    ]
    subprocess.run(cmd, check=True)
    return json.loads(out.read_text())


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--shape", choices=sorted(SHAPES), default="qwen2.5-0.5b")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--G", type=int, default=8)
    p.add_argument("--max-new", type=int, default=256)
    p.add_argument("--micro", type=int, default=16, help="completions per micro-batch")
    p.add_argument("--micro-tokens", type=int, default=8192, help="grpo_hpc token budget")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--beta", type=float, default=0.0)
    p.add_argument("--engine", default="auto", help="grpo_hpc rollout.engine")
    p.add_argument("--ours-extra", nargs="*", default=[], help="more grpo_step.py flags")
    p.add_argument("--skip-trl", action="store_true", help="only grpo_hpc (debugging)")
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as d:
        work = Path(d)
        build_model(work / "model", args.shape)
        ours = run_ours(args, work)
        trl = None if args.skip_trl else run_trl(args, work / "model", work)
    ours_step = ours["median"]["time/step"]
    result = {
        "benchmark": "trl_vs_grpo_hpc",
        "config": vars(args) | {"out": str(args.out) if args.out else None},
        "trl": trl,
        "grpo_hpc": ours,
        "speedup_vs_trl": trl["s_per_step_median"] / ours_step if trl else None,
        "memory_ratio_vs_trl": ours["median"].get("gpu_mem_gb", 0) / trl["peak_gib"]
        if trl
        else None,
        "env": env_info(),
    }
    write_result(result, args.out)
    print(json.dumps({k: result[k] for k in ("speedup_vs_trl", "memory_ratio_vs_trl")}))
    if trl:
        print(f"TRL      {trl['s_per_step_median']:.2f} s/step  peak {trl['peak_gib']:.1f} GiB")
    mem = ours["median"].get("gpu_mem_gb", float("nan"))
    print(f"grpo_hpc {ours_step:.2f} s/step  peak {mem:.1f} GiB")


if __name__ == "__main__":
    main()
