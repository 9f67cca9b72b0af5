"""The collapse detector (grpo_hpc/train/supervision/collapse.py) on recorded runs and on
made-up ones, and the pure part of acting on it (on_collapse.py). The real trainer flags,
stops and rolls back in tests/e2e/test_collapse_run.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from grpo_hpc.train.supervision.collapse import (
    SOLVED,
    Thresholds,
    Verdict,
    Watch,
    at_cap,
    replay,
    reported,
    solved,
    stall_risk,
    verdict,
)
from grpo_hpc.train.supervision.on_collapse import (
    action_for,
    rollback_cap,
    rollback_seed,
    rollback_target,
    staleness_hint,
)

RESULTS = Path(__file__).parents[4] / "bench/results"
RECORDED = RESULTS / "learning_2term_mask_h100x4_2026-11-27.json"


def _seed(n: int) -> dict:
    runs = json.loads(RECORDED.read_text())["systems"]["grpo_hpc"]
    return next(r for r in runs if r["seed"] == n)


@pytest.mark.parametrize("seed", [0, 13])
def test_a_recorded_cap_stall_is_caught_within_a_few_steps(seed: int) -> None:
    run = _seed(seed)
    assert run["evals"][-1]["accuracy"] < 0.05  # the precondition: it did collapse
    verdicts = replay(run["steps"], run["evals"], Thresholds())
    assert verdicts and verdicts[0].signal == "no_signal" and verdicts[0].step == 10
    assert "of the last 10 steps trained nothing" in verdicts[0].line()


@pytest.mark.parametrize("seed", [1, 24])
def test_a_recorded_healthy_seed_draws_no_verdict(seed: int) -> None:
    run = _seed(seed)
    assert run["evals"][-1]["accuracy"] > 0.8
    assert sum(1 for s in run["steps"] if s["grad_norm"] == 0) >= 4  # it had quiet steps
    assert replay(run["steps"], run["evals"], Thresholds()) == []


def test_a_late_fall_from_the_peak_is_caught_by_the_evaluations() -> None:
    """Seed 10 rose to 0.40 at step 5 and fell to 0 with gradients still flowing."""
    run = _seed(10)
    verdicts = replay(run["steps"], run["evals"], Thresholds())
    assert [(v.signal, v.step) for v in verdicts][:1] == [("eval_drop", 20)]
    assert "fell from 0.40" in verdicts[0].why


def _steps(w: Watch, n: int, **kw: float | None) -> Watch:
    row = {"reward": 0.1, "grad_norm": 1.0, "cut": 0.5, "entropy": 1.0} | kw
    for _ in range(n):
        w = w.after_step(row["reward"], row["grad_norm"], row["cut"], row["entropy"], True)
    return w


def test_every_completion_cut_and_masked_is_the_former_cut_off_breaker() -> None:
    th = Thresholds(cut_off_patience=3, patience=0, cap=48)
    w = _steps(Watch(), 2, cut=1.0, grad_norm=0.0)
    assert w.all_cut == 2 and verdict(w, th, 2) is None
    v = verdict(_steps(w, 1, cut=1.0, grad_norm=0.0), th, 3)
    assert v is not None and v.signal == "all_cut"
    assert "rollout.max_new_tokens=48 for 3 consecutive steps" in v.why
    assert "raise rollout.max_new_tokens" in v.why
    assert _steps(w, 1, cut=0.97).all_cut == 0  # one finished completion resets it
    unmasked = Watch().after_step(0.1, 1.0, 1.0, 1.0, masked=False)
    assert unmasked.all_cut == 0  # without the mask a cut completion still trains
    off = Thresholds(cut_off_patience=0, patience=0, pinned_share=0)  # 0 disables each
    assert verdict(_steps(Watch(), 50, cut=1.0, grad_norm=0.0), off, 50) is None


def test_a_fall_within_the_noise_of_few_problems_is_no_collapse() -> None:
    """One right of 8 at the start, none after: not beyond two standard errors."""
    w = Watch().after_eval(0, 0.125, 8)
    for step in (5, 10, 15):
        w = w.after_eval(step, 0.0)
    assert verdict(w, Thresholds(), 15) is None
    many = Watch().after_eval(0, 0.2, 256)
    for step in (5, 10, 15):
        many = many.after_eval(step, 0.05)
    v = verdict(many, Thresholds(), 15)
    assert v is not None and v.signal == "eval_drop"


def test_lengths_at_the_cap_without_the_mask_are_no_stall() -> None:
    w = Watch()
    for _ in range(12):
        w = w.after_step(0.1, 1.0, 1.0, 1.0, masked=False)
    assert verdict(w, Thresholds(), 12) is None
    masked = _steps(Watch(), 12, cut=0.99)
    pinned = verdict(masked, Thresholds(), 12)
    assert pinned is not None and pinned.signal == "pinned"


def test_entropy_and_reward_hacking_fire_on_their_shapes() -> None:
    th = Thresholds(window=4)
    low = _steps(Watch(), 4, entropy=0.001)
    v = verdict(low, th, 4)
    assert v is not None and v.signal == "entropy"
    w = Watch().after_eval(0, 0.6)
    for step, (reward, acc) in enumerate([(0.3, 0.7), (0.5, 0.6), (0.7, 0.5), (0.9, 0.4)], 1):
        w = _steps(w, 5, reward=reward).after_eval(step * 5, acc)
    hacked = verdict(w, th, 20)
    assert hacked is not None and hacked.signal == "reward_hacking" and "0.70 -> 0.40" in hacked.why


def test_each_signal_is_reported_once_and_the_watch_survives_a_checkpoint() -> None:
    th = Thresholds()
    w = _steps(Watch(), 10, grad_norm=0.0, cut=0.99)
    v = verdict(w, th, 10)
    assert v is not None and v.signal == "no_signal"
    w = reported(w, v)
    again = verdict(w, th, 10)
    assert again is None or again.signal != "no_signal"
    w = w.after_eval(10, 0.2)
    assert Watch.from_state(json.loads(json.dumps(w.to_state()))) == w
    assert w.trapped == (10,)  # its steps were at the cap: a rollback does not go there
    assert w.restarted() == Watch(evals=w.evals, problems=w.problems, trapped=(10,))


def test_a_rollback_measures_the_new_attempt_by_its_own_evaluations() -> None:
    """The failed attempt's falling evaluations do not count again after a rollback: the
    new attempt needs ``eval_patience`` evaluations of its own below the bar, measured from
    the best accuracy seen before it (seed 115 at 48 tokens was rolled back at step 11,
    then again at 15 and stopped at 16 on the old attempt's evaluations)."""
    th = Thresholds()
    w = Watch().after_eval(0, 0.21, 128)
    for step, acc in ((5, 0.05), (10, 0.05)):
        w = _steps(w, 5, grad_norm=0.0, cut=1.0).after_eval(step, acc)
    w = w.restarted()
    assert w.evals == ((0, 0.21, w.evals[0][2]),) and w.problems == 128
    w = _steps(w, 4).after_eval(15, 0.09)
    assert verdict(w, th, 15) is None  # one evaluation of its own: not yet
    assert verdict(w, th, 16) is None  # and no new evaluation, no new verdict
    for step in (20, 25):
        w = _steps(w, 5).after_eval(step, 0.05)
    late = verdict(w, th, 25)
    assert late is not None and late.signal == "eval_drop" and "from 0.21" in late.why


def test_a_first_step_mostly_cut_under_the_mask_is_a_stall_risk() -> None:
    assert "rollout.max_new_tokens=48" in (stall_risk(1, 0.84, True, 48) or "")
    assert stall_risk(1, 0.5, True, 48) is None  # most completions finished
    assert stall_risk(1, 0.9, False, 48) is None  # cut completions still train
    assert stall_risk(2, 0.9, True, 48) is None  # said once, after the first step


def test_the_action_table() -> None:
    assert action_for("flag", 0, 2) == "flag"
    assert action_for("stop", 0, 2) == "stop"
    assert action_for("rollback", 1, 2) == "rollback"
    assert action_for("rollback", 2, 2) == "stop"  # the retry budget is spent
    assert rollback_seed(7, 2) == 2007


def test_a_rollback_for_a_collapse_at_the_cap_grows_the_rollouts_cap() -> None:
    # (at the cap, cap in force, configured cap, growth, limit) -> the next attempt's cap
    table = [
        ((True, 48, 48, 2.0, 0), 96),  # twice, the default limit
        ((True, 96, 48, 2.0, 0), 96),  # the default limit reached: it stays
        ((True, 96, 48, 2.0, 256), 192),  # a larger limit: grown again
        ((True, 48, 48, 1.5, 0), 72),
        ((True, 48, 48, 4.0, 0), 96),  # never past the limit
        ((True, 48, 48, 1.0, 0), 48),  # growth 1: off
        ((False, 48, 48, 2.0, 0), 48),  # not at the cap: a new seed alone
        ((False, 96, 48, 2.0, 0), 96),  # a cap raised before is kept
    ]
    assert [rollback_cap(*args) for args, _ in table] == [want for _, want in table]


def test_which_collapses_are_at_the_cap() -> None:
    """``all_cut``/``pinned`` always; ``no_signal`` when its window was mostly cut under the
    mask (the recorded stalls), not when its groups were flat for another reason."""
    cut = Watch(cut=(0.9,) * 8 + (1.0,) * 2)
    flat = Watch(cut=(0.1,) * 10)
    unmasked = Watch()  # the mask off: cuts are not recorded
    assert at_cap(Verdict("pinned", 10, ""), flat) and at_cap(Verdict("all_cut", 10, ""), flat)
    assert at_cap(Verdict("no_signal", 10, ""), cut)
    assert not at_cap(Verdict("no_signal", 10, ""), flat)
    assert not at_cap(Verdict("no_signal", 10, ""), unmasked)
    assert not at_cap(Verdict("eval_drop", 10, ""), cut)


@pytest.mark.parametrize("seed", [409, 415, 416])
def test_the_recorded_seeds_two_new_seeds_did_not_rescue_were_at_the_cap(seed: int) -> None:
    """Seeds 409, 415 and 416 of 2026-12-04 (48 tokens) spent both rollbacks on
    ``no_signal`` verdicts with a new seed alone and were handed over below 0.5: replayed,
    each verdict is at the cap, so each rollback now grows it."""
    path = RESULTS / "learning_2term_mask_rollback48_h200_2026-12-04.json"
    run = next(r for r in json.loads(path.read_text())["systems"]["grpo_hpc_rollback"]
               if r["seed"] == seed)  # fmt: skip
    first = run["collapses"][0]["step"]
    w = Watch()
    for s in run["steps"][:first]:
        w = w.after_step(s["reward"], s["grad_norm"], s["cut"], s["entropy"], True)
    v = verdict(w, Thresholds(), first)
    assert v is not None and v.signal == "no_signal" and at_cap(v, w)


def test_where_a_rollback_goes() -> None:
    # (peak, its checkpoint kept, collapse at the cap, steps saved at the cap, can restart)
    table = [
        ((15, True, False, (), True), 15),  # the peak
        ((15, True, True, (), True), 15),  # at the cap, the peak was not: the peak
        ((15, True, True, (10, 15), True), 0),  # the peak saved at the cap: the start
        ((15, True, False, (15,), True), 15),  # another collapse: the peak still
        ((15, True, True, (15,), False), 15),  # LoRA cannot restart: the peak still
        ((15, False, False, (), True), 0),  # its checkpoint gone: the start
        ((0, False, True, (), False), None),  # nowhere to go (LoRA, no peak): stop
    ]
    assert [rollback_target(*args) for args, _ in table] == [want for _, want in table]


@pytest.mark.parametrize("seed", [427, 431, 438])
def test_recorded_seeds_rolled_back_into_the_cap_now_go_to_the_start(seed: int) -> None:
    """Seeds 427, 431 and 438 of the cap-growth run (2026-12-04) were rolled back to their
    step-5 peak, saved with every completion at the cap, and handed over below 0.5.
    Replayed (steps and validation scores as recorded), the peak is one saved at the cap
    and the first rollback goes to the start."""
    path = RESULTS / "learning_2term_mask_capgrow48_h200_2026-12-04.json"
    run = next(r for r in json.loads(path.read_text())["systems"]["grpo_hpc_rollback"]
               if r["seed"] == seed)  # fmt: skip
    first = run["collapses"][0]
    scores = {e["step"]: e["accuracy"] for e in run["evals"]}
    w = Watch()
    for s in run["steps"][: first["step"]]:
        w = w.after_step(s["reward"], s["grad_norm"], s["cut"], s["entropy"], True)
        if s["step"] in scores:
            w = w.after_eval(s["step"], scores[s["step"]], 128)
    v = verdict(w, Thresholds(), first["step"])
    assert v is not None and at_cap(v, w) and first["to_step"] in w.trapped
    assert rollback_target(first["to_step"], True, True, w.trapped, True) == 0


def test_a_solved_task_is_no_collapse_but_a_solved_verdict() -> None:
    """Every group all correct: zero gradient and a confident policy, because the model
    knows the answers. Before the solved share was read, this fired no_signal at step 10
    (and the default rollback sent a good model back twice, then failed the run)."""
    th = Thresholds()
    w = Watch()
    for step in range(1, 11):
        w = w.after_step(1.0, 0.0, 0.0, 0.001, False, th.window, th.entropy_floor, solved=1.0)
        assert verdict(w, th, step) is None, step  # neither no_signal nor entropy
    v = solved(w, th, 10)
    assert v is not None and v.signal == SOLVED and v.step == 10
    assert v.line().startswith("task solved at step 10: 10 of the last 10 steps")
    assert solved(reported(w, v), th, 11) is None  # reported once per attempt


def test_flat_groups_without_every_answer_right_are_still_dead() -> None:
    """Half the groups solved, the others flat at zero: no gradient and not done, so the
    stall is still caught; a single unsolved group keeps a step from counting as solved."""
    th = Thresholds()
    w = Watch()
    for _ in range(10):
        w = w.after_step(0.5, 0.0, 0.0, 1.0, False, th.window, th.entropy_floor, solved=0.5)
    assert verdict(w, th, 10).signal == "no_signal"
    assert solved(w, th, 10) is None


def test_a_solved_step_survives_a_checkpoint() -> None:
    w = Watch().after_step(1.0, 0.0, 0.0, None, False, solved=1.0)
    assert Watch.from_state(json.loads(json.dumps(w.to_state()))) == w
    assert w.solved == (True,) and w.dead == (False,)


SOLVED_RUN = RECORDED.parent / "solved_onedigit_before_fix_h200_2026-12-04_metrics.jsonl"


def test_the_recorded_one_digit_run_is_solved_not_collapsed() -> None:
    """SmolLM2 on one-digit sums (one H200, before the solved share was logged): from step
    22 on, whole steps answered every sum right without the answer line, and no_signal
    rolled the run back at step 36. Its steps replayed with the share they had (1.0 where
    every completion was right and the rewards flat, below 1.0 otherwise) draw no collapse,
    and the solved verdict at step 36."""
    rows = [json.loads(line) for line in SOLVED_RUN.read_text().splitlines()]
    steps = [r for r in rows if "loss" in r]
    th, w, seen = Thresholds(), Watch(), []
    for r in steps:
        right = r["reward/correctness"] >= 1.0 and r["reward/std"] == 0.0
        w = w.after_step(r["reward/mean"], r["grad_norm"], r["rollout/truncated"],
                         r.get("entropy"), False, solved=1.0 if right else 0.0)  # fmt: skip
        assert verdict(w, th, r["step"]) is None, r["step"]
        if v := solved(w, th, r["step"]):
            seen.append(v.step)
            w = reported(w, v)
    assert seen == [36]
    # the precondition: the zero-gradient steps are exactly the all-right ones
    dead = [r["step"] for r in steps if r["grad_norm"] == 0.0]
    right = [r["step"] for r in steps if r["reward/correctness"] >= 1 and r["reward/std"] == 0]
    assert dead == right and len(right) == 18


def test_a_collapse_stop_names_staleness_only_in_an_asynchronous_run() -> None:
    assert staleness_hint(0) == ""
    hint = staleness_hint(2)
    assert hint.startswith("; the run is asynchronous (algo.max_staleness=2)")
    assert "docs/async.md" in hint and hint.endswith("algo.max_staleness=0 may learn")
