"""The streaming judge (``rollout.stream_scoring``): rows handed over as token ids, judged by
the real math-verify worker and run in the real code sandbox on a thread; the scoring
after generation then takes those results and gives the same scores as scoring
everything at the end."""

from __future__ import annotations

import functools

import pytest

from grpo_hpc.train.rewards.code import code_job, code_scores
from grpo_hpc.train.rewards.functions import Ahead, correctness_job, score_correctness
from grpo_hpc.train.rewards.streaming import StreamingJudge, completion_text
from grpo_hpc.train.rewards.verifier import VERIFIER
from grpo_hpc.train.setup.models import char_tokenizer

# Rows of two prompts x G=3: four answers only math-verify can settle (percent, LaTeX, a
# fraction against a whole number) and two the pre-judge settles.
GOLDS = ["#### 0.5"] * 3 + ["#### 12"] * 3
TEXTS = [
    "So it is half. Answer: 50\\%",  # right
    "Answer: \\sqrt{4}",  # wrong
    "Answer: 0.5",  # a plain number: the pre-judge settles it (right)
    "Answer: 1200\\%",  # right
    "Answer: 1/2",  # wrong
    "no answer at all",  # the pre-judge scores it 0
]
SCORES = [1.0, 0.0, 1.0, 1.0, 0.0, 0.0]
SAMPLES = [{"gold": g} for g in GOLDS]


@pytest.fixture(scope="module")
def tok():  # noqa: ANN201
    return char_tokenizer()


def _ids(tok, text: str) -> list[int]:  # noqa: ANN001
    """A finished row as the engine hands it over: the completion, EOS, then padding."""
    ids = tok(text, add_special_tokens=False).input_ids
    return ids + [tok.eos_token_id] + [tok.pad_token_id] * 5


def _judge(tok) -> StreamingJudge:  # noqa: ANN001
    return StreamingJudge(SAMPLES, functools.partial(completion_text, tok), 5.0)


def test_completion_text_is_the_text_up_to_eos(tok) -> None:  # noqa: ANN001
    ids = _ids(tok, "Answer: 7") + tok("junk after", add_special_tokens=False).input_ids
    assert completion_text(tok, ids) == "Answer: 7"
    assert completion_text(tok, tok("no eos", add_special_tokens=False).input_ids) == "no eos"


def test_streamed_verdicts_give_the_scores_of_judging_at_the_end(tok) -> None:  # noqa: ANN001
    judge = _judge(tok)
    judge.offer([3, 0], [_ids(tok, TEXTS[3]), _ids(tok, TEXTS[0])])  # as rows finish
    judge.offer([1, 2, 4, 5], [_ids(tok, t) for t in (TEXTS[1], TEXTS[2], TEXTS[4], TEXTS[5])])
    verdicts = judge.finish().verdicts
    assert judge.error is None and judge.rows == 6
    # exactly the questions math-verify had to answer, each once
    prejudged = [correctness_job(t, g) for t, g in zip(TEXTS, GOLDS, strict=True)]
    assert set(verdicts) == {job for score, job in prejudged if score is None}
    assert len(verdicts) == 4
    assert all(not failed for _, failed in verdicts.values())
    VERIFIER.take_stats()
    with_head_start = score_correctness(TEXTS, GOLDS, 5.0, verdicts=verdicts)
    assert VERIFIER.take_stats()[0] == 0  # nothing left to judge after generation
    at_the_end = score_correctness(TEXTS, GOLDS, 5.0)
    assert VERIFIER.take_stats()[0] == 4
    assert with_head_start == at_the_end == (SCORES, 0)


def test_a_verdict_kept_for_another_text_is_not_used(tok) -> None:  # noqa: ANN001
    """Verdicts are kept by the math-verify job: a row decoded differently from the batch's
    text (here: another answer) is judged again, not given the other's score."""
    judge = _judge(tok)
    judge.offer([0], [_ids(tok, "Answer: 25\\%")])  # wrong: 25 % is not 0.5
    verdicts = judge.finish().verdicts
    assert list(verdicts.values()) == [(0.0, False)]
    assert score_correctness(TEXTS[:1], GOLDS[:1], 5.0, verdicts=verdicts) == ([1.0], 0)


def test_a_timed_out_verdict_counts_as_a_failure_once(tok) -> None:  # noqa: ANN001
    _, job = correctness_job(TEXTS[0], GOLDS[0])
    assert score_correctness(TEXTS[:1] * 2, GOLDS[:1] * 2, 5.0, verdicts={job: (0.0, True)}) == (
        [0.0, 0.0],
        1,
    )


def test_a_failing_thread_costs_the_head_start_only(tok) -> None:  # noqa: ANN001
    def broken(ids: list[int]) -> str:
        raise UnicodeDecodeError("utf-8", b"", 0, 1, "broken on purpose")

    judge = StreamingJudge(SAMPLES, broken, 5.0)
    judge.offer([0], [_ids(tok, TEXTS[0])])
    judge.offer([1], [_ids(tok, TEXTS[1])])  # queued behind the failure: still drained
    assert judge.finish() == Ahead()
    assert isinstance(judge.error, UnicodeDecodeError)
    assert score_correctness(TEXTS, GOLDS, 5.0, verdicts={})[0] == SCORES


def test_close_skips_what_is_queued(tok) -> None:  # noqa: ANN001
    judge = _judge(tok)
    judge._cancel.set()  # as close() does, before the thread reaches the rows
    judge.offer([0, 1], [_ids(tok, TEXTS[0]), _ids(tok, TEXTS[1])])
    judge.close()
    assert judge.ahead == Ahead() and judge.error is None


def _chunks(tok, text: str, size: int = 4) -> list[list[int]]:  # noqa: ANN001
    """A running row's tokens as the host checks show them: ``size`` new ones each time."""
    ids = tok(text, add_special_tokens=False).input_ids
    return [ids[i : i + size] for i in range(0, len(ids), size)]


def _run_row(judge: StreamingJudge, tok, row: int, text: str) -> None:  # noqa: ANN001
    for chunk in _chunks(tok, text):
        judge.running([row], [chunk])


def test_an_answer_written_before_the_row_ends_is_judged_ahead(tok) -> None:  # noqa: ANN001
    """A row that rambles on after its answer line to the length cap is never handed over
    finished; its answer was judged while it decoded, and the scoring after generation
    finds the verdict (rollout.judge_running)."""
    final = "So it is half.\nAnswer: 50\\%\nAnd then the model goes on and on"
    judge = _judge(tok)
    _run_row(judge, tok, 0, final)
    verdicts = judge.finish().verdicts
    assert judge.guessed == 1 and judge.rows == 0
    VERIFIER.take_stats()
    assert score_correctness([final], GOLDS[:1], 5.0, verdicts=verdicts) == ([1.0], 0)
    assert VERIFIER.take_stats()[0] == 0  # nothing left to judge after generation


def test_a_guess_waits_for_the_line_and_follows_a_corrected_answer(tok) -> None:  # noqa: ANN001
    """No guess from an answer line still being written ("Answer: 5" of "Answer: 50%"), one
    per distinct answer; the final text's answer is the last one, and its verdict is ready."""
    judge = _judge(tok)
    _run_row(judge, tok, 3, "Answer: 1")  # no line break yet: no guess
    _run_row(judge, tok, 3, "200\\%\nwait, no.\nAnswer: 12.5\\%\nchecking again\n")
    verdicts = judge.finish().verdicts
    assert judge.guessed == 2  # "1200\\%" (right) and "12.5\\%" (wrong), each once
    assert {job[0] for job in verdicts} == {"1200\\%", "12.5\\%"}
    final = "Answer: 1200\\%\nwait, no.\nAnswer: 12.5\\%\nchecking again\n"
    VERIFIER.take_stats()
    assert score_correctness([final], GOLDS[3:4], 5.0, verdicts=verdicts) == ([0.0], 0)
    assert VERIFIER.take_stats()[0] == 0


def test_no_guess_from_a_number_mid_reasoning(tok) -> None:  # noqa: ANN001
    """With reward.require_marker=false a completion without a convention is judged by its
    last number; a row's numbers mid-reasoning are not guesses at it."""
    judge = StreamingJudge(
        SAMPLES, functools.partial(completion_text, tok), 5.0, require_marker=False
    )
    _run_row(judge, tok, 0, "Half of 12 is 6.\nThen 6 / 12 = 1/2\nso 50\\%\n")
    assert judge.finish().verdicts == {} and judge.guessed == 0


def test_a_finished_row_is_judged_as_handed_over_after_its_guesses(tok) -> None:  # noqa: ANN001
    """Guesses and the finished text meet in one set of verdicts: the finished row's own
    job is judged (here another answer than the guess), nothing twice."""
    judge = _judge(tok)
    _run_row(judge, tok, 4, "Answer: 1200\\%\n")
    judge.offer([4], [_ids(tok, "Answer: 1200\\%\nno: Answer: 1/2")])
    verdicts = judge.finish().verdicts
    assert judge.guessed == 1 and judge.rows == 1
    assert sorted(job[0] for job in verdicts) == ["1/2", "1200\\%"]


CODE = {"tests": ["assert double(2) == 4", "assert double(-1) == -2"], "setup": "import math"}
PROGRAMS = [
    "```python\ndef double(x):\n    return 2 * x\n```",  # passes
    "```python\ndef double(x):\n    return x + 2\n```",  # fails the second test
    "```python\ndef double(x):\n    return 2 * x\n```",  # the first again: run once
]


def test_code_rewards_run_while_decoding_are_the_rewards_after(tok) -> None:  # noqa: ANN001
    judge = StreamingJudge([CODE] * 3, functools.partial(completion_text, tok), 5.0,
                           correctness=False, code_workers=2)  # fmt: skip
    judge.offer([0, 1], [_ids(tok, PROGRAMS[0]), _ids(tok, PROGRAMS[1])])
    judge.offer([2], [_ids(tok, PROGRAMS[2])])
    ahead = judge.finish()
    assert judge.error is None and ahead.verdicts == {}
    assert sorted(ahead.code.values()) == [0.0, 1.0]  # two distinct programs, each run once
    after = code_scores(PROGRAMS, [CODE] * 3)
    assert code_scores(PROGRAMS, [CODE] * 3, known=ahead.code) == after == [1.0, 0.0, 1.0]


def test_code_scores_do_not_run_what_is_known() -> None:
    """A known result is taken as it is (here a deliberately wrong one: proof that the
    program did not run again); the rest run."""
    known = {code_job(PROGRAMS[1], CODE): 1.0}
    assert code_scores(PROGRAMS[:2], [CODE] * 2, known=known) == [1.0, 1.0]
