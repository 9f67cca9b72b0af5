"""Reward functions, with the real math-verify and real sandbox subprocesses (no mocks)."""

from __future__ import annotations

import math
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from grpo_hpc.core.errors import ConfigError
from grpo_hpc.train.rewards.functions import (
    ANSWER_INSTRUCTION,
    code_reward,
    compute_rewards,
    correctness_reward,
    extract_answer,
    extract_code,
    extract_gold,
    format_reward,
    load_custom_reward,
    score_correctness,
    score_correctness_batch,
)

TOWER = r"\boxed{10^{10^{10^{10}}}}"  # sympy does not come back from this one


def test_instruction_names_the_answer_format() -> None:
    assert "Answer: <number>" in ANSWER_INSTRUCTION


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ("Step 1 ...\nAnswer: 42", "42"),
        ("Answer: 5\nmore\nAnswer:  7 apples \nThanks", "7 apples"),
        ("Answer:", ""),
        ("The answer is 42.", "42"),
        ("The total is 42.", None),
        ("answer: 42", None),
    ],
)
def test_extract_answer(completion: str, expected: str | None) -> None:
    assert extract_answer(completion) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Natalia sold 48/2 = <<48/2=24>>24 clips.\n#### 1,080", "1080"),
        ("a #### 5 then #### 6", "6"),
        ("#### -3.5\n", "-3.5"),
        ("42", "42"),
        (" \\frac{1}{2} ", "\\frac{1}{2}"),
        ("no value #### ", ""),
    ],
)
def test_extract_gold(text: str, expected: str) -> None:
    assert extract_gold(text) == expected


@pytest.mark.parametrize(
    ("completion", "gold", "expected"),
    [
        ("Half of 1.5 is...\nAnswer: \\boxed{3/4}", "0.75", 1.0),
        ("Answer: 0.75", "\\frac{3}{4}", 1.0),
        ("Answer: 1,000", "1000", 1.0),
        ("Answer: 1000", "1,000", 1.0),
        ("Answer: $1,000.00", "1000", 1.0),
        ("Answer: 18 dollars", "Janet makes 9 * 2 = 18.\n#### 18", 1.0),
        ("Answer: -3", "-3", 1.0),
        ("Answer: 0.333333", "1/3", 1.0),  # math-verify's rounding, past the fast path
        ("Answer: 50%", "0.5", 1.0),
        ("Answer: \\frac{\\sqrt{2}}{2}", "\\frac{1}{\\sqrt{2}}", 1.0),  # symbolic gold
        ("Answer: 5\nAnswer: 7", "7", 1.0),  # the last marker counts
        # hedging: math-verify alone would take the last number and pay "3 or 4" for 4
        ("Answer: 3 or 4", "4", 0.0),
        ("Answer: 3 or 4", "3", 0.0),
        ("Answer: 3, 4", "4", 0.0),
        ("Answer: 18 (3 x 6)", "18", 0.0),
        ("Answer: 17", "18", 0.0),
        ("Answer: -3", "3", 0.0),
        ("Answer: 5^{2}", "25", 0.0),  # not a plain number
        ("Answer: 5/0", "5", 0.0),
        ("Answer: no idea", "18", 0.0),
        ("Answer:", "18", 0.0),
        ("Answer: 18", "", 0.0),
        ("The total is 18.", "18", 0.0),  # no convention: a lucky last number earns nothing
        ("Answer: 18 " + "padding " * 100, "18", 0.0),
        ("Answer: " + "9" * 5000, "9" * 5000, 0.0),
    ],
)
def test_correctness(completion: str, gold: str, expected: float) -> None:
    assert correctness_reward(completion, gold) == expected


def test_pathological_latex_scores_zero_within_time_limit() -> None:
    nested = "1"
    for _ in range(40):
        nested = "\\frac{" + nested + "}{2}"
    from grpo_hpc.train.rewards.verifier import VERIFIER

    completions = [f"Answer: {TOWER}", f"Answer: {nested}", "Answer: 2^{2^{30}}"]
    VERIFIER.take_stats()
    assert score_correctness_batch(completions, ["10", "1", "2"], timeout_s=1.0) == [0.0] * 3
    assert VERIFIER.take_stats() == (0, 0.0)  # numeric gold: rejected before sympy sees it


def test_verification_timeout_kills_worker_and_goes_on() -> None:
    # A symbolic gold sends the tower to math-verify, which hangs: the item overruns its
    # deadline, scores 0, and a fresh worker scores the items after it.
    from grpo_hpc.train.rewards.verifier import VERIFIER

    completions = [f"Answer: {TOWER}", "Answer: \\sqrt{5}", "Answer: 2"]
    VERIFIER.judge([("1", "1", False)], 30.0)  # a worker is running
    first = VERIFIER.proc.pid
    VERIFIER.take_stats()
    scores, failures = score_correctness(completions, ["\\sqrt{5}", "\\sqrt{5}", "2"], 1.0)
    assert scores == [0.0, 1.0, 1.0] and failures == 1  # the tower ran out its deadline
    items, slowest = VERIFIER.take_stats()
    assert items == 2 and slowest >= 0.9  # the tower, cut at 1 s; the root, by a fresh worker
    assert VERIFIER.proc.pid != first and VERIFIER.proc.is_alive()
    batch = compute_rewards(
        [f"Answer: {TOWER}"], [{"gold": "\\sqrt{5}"}], {"correctness": 1.0}, timeout_s=0.5
    )
    assert batch.total == [0.0] and batch.errors["correctness"] == 1


def test_correctness_off_the_main_thread() -> None:
    # math-verify's own timeout (signal.alarm) would raise here; ours does not rely on it.
    out: list[float] = []
    t = threading.Thread(target=lambda: out.append(correctness_reward("Answer: 0.333333", "1/3")))
    t.start()
    t.join(30)
    assert out == [1.0]


@pytest.mark.parametrize(
    "completion",
    ["Reasoning...\nAnswer: 42", "Answer: -3.5\n\n", "x\nAnswer: 1,000 ", "Answer: 3/4"],
)
def test_format_reward_accepts(completion: str) -> None:
    assert format_reward(completion) == 1.0


@pytest.mark.parametrize(
    "completion",
    [
        "Answer: Answer: 5",  # repeated marker
        "Answer: 5\nAnswer: 5",  # two answer lines
        "Answer: 5\nHope this helps!",  # trailing text
        "Answer: 5 apples",
        "Answer: 3 or 4",
        "Answer: \\boxed{5}",
        "Answer: $5",
        "So the Answer: 5",  # not a line of its own
        "answer: 5",
        "Answer:",
        "The result is 5",
        "",
    ],
)
def test_format_reward_rejects(completion: str) -> None:
    assert format_reward(completion) == 0.0


SOLUTION = "def add(a, b):\n    return a + b\n"
TESTS = ["assert add(1, 2) == 3", "assert add(-1, 1) == 0"]


def test_extract_code() -> None:
    fenced = f"Here:\n```python\n{SOLUTION}```\nUsage:\n```python\nprint(add(1, 2))\n```\n"
    assert extract_code(fenced) == SOLUTION + "\n" + "print(add(1, 2))\n"
    assert extract_code(f"```\n{SOLUTION}```") == SOLUTION
    assert extract_code(SOLUTION) == SOLUTION
    assert extract_code(f"Truncated:\n```python\n{SOLUTION}") == SOLUTION


def test_code_reward() -> None:
    assert code_reward(f"```python\n{SOLUTION}```", TESTS) == 1.0
    assert code_reward("def add(a, b):\n    return a - b\n", TESTS) == 0.0
    assert code_reward(SOLUTION, []) == 0.0
    assert code_reward("", TESTS) == 0.0
    # reward hacks: exit before the asserts run; an object equal to everything
    assert code_reward(SOLUTION + "import sys\nsys.exit(0)\n", TESTS) == 0.0
    hack = "class Eq:\n    def __eq__(self, o):\n        return True\n"
    hack += "def add(a, b):\n    return Eq()\n"
    assert code_reward(hack, TESTS) == 0.0
    assert code_reward("while True:\n    pass\n", TESTS, timeout_s=1.0) == 0.0


def _write_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, src: str) -> None:
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(src))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, name, raising=False)


def test_load_custom_reward(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _write_module(tmp_path, monkeypatch, "my_rewards", "def brevity(c, s):\n    return -len(c)\n")
    fn = load_custom_reward("my_rewards:brevity")
    assert fn("abc", {}) == -3


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("os.path", "expected 'module:function'"),
        (":basename", "expected 'module:function'"),
        ("no_such_module_xyz:f", "not found"),
        ("os.path:no_such_function", "no attribute 'no_such_function'"),
        ("os.path:sep", "not callable"),
    ],
)
def test_load_custom_reward_errors(spec: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        load_custom_reward(spec)
    assert "\n" not in str(info.value)


def test_load_custom_reward_broken_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _write_module(tmp_path, monkeypatch, "broken_rewards", "import not_installed_pkg_xyz\n")
    with pytest.raises(ConfigError, match="importing 'broken_rewards' failed"):
        load_custom_reward("broken_rewards:f")


def _length(completion: str, sample: dict) -> float:
    return float(len(completion))


def _boom(completion: str, sample: dict) -> float:
    if "7" in completion:
        raise RuntimeError("cannot score this")
    return 1.0


def test_compute_rewards_weighted_total() -> None:
    completions = ["Answer: 7", "I think 7", "x\nAnswer: 8"]
    samples = [{"gold": "7"}, {"gold": "7"}, {"gold": "7"}]
    batch = compute_rewards(
        completions, samples, {"correctness": 1.0, "format": 0.5, "length": 0.1},
        custom={"length": _length},
    )  # fmt: skip
    assert batch.components["correctness"] == [1.0, 0.0, 0.0]
    assert batch.components["format"] == [1.0, 0.0, 1.0]
    assert batch.components["length"] == [9.0, 9.0, 11.0]
    assert batch.total == pytest.approx([1.0 + 0.5 + 0.9, 0.9, 0.5 + 1.1])
    assert batch.errors == {"correctness": 0, "length": 0}
    assert "code" not in batch.components  # weight 0 (absent): skipped


def test_compute_rewards_custom_errors_and_zero_weights() -> None:
    completions = ["Answer: 7", "Answer: 8", "Answer: 77"]
    samples = [{"gold": "7"}] * 3
    nan = lambda c, s: math.nan  # noqa: E731
    batch = compute_rewards(
        completions, samples, {"correctness": 0.0, "format": 0.0, "boom": 2.0, "nan": 1.0},
        custom={"boom": _boom, "nan": nan},
    )  # fmt: skip
    assert set(batch.components) == {"boom", "nan"}
    assert batch.components["boom"] == [0.0, 1.0, 0.0]
    assert batch.errors == {"boom": 2, "nan": 3}
    assert "RuntimeError: cannot score this" in batch.error_examples["boom"]
    assert batch.total == [0.0, 2.0, 0.0]
    # a custom reward without a weight counts 1.0
    assert compute_rewards(["x"], [{"gold": "1"}], {}, {"len": _length}).total == [1.0]


def test_compute_rewards_code_component() -> None:
    completions = [f"```python\n{SOLUTION}```", "def add(a, b):\n    return 0\n", "Answer: 3"]
    samples = [{"gold": "", "tests": TESTS}, {"gold": "", "tests": TESTS}, {"gold": "3"}]
    batch = compute_rewards(completions, samples, {"correctness": 1.0, "code": 1.0})
    assert batch.components["code"] == [1.0, 0.0, 0.0]
    assert batch.total == [1.0, 0.0, 1.0]
    no_tests = compute_rewards(["Answer: 3"], [{"gold": "3"}], {"correctness": 1.0, "code": 1.0})
    assert "code" not in no_tests.components


def test_compute_rewards_rejects_bad_weights() -> None:
    with pytest.raises(ConfigError, match="name no reward"):
        compute_rewards(["x"], [{"gold": "1"}], {"correctnes": 1.0})
    with pytest.raises(ConfigError, match="clash"):
        compute_rewards(["x"], [{"gold": "1"}], {}, {"format": _length})
    with pytest.raises(ConfigError, match="not finite"):
        compute_rewards(["x"], [{"gold": "1"}], {"format": math.inf})


def test_last_number_fallback_only_when_marker_not_required() -> None:
    from grpo_hpc.train.rewards.functions import compute_rewards

    texts = ["so 5 + 7 = 12 apples", "Answer: 12", "12 or maybe 13"]
    samples = [{"gold": "12"}] * 3
    strict = compute_rewards(texts, samples, {"correctness": 1.0})
    lenient = compute_rewards(texts, samples, {"correctness": 1.0}, require_marker=False)
    assert strict.components["correctness"] == [0.0, 1.0, 0.0]
    assert lenient.components["correctness"] == [1.0, 1.0, 0.0]  # last number 13 is wrong


def test_code_reward_says_once_which_sandbox_ran(capsys: pytest.CaptureFixture) -> None:
    from grpo_hpc.train.rewards import functions as rewards
    from grpo_hpc.train.rewards.sandbox import proven_isolation as detect

    rewards.announce_sandbox.cache_clear()
    samples = [{"gold": "", "tests": ["assert add(1, 2) == 3"]}] * 2
    for _ in range(2):
        batch = compute_rewards([f"```python\n{SOLUTION}```"] * 2, samples, {"code": 1.0})
        assert batch.total == [1.0, 1.0]
    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("[Sandbox]")]
    assert lines == [f"[Sandbox] code reward runs in {detect().name}: {detect().detail}"]


def test_the_verifier_counts_its_items_and_times_the_slowest(
    capsys: pytest.CaptureFixture,
) -> None:
    """The real math-verify worker: what the step logs as reward/verify_items and
    time/verify_slowest. A plain-number match is settled by the pre-judge (not counted);
    the tower runs to its 1 s deadline, so the slowest item took about that long, and the
    log names it."""
    from grpo_hpc.train.rewards.verifier import VERIFIER

    VERIFIER.take_stats()
    score_correctness_batch(["Answer: 2"], ["2"], timeout_s=1.0)
    assert VERIFIER.take_stats() == (0, 0.0)  # the pre-judge settled it
    completions = [f"Answer: {TOWER}", "Answer: \\sqrt{5}"]  # symbolic golds: math-verify
    score_correctness_batch(completions, ["\\sqrt{5}", "\\sqrt{5}"], timeout_s=1.0)
    items, slowest = VERIFIER.take_stats()
    # the deadline's wait, plus the kill (a bound for a loaded machine, far under a hang)
    assert items == 2 and 0.9 < slowest < 30.0
    assert VERIFIER.take_stats() == (0, 0.0)  # taken: reset
    named = [x for x in capsys.readouterr().out.splitlines() if x.startswith("[Verify]")]
    # the tower is named; the root too where a loaded machine made it take 0.1 s
    tower = [x for x in named if "10^{10^" in x]
    assert len(tower) == 1 and len(named) <= 2, named
    assert all("s on one answer: " in x for x in named), named


def test_the_worker_freezes_what_it_inherits(monkeypatch: pytest.MonkeyPatch) -> None:
    """The real forked worker: the trainer's objects it inherits are frozen (never walked
    by its collector, whose full pass over them took 0.3 s in bench/probes/verifier_gc.py),
    while its own garbage is still collected (automatic collection stays on)."""
    import gc

    from grpo_hpc.train.rewards import verifier

    def report_gc(answer: str, gold: str, symbolic: bool) -> float:
        return float(gc.get_freeze_count() > 1000 and gc.isenabled())

    monkeypatch.setattr(verifier, "_judge", report_gc)  # inherited by the fork
    # This process as a trainer's: nothing frozen (tests/conftest.py froze its imports)
    gc.unfreeze()
    try:
        fresh = verifier._Verifier()
        try:
            assert fresh.judge([("1", "1", False)], timeout_s=30.0) == ([1.0], 0)
        finally:
            fresh._stop()
        assert gc.get_freeze_count() == 0  # the trainer's own process is untouched
    finally:
        gc.freeze()


def test_the_worker_is_forked_warm(monkeypatch: pytest.MonkeyPatch) -> None:
    """The trainer judges WARM_UP itself before the first fork, so the real worker inherits
    what math-verify and sympy load the first time they meet each kind of answer (0.1-0.25 s
    in one item otherwise: bench/probes/verifier_items.py)."""
    import sys

    from grpo_hpc.train.rewards import verifier

    real, seen = verifier._judge, []

    def judge(answer: str, gold: str, symbolic: bool) -> float:
        if answer == "?":  # asked in the worker: did it inherit the warm-up's imports?
            return float("sympy.physics.units" in sys.modules)
        seen.append(answer)
        return real(answer, gold, symbolic)

    monkeypatch.setattr(verifier, "_judge", judge)  # inherited by the fork
    monkeypatch.setattr(verifier, "_warmed", False)
    fresh = verifier._Verifier()
    try:
        assert fresh.judge([("?", "1", False)], timeout_s=30.0) == ([1.0], 0)
        fresh._stop()
        fresh.judge([("?", "1", False)], timeout_s=30.0)  # a restart does not warm again
    finally:
        fresh._stop()
    assert seen == [answer for answer, _, _ in verifier.WARM_UP]  # in the trainer, once


def test_a_repeated_answer_is_judged_once() -> None:
    """The real worker: eight samples of a group writing the same pathological answer cost
    one deadline, not eight, and all score 0; distinct answers are each judged."""
    from grpo_hpc.train.rewards.verifier import VERIFIER

    VERIFIER.take_stats()
    completions = [f"Answer: {TOWER}"] * 8 + ["Answer: \\sqrt{5}", "Answer: \\sqrt{5}"]
    scores, failures = score_correctness(completions, ["\\sqrt{5}"] * 10, timeout_s=1.0)
    assert scores == [0.0] * 8 + [1.0, 1.0] and failures == 1
    items, _ = VERIFIER.take_stats()
    assert items == 2  # one tower (its 1 s deadline, once: failures == 1), one root


def test_a_slow_math_verify_item_is_named_cut_to_a_line() -> None:
    from grpo_hpc.train.rewards.verifier import slow_item_line

    line = slow_item_line(0.354, ("x" * 200, "42", True))
    assert line.startswith("math-verify took 0.35 s on one answer: 'xxx")
    assert "...'" in line and "(gold '42', pid " in line and len(line) < 160


def test_full_marks_is_every_answer_right_or_every_term_at_its_best() -> None:
    """With a task term (correctness, code) a completion is right when the task's judge
    says so, whatever the format term (a model that answers every sum right without the
    answer line has solved the sums: seen on one H200, one-digit sums, 2026-12-04); with
    custom rewards alone, every weighted term must be at its best."""
    from grpo_hpc.config.schema import RewardConfig
    from grpo_hpc.train.rewards.functions import full_marks

    rc = RewardConfig(correctness=1.0, format=0.2, overlong=0.5)
    comps = {"correctness": [1.0, 1.0, 0.0], "format": [1.0, 0.0, 1.0], "overlong": [0, -1, 0]}
    assert full_marks(comps, rc) == [True, True, False]
    custom = RewardConfig(correctness=0.0, format=0.0, overlong=0.5, custom={"m:f": 1.0})
    comps = {"m:f": [1.0, 1.0, 0.5], "overlong": [0.0, -1.0, 0.0]}
    assert full_marks(comps, custom) == [True, False, False]
    assert full_marks({}, rc) == []
