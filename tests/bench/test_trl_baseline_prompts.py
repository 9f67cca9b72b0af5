"""bench/trl/baseline.py's real-length mode (its prompts in bench/trl/prompts.py, TRL's run in
bench/trl/trl_run.py): TRL gets the GSM8K questions grpo_hpc's trainer draws, in its order,
and both sides' length logs summarise alike."""

from __future__ import annotations

import argparse

from bench import common
from bench.speed import grpo_step
from bench.trl import baseline as trl_baseline
from bench.trl import prompts, trl_run
from grpo_hpc.config.schema import DataConfig
from grpo_hpc.tasks import problems as data
from grpo_hpc.train.rewards.functions import ANSWER_INSTRUCTION


def trainer_questions(num_train: int, seed: int, prompts: int, steps: int) -> list[str]:
    """What grpo_hpc's trainer trains on: its loader, then its sampler, step by step."""
    train, _ = data.load_problems(DataConfig(source="gsm8k", num_train=num_train, num_eval=0), seed)
    sampler = data.Sampler(len(train), seed)
    return [train[i]["question"] for _ in range(steps) for i in sampler.take(prompts)]


def test_gsm8k_prompts_follow_the_trainers_order_into_the_next_epoch() -> None:
    # 3 steps of 4 from 8 questions: the third step wraps into the sampler's next epoch
    msgs = prompts.gsm8k_prompts(num_train=8, count=12, seed=3)
    assert [m[1]["content"] for m in msgs] == trainer_questions(8, 3, 4, 3)
    assert all(m[0] == {"role": "system", "content": ANSWER_INSTRUCTION} for m in msgs)


def test_both_sides_get_the_same_gsm8k_questions() -> None:
    args = argparse.Namespace(prompts=2, steps=3, prompts_from="gsm8k")
    flags = trl_baseline.ours_data_flags(args)
    assert flags == ["--source=gsm8k", "--num-train=6"]
    ours = grpo_step.data_overrides(argparse.Namespace(source="gsm8k", num_train=6))
    assert ours == ["data.source=gsm8k", "data.num_train=6", "data.num_eval=0", "optim.lr=1e-6"]
    msgs = prompts.bench_prompts(args)
    # TRL's loader gets one step more than the run takes; the steps run match grpo_hpc's
    want = trainer_questions(6, prompts.SEED, 2, 3)
    assert [m[1]["content"] for m in msgs][:6] == want


def test_arithmetic_mode_is_unchanged() -> None:
    args = argparse.Namespace(prompts=2, steps=1, prompts_from="arithmetic")
    assert trl_baseline.ours_data_flags(args) == []
    assert grpo_step.data_overrides(argparse.Namespace(source="arithmetic", num_train=0)) == []
    assert prompts.bench_prompts(args) == prompts.same_prompts(4)


def test_length_summary_reads_each_loggers_keys() -> None:
    trl_log = [
        {"completions/mean_length": 200.0, "completions/clipped_ratio": 0.25},
        {"completions/mean_length": 100.0, "completions/clipped_ratio": 0.0},
        {"train_runtime": 9.0},  # TRL's closing entry has no lengths
    ]
    assert trl_run.trl_lengths(trl_log) == {
        "mean_length": 150.0,
        "cut_share": 0.125,
        "steps": 2,
    }
    ours = [{"gen_len/mean": 512.0, "rollout/truncated": 1.0}]
    summary = common.length_summary(ours, "gen_len/mean", "rollout/truncated")
    assert summary == {"mean_length": 512.0, "cut_share": 1.0, "steps": 1}
    assert common.length_summary([], "a", "b")["mean_length"] is None
