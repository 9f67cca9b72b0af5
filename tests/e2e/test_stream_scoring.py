"""Scoring while the rollout decodes (``rollout.stream_scoring``), end to end: the native
engine hands over the rows the real SmolLM2-135M-Instruct finished, as the batch decodes
them, without changing what it samples; and a run with it trains step for step like one
without it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.e2e.helpers import make_run, train_side_by_side
from tests.e2e.test_trainer_behaviour import _metrics

QUESTIONS = ["What is 2+3?", "What is 7 times 6?", "Is 9 greater than 4?", "Name a prime."]


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory: pytest.TempPathFactory, smollm2_cache: Path):  # noqa: ANN201
    from grpo_hpc.config.schema import ModelConfig
    from grpo_hpc.train.setup import models

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GRPO_HPC_CACHE", str(smollm2_cache))
        out = tmp_path_factory.mktemp("smollm2")
        path = models.materialize(ModelConfig(name_or_path=models.SMOLLM2), out, 0)
    model, tok = models.load_model_and_tokenizer(path, "sdpa", torch.device("cpu"))
    return model.eval(), tok


def test_finished_rows_are_handed_over_as_the_batch_decodes_them(smollm2) -> None:  # noqa: ANN001
    from grpo_hpc.tasks.problems import prompt_text
    from grpo_hpc.train.rewards.streaming import completion_text
    from grpo_hpc.train.rollout.native.engine import NativeEngine

    model, tok = smollm2
    prompts = [prompt_text(tok, q) for q in QUESTIONS]
    engine = NativeEngine(model, tok, 64, 0.9, 1.0, 600)
    handed: list[tuple[list[int], list[list[int]]]] = []
    shown: dict[int, list[int]] = {}

    def running(rows: list[int], ids: list[list[int]]) -> None:
        for row, new in zip(rows, ids, strict=True):
            shown.setdefault(row, []).extend(new)

    torch.manual_seed(0)
    batch = engine.generate(
        prompts, 4, on_done=lambda rows, ids: handed.append((rows, ids)), on_running=running
    )
    torch.manual_seed(0)
    alone = engine.generate(prompts, 4)
    assert torch.equal(batch.input_ids, alone.input_ids)  # handing over samples nothing else
    rows = [r for chunk, _ in handed for r in chunk]
    assert len(handed) > 1 and len(rows) == len(set(rows))  # at several checks, each row once
    assert 0 < len(rows) < 16  # some rows, not the ones that ended with the rollout
    ended = batch.completion_mask.sum(1)
    for chunk, ids in handed:
        for row, tokens in zip(chunk, ids, strict=True):
            assert batch.finished[row] and ended[row] <= len(tokens)
            assert completion_text(tok, tokens) == batch.texts[row]
    # every row still decoding at a check was shown its new tokens, in order: a prefix of
    # its completion (the rows that ended with the rollout up to the last check)
    completion = batch.input_ids[:, batch.prompt_len :].tolist()
    assert set(shown) | set(rows) == set(range(16))
    assert set(range(16)) - set(rows) <= set(shown)
    for row, tokens in shown.items():
        assert tokens == completion[row][: len(tokens)]
        assert row in rows or len(tokens) >= 48  # checks every 16 tokens, 64 at most


CODE_TASK = ("data.source=humaneval", "data.num_train=8", "reward.correctness=0", "reward.code=1")


@pytest.mark.parametrize("task", ["math", "code"])
def test_a_run_streaming_its_scoring_trains_like_one_scoring_after(
    tmp_path: Path, task: str
) -> None:
    """Math: correctness (math-verify) and a custom reward; code: the code sandbox."""
    # 40 new tokens: the engine's checks (every 16) come while rows still decode
    steps = ("training.max_steps=3", "rollout.engine=native", "rollout.max_new_tokens=40")
    steps += ("training.eval_every=0",) + (CODE_TASK if task == "code" else ())
    streamed = make_run(tmp_path, "streamed", *steps)
    after = make_run(tmp_path, "after", *steps, "rollout.stream_scoring=false")
    train_side_by_side(streamed, after)
    a, b = ([m for m in _metrics(p) if "loss" in m] for p in (streamed, after))
    assert [m["step"] for m in a] == [1, 2, 3]
    reward = "reward/code" if task == "code" else "reward/correctness"
    for key in ("loss", "grad_norm", "reward/mean", reward):
        assert [m[key] for m in a] == [m[key] for m in b], key
    assert all(m["reward/verify_streamed"] == m["rollout/streamed"] == 0 for m in b)
    assert all(0 <= m["reward/verify_streamed"] <= m["reward/verify_items"] for m in a)
    for m in a + b:  # one rank: what was judged after generation is the rest
        assert m["reward/verify_after"] == m["reward/verify_items"] - m["reward/verify_streamed"]
    assert any(m["rollout/streamed"] > 0 for m in a)  # rows were scored while others decoded
