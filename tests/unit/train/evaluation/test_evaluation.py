"""Held-out evaluation judges answers exactly as the run's training reward does."""

from __future__ import annotations

import pytest

from grpo_hpc.config.load import build_config
from grpo_hpc.config.schema import RewardConfig
from grpo_hpc.train.evaluation import scoring
from grpo_hpc.train.rewards import functions as rewards

# Completions as small models write them: the demo's step-30 model answered in prose
# ("so Hana has 20 + 7 = 27 cards") and never wrote an answer line.
COMPLETIONS = [
    "Hana has 20 cards and gets 7 more, so Hana has 20 + 7 = 27 cards.",
    "20 + 7 = 27\nAnswer: 27",
    "The total is \\boxed{27}.",
    "20 + 7 = 26\nAnswer: 26",
    "Hana has now 16 stamps. Hana has now 16 stamps. Hana has now 16",
    "#### 27",
    "Answer: 27 or 28",
    "",
]
GOLDS = ["27"] * len(COMPLETIONS)


def _training_correctness(rc: RewardConfig) -> list[float]:
    samples = [{"gold": g} for g in GOLDS]
    custom = {spec: rewards.load_custom_reward(spec) for spec in rc.custom}
    return rewards.run_rewards(COMPLETIONS, samples, rc, custom).components["correctness"]


@pytest.mark.parametrize("config", ["demo", "tiny", "gsm8k"])
@pytest.mark.parametrize("require_marker", [True, False])
def test_eval_judges_each_completion_as_the_training_reward(
    config: str, require_marker: bool
) -> None:
    rc = build_config(config, [f"reward.require_marker={str(require_marker).lower()}"]).reward
    assert scoring.judge(COMPLETIONS, GOLDS, rc) == _training_correctness(rc)
    score = scoring.score_eval(COMPLETIONS, GOLDS, rc)
    assert score.correct == sum(_training_correctness(rc))
    assert score.n == len(COMPLETIONS)


def test_prose_answers_count_where_the_run_judges_the_last_number() -> None:
    loose = scoring.score_eval(COMPLETIONS, GOLDS, RewardConfig(require_marker=False))
    strict = scoring.score_eval(COMPLETIONS, GOLDS, RewardConfig(require_marker=True))
    # Answer line, \boxed{} and #### count under both; the prose answer only without a marker.
    assert (strict.correct, strict.strict) == (3, 3)
    assert (loose.correct, loose.strict) == (4, 3)
    assert loose.accuracy == pytest.approx(4 / 8) and loose.strict_accuracy == pytest.approx(3 / 8)


def test_demo_config_evaluates_as_it_rewards() -> None:
    """The demo judges by the last number; its held-out figure must too."""
    rc = build_config("demo", []).reward
    prose = ["So Hana has 20 + 7 = 27 cards."]
    assert scoring.score_eval(prose, ["27"], rc).correct == _prose_reward(rc, prose) == 1


def _prose_reward(rc: RewardConfig, texts: list[str]) -> int:
    return int(sum(rewards.run_rewards(texts, [{"gold": "27"}], rc).components["correctness"]))


@pytest.mark.parametrize(
    ("length", "finished", "buffer", "expected"),
    [
        (48, False, 0, -1.0),  # cut off at the cap: no answer of its own
        (48, True, 0, 0.0),  # ended with EOS exactly at the cap
        (20, True, 16, 0.0),  # well before the buffer
        (40, True, 16, -0.5),  # half-way into the 16-token buffer before a cap of 48
        (48, False, 16, -1.0),
    ],
)
def test_overlong_reward_is_dapo_shaping(
    length: int, finished: bool, buffer: int, expected: float
) -> None:
    assert rewards.overlong_reward(length, finished, 48, buffer) == pytest.approx(expected)


def test_overlong_component_enters_the_total_with_its_weight() -> None:
    lengths = rewards.Lengths([10, 48], [True, False], cap=48)
    rc = RewardConfig(correctness=1.0, format=0.0, overlong=0.5, require_marker=False)
    out = rewards.run_rewards(["Answer: 27", "27 27 27"], [{"gold": "27"}] * 2, rc, None, lengths)
    assert out.components["overlong"] == [0.0, -1.0]
    assert out.total == [1.0, 0.5]


@pytest.mark.parametrize(("n", "world"), [(1319, 1), (1319, 2), (7, 4), (3, 4), (8, 2)])
def test_rank_shares_cover_every_problem_once_in_equal_sizes(n: int, world: int) -> None:
    shares = [scoring.rank_share(n, r, world) for r in range(world)]
    covered = [i for start, stop, _ in shares for i in range(start, stop)]
    assert covered == list(range(n))  # each problem once, in order
    sizes = {stop - start + pad for start, stop, pad in shares}
    assert len(sizes) == 1  # equal work per rank (FSDP generates in lock-step)


class _Recorder:
    """An engine that records each batch it is given and answers with the prompts."""

    def __init__(self) -> None:
        self.batches: list[list[str]] = []

    def generate(self, prompts: list[str], n: int, *, greedy: bool = False) -> object:
        self.batches.append(list(prompts))
        return type("Batch", (), {"texts": [f"<{p}>" for p in prompts]})()


@pytest.mark.parametrize(
    ("n", "world", "per_step", "g"), [(7, 2, 4, 8), (64, 1, 16, 8), (5, 4, 4, 2)]
)
def test_grpo_eval_replays_the_trainers_held_out_batches(
    n: int, world: int, per_step: int, g: int
) -> None:
    """grpo-eval on one device gives the engine exactly the batches the trainer's ranks gave
    theirs (share, padding with the first prompt, rows per call), and keeps each problem's
    completion once, in order."""
    prompts = [f"q{i}" for i in range(n)]
    chunk = scoring.eval_chunk(per_step, g, world)
    trainer = _Recorder()
    for rank in range(world):  # what HeldOutEval._evaluate hands its engine on each rank
        start, stop, pad = scoring.rank_share(n, rank, world)
        mine = prompts[start:stop] + [prompts[0]] * pad
        scoring.generate_greedy(trainer, mine, per_step // world * g)
    replay = _Recorder()
    seen: list[int] = []
    texts = scoring.generate_greedy_ranked(
        replay, prompts, chunk, world, lambda d, s: seen.append(d)
    )
    assert replay.batches == trainer.batches
    assert texts == [f"<{p}>" for p in prompts]
    assert seen == sorted(seen) and seen[-1] == n


def test_grpo_eval_numerics_are_the_trainers() -> None:
    """A model of our runs: fp32 weights, the run's precision as compute dtype (autocast on
    a GPU), the run's engine; a foreign model: bf16 on a GPU; fp32 on a CPU."""
    from grpo_hpc.evaluate.target import numerics_for

    cfg = build_config("tiny", ["dist.precision=bf16", "rollout.engine=native"])
    gpu = numerics_for(cfg, cuda=True)
    assert (gpu.load_dtype, gpu.compute_dtype, gpu.engine, gpu.autocast) == (
        "float32", "bfloat16", "native", True
    )  # fmt: skip
    lora = numerics_for(build_config("tiny", ["dist.precision=bf16", "model.lora_rank=8"]), True)
    assert (lora.load_dtype, lora.compute_dtype) == ("bfloat16", "bfloat16") and lora.autocast
    fp16 = numerics_for(build_config("tiny", ["dist.precision=fp16"]), cuda=True)
    assert fp16.compute_dtype == "float16" and fp16.autocast
    fp32 = numerics_for(build_config("tiny", []), cuda=True)
    assert fp32.compute_dtype == "float32" and not fp32.autocast
    cpu = numerics_for(cfg, cuda=False)
    assert (cpu.load_dtype, cpu.compute_dtype, cpu.autocast) == ("float32", "float32", False)
    foreign = numerics_for(None, cuda=True)
    assert (foreign.load_dtype, foreign.compute_dtype, foreign.engine, foreign.autocast) == (
        "bfloat16", "bfloat16", "auto", True
    )  # fmt: skip
