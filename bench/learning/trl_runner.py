"""TRL's side of bench/learning/run.py: ``run_trl`` trains with TRL's GRPOTrainer on the task of
bench/sums_task.py and times it with a callback (``Clock``) that evaluates the held-out
problems with grpo_hpc's native engine, its own time excluded.

Separate from bench/learning/run.py because it is the one part that needs TRL (imported only
when a TRL run starts) and the one that maps grpo_hpc's settings onto another trainer's.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from bench.sums_task import REWARD, SYSTEM, data_config, reward_config
from grpo_hpc.tasks import problems as data
from grpo_hpc.train.evaluation.scoring import score_eval
from grpo_hpc.train.rewards import functions as rewards

# TRL's log_history -> the same per-step fields
TRL_FIELDS = {
    "entropy": "entropy",
    "length": "completions/mean_length",
    "grad_norm": "grad_norm",
    "clip_frac": "clip_ratio/region_mean",
    "cut": "completions/clipped_ratio",
}


def run_trl(
    args: argparse.Namespace, model_dir: Path, work: Path, cuda: bool, seed: int, precision: str
) -> dict:
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from grpo_hpc.train.rollout.native.engine import NativeEngine

    cfg = data_config(args)
    train, held_out = data.load_problems(cfg, seed)
    order = data.Sampler(len(train), seed).take(args.prompts * (args.steps + 1))
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
    task = reward_config(args)
    weights = {"correctness": task.correctness, "format": task.format}

    def reward(completions: list, gold: list, completion_ids: list, **kw: object) -> list[float]:
        texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
        # Finished = ended at a token TRL stops on (its eos_token_ids: the generation
        # config's and the tokenizer's), as grpo_hpc's engines judge it by their stop token.
        stops = set(trainer.eos_token_ids)
        lengths = rewards.Lengths(
            [len(ids) for ids in completion_ids],
            [bool(ids) and ids[-1] in stops for ids in completion_ids],
            args.max_new,
            task.overlong_buffer,
        )
        out = rewards.compute_rewards(
            texts,
            [{"gold": g} for g in gold],
            weights | {"overlong": task.overlong},
            timeout_s=task.timeout_s,
            require_marker=task.require_marker,
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
                dtype = torch.bfloat16 if cuda else torch.float32  # the evaluation: as grpo_hpc's
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
        mask_truncated_completions=args.overlong == "mask",
        learning_rate=args.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        adam_beta1=0.9,
        adam_beta2=0.99,
        weight_decay=0.0,
        max_grad_norm=1.0,
        bf16=cuda and precision == "bf16",
        use_cpu=not cuda,
        gradient_checkpointing=False,
        model_init_kwargs={"dtype": torch.float32},
        shuffle_dataset=False,
        max_steps=args.steps,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        seed=seed,
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
    steps = []
    for h in trainer.state.log_history:
        if "reward" in h:
            step = {"step": h["step"], "reward": h["reward"]}
            steps.append(step | {k: h[m] for k, m in TRL_FIELDS.items() if m in h})
    return {"evals": clock.evals, "steps": steps}
