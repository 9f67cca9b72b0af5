"""The prompts and reward both sides of bench/trl/baseline.py train on: grpo_hpc's own
arithmetic questions, or GSM8K train questions in the order grpo_hpc's trainer draws them,
as the chat messages its data module renders."""

from __future__ import annotations

import argparse


def digit_fraction(completions: list, **kwargs: object) -> list[float]:
    """Cheap reward (the cost under test is generation and update, not scoring)."""
    texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
    return [sum(ch.isdigit() for ch in t) / max(len(t), 1) for t in texts]


SEED = 0
"""Both sides' seed: TRL's, and grpo_hpc's ``training.seed``, which orders its prompts."""


def chat(system: str, question: str) -> list[dict[str, str]]:
    """One prompt as the messages grpo_hpc's ``data.prompt_text`` renders: TRL applies the
    same tokenizer's chat template to them, so both sides prefill the same tokens."""
    return [{"role": "system", "content": system}, {"role": "user", "content": question}]


def same_prompts(n: int) -> list[list[dict[str, str]]]:
    """The messages grpo_hpc's trainer sends (system instruction + arithmetic question,
    from its own data module), so both sides prefill and train on the same lengths."""
    from grpo_hpc.config.schema import DataConfig
    from grpo_hpc.tasks.problems import ANSWER_INSTRUCTION, load_problems

    train, _ = load_problems(DataConfig(num_train=n, num_eval=0), seed=0)
    return [chat(ANSWER_INSTRUCTION, p["question"]) for p in train]


def gsm8k_prompts(num_train: int, count: int, seed: int) -> list[list[dict[str, str]]]:
    """``count`` GSM8K train questions in the order grpo_hpc's trainer draws them from its
    first ``num_train`` (its loader, its default system prompt, its seeded sampler), so
    TRL, reading them unshuffled, trains on the same questions step for step."""
    from grpo_hpc.config.schema import DataConfig
    from grpo_hpc.tasks.problems import Sampler, default_instruction, load_problems

    train, _ = load_problems(DataConfig(source="gsm8k", num_train=num_train, num_eval=0), seed)
    system = default_instruction(train)
    return [chat(system, train[i]["question"]) for i in Sampler(len(train), seed).take(count)]


def gsm8k_train_size(args: argparse.Namespace) -> int:
    """Questions grpo_hpc trains from: each one once over the run's steps."""
    return args.prompts * args.steps


def bench_prompts(args: argparse.Namespace) -> list[list[dict[str, str]]]:
    """TRL's dataset: one step's prompts more than the run takes (its loader must not run
    dry); with GSM8K the extra step wraps into the sampler's next epoch, as grpo_hpc would."""
    n = args.prompts * (args.steps + 1)
    if args.prompts_from == "gsm8k":
        return gsm8k_prompts(gsm8k_train_size(args), n, SEED)
    return same_prompts(n)
