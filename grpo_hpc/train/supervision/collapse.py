"""Collapse detection: has the run stopped learning? Pure functions over what a run logs.

The trainer feeds each step's all-reduced metrics (:meth:`Watch.after_step`) and each
held-out accuracy (:meth:`Watch.after_eval`) into a :class:`Watch`; :func:`verdict` says
which signal fired, at which step and why, in one line, or None. Every rank computes the
same verdict from the same all-reduced numbers, so every rank acts at the same step.

Signals (thresholds: :class:`Thresholds`, calibrated by ``bench/collapse/replay.py`` on the
29 recorded seeds of the learning benchmark at its stalling settings; docs/ALGORITHM.md):

- ``all_cut``: every completion cut at the cap under ``algo.mask_truncated`` for
  ``training.cut_off_patience`` steps in a row (the former cut-off circuit breaker).
- ``no_signal``: at least ``collapse_patience`` of the last ``collapse_window`` steps
  trained nothing (zero gradient: every completion cut and masked, or every group without
  reward variance) and were not solved (below).
- ``pinned``: under ``algo.mask_truncated``, the mean share of completions cut at the cap
  over the last ``collapse_window`` steps at least ``pinned_share`` (lengths pinned at the
  cap, so next to nothing trains; without the mask cut completions still train, and a
  task whose answers need the whole cap is not a stall).
- ``entropy``: the policy's entropy below ``entropy_floor`` for ``collapse_window``
  logged steps in a row (a policy that stopped exploring).
- ``eval_drop``: held-out accuracy down to ``1 - eval_drop`` of its reference (the best
  of the start and the peak so far), and by at least ``eval_sigmas`` standard errors of
  the reference over the problems scored, at ``eval_patience`` consecutive evaluations
  (a fall that 8 problems' noise explains is none).
- ``reward_hacking``: the mean training reward rose between the last evaluations while
  held-out accuracy fell at each of them (``eval_patience`` of them).

A step whose every group earned the full reward in every completion is **solved**, not
dead: its gradient is zero too (no group has reward variance), but because the model has
learned these problems, not because it stopped learning. :func:`solved` says when
``collapse_patience`` of the last ``collapse_window`` steps were solved; it is no collapse
signal (nothing to roll back from) and ``training.on_solved`` says what it does. A solved
step counts towards neither ``no_signal`` nor ``entropy`` (a model that knows the answers
is confident: low entropy is what it should have).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

from grpo_hpc.core.best import eval_noise

SIGNALS = ("all_cut", "no_signal", "pinned", "entropy", "eval_drop", "reward_hacking")
"""Every signal, in the order :func:`verdict` checks them."""


@dataclass(frozen=True)
class Thresholds:
    """When a signal fires (defaults: the calibrated ones; 0 disables a count)."""

    cut_off_patience: int = 10
    """``all_cut``: consecutive steps with every completion cut and masked."""
    window: int = 10
    """Steps looked back over by ``no_signal``, ``pinned`` and ``entropy``."""
    patience: int = 8
    """``no_signal``: steps of the window that trained nothing."""
    pinned_share: float = 0.97
    """``pinned``: mean cut share over the window."""
    entropy_floor: float = 0.01
    """``entropy``: nats per token (healthy recorded seeds went down to 0.03)."""
    eval_drop: float = 0.5
    """``eval_drop``: share of the reference accuracy lost (0.5: down to half of it). A
    share, not points: healthy recorded seeds wobbled by 0.1-0.16 below a peak of 0.8."""
    eval_sigmas: float = 2.0
    """``eval_drop``, ``reward_hacking``: a fall counts only beyond this many standard
    errors of the reference accuracy, sqrt(p (1 - p) / problems)."""
    eval_patience: int = 3
    """Consecutive evaluations for ``eval_drop`` and ``reward_hacking``."""
    reward_rise: float = 0.05
    """``reward_hacking``: rise of the mean reward between two evaluations."""
    cap: int = 0
    """``rollout.max_new_tokens``, named in ``all_cut``'s line (0: not said)."""
    hack_fall: float = 0.15
    """``reward_hacking``: held-out accuracy lost over those evaluations (points)."""


@dataclass(frozen=True)
class Verdict:
    """A collapse signal that fired (or :data:`SOLVED`: the task is solved)."""

    signal: str
    """One of :data:`SIGNALS`."""
    step: int
    """The step at which it fired."""
    why: str
    """One line: what was seen."""

    def line(self) -> str:
        if self.signal == SOLVED:
            return f"task solved at step {self.step}: {self.why}"
        return f"collapse ({self.signal}) at step {self.step}: {self.why}"


@dataclass(frozen=True)
class Watch:
    """What the signals need of the run so far (small; saved in each checkpoint)."""

    dead: tuple[bool, ...] = ()
    """Whether each of the last steps trained nothing and was not solved (newest last)."""
    solved: tuple[bool, ...] = ()
    """Whether each of the last steps was solved: every group earned the full reward."""
    cut: tuple[float, ...] = ()
    """Share of completions cut at the cap, last steps."""
    all_cut: int = 0
    """Consecutive steps, to the last, with every completion cut and masked."""
    low_entropy: int = 0
    """Consecutive logged entropies below the floor."""
    evals: tuple[tuple[int, float, float], ...] = ()
    """(step, held-out accuracy, mean training reward since the evaluation before)."""
    problems: int = 0
    """Problems each evaluation scored (0: unknown; the significance test is skipped)."""
    reward_sum: float = 0.0
    """Sum of the step mean rewards since the last evaluation."""
    reward_steps: int = 0
    """Steps summed in ``reward_sum``."""
    fired: tuple[str, ...] = field(default=())
    """Signals already reported in this attempt (each is reported once per attempt)."""
    cut_sum: float = 0.0
    """Sum of the steps' shares cut under the mask since the last evaluation."""
    trapped: tuple[int, ...] = ()
    """Steps of the evaluations (so of their checkpoints) whose steps since the evaluation
    before were at the cap: a mean share cut under the mask of at least
    :data:`STALL_RISK_CUT`. A rollback for a collapse at the cap does not go back there."""

    def after_step(
        self,
        reward: float,
        grad_norm: float | None,
        cut: float,
        entropy: float | None,
        masked: bool,
        window: int = Thresholds.window,
        entropy_floor: float = Thresholds.entropy_floor,
        solved: float = 0.0,
    ) -> Watch:
        """The watch once a step with these all-reduced metrics has run; ``solved`` is the
        share of the step's groups in which every completion earned the full reward."""
        if entropy is not None and entropy != entropy:  # NaN: a flat step measured none
            entropy = None
        every_cut = masked and cut >= 1.0
        all_solved = solved >= 1.0 and not every_cut
        # A zero gradient is a dead step only when the groups are flat for want of a right
        # answer: flat because every answer is right is a solved step.
        dead = every_cut or (grad_norm == 0.0 and not all_solved)
        cut = cut if masked else 0.0  # without the mask a cut completion still trains
        low = self.low_entropy + 1 if entropy is not None and entropy < entropy_floor else 0
        if all_solved:  # confidence on problems it solves is no collapse of exploration
            low = self.low_entropy
        return replace(
            self,
            dead=(*self.dead, dead)[-window:],
            solved=(*self.solved, all_solved)[-window:],
            cut=(*self.cut, cut)[-window:],
            all_cut=self.all_cut + 1 if every_cut else 0,
            low_entropy=low if entropy is not None else self.low_entropy,
            reward_sum=self.reward_sum + reward,
            reward_steps=self.reward_steps + 1,
            cut_sum=self.cut_sum + cut,
        )

    def after_eval(self, step: int, accuracy: float, problems: int = 0) -> Watch:
        """The watch once the held-out accuracy at ``step`` (over ``problems``) is known."""
        mean = self.reward_sum / self.reward_steps if self.reward_steps else float("nan")
        evals = (*self.evals, (step, accuracy, mean))
        n = problems or self.problems
        at_cap = self.reward_steps and self.cut_sum / self.reward_steps >= STALL_RISK_CUT
        trapped = (*self.trapped, step) if at_cap else self.trapped
        return replace(
            self, evals=evals, reward_sum=0.0, reward_steps=0, problems=n, cut_sum=0.0,
            trapped=trapped,
        )  # fmt: skip

    def restarted(self) -> Watch:
        """After a rollback: the step window, the reports and the evaluations start afresh
        but for the best one, which stays as the reference a later fall is measured from.
        The failed attempt's evaluations must not count towards the new attempt's
        ``eval_patience`` (they did until 2026-11-28: a rollback at step 11 saw the drop
        again at the new attempt's first evaluation and once more a step later, with no
        new evaluation, and spent the retry budget in 5 steps)."""
        best = max(self.evals, key=lambda e: e[1], default=None)
        evals = (best,) if best is not None else ()
        return Watch(evals=evals, problems=self.problems, trapped=self.trapped)

    def to_state(self) -> dict[str, Any]:
        """JSON-able, for a checkpoint (:meth:`from_state` reads it back)."""
        return asdict(self)

    @staticmethod
    def from_state(state: dict[str, Any] | None) -> Watch:
        if not state:
            return Watch()
        s = dict(state)
        for key in ("dead", "solved", "cut", "fired", "trapped"):
            s[key] = tuple(s.get(key, ()))
        s["evals"] = tuple(tuple(e) for e in s.get("evals", ()))
        return Watch(**s)


STALL_RISK_CUT = 0.75
"""A first step with at least this share cut at the cap under the overlong mask draws a
warning: every recorded seed at the learning benchmark's stalling settings had 0.75-0.97
at step 1, and 6 of its 29 seeds stalled at the cap (docs/ALGORITHM.md)."""


CAP_SIGNALS = ("all_cut", "pinned")
"""Signals that are about the length cap by definition."""


def at_cap(v: Verdict, w: Watch) -> bool:
    """Whether a verdict is a collapse at the length cap (pure): ``all_cut``/``pinned``, or
    ``no_signal`` over a window whose mean share cut under the mask is at least
    :data:`STALL_RISK_CUT` (the steps trained nothing because their completions ran into the
    cap). Each of the 54 ``no_signal`` verdicts recorded in bench/results (48 and 96 tokens,
    2026-11-28 to 2026-12-04) had 0.90-1.00; a watch read with the mask off holds no cuts."""
    if v.signal in CAP_SIGNALS:
        return True
    return v.signal == "no_signal" and bool(w.cut) and sum(w.cut) / len(w.cut) >= STALL_RISK_CUT


def stall_risk(step: int, cut: float, masked: bool, cap: int) -> str | None:
    """A warning after the first step when the settings are likely to stall (pure)."""
    if step != 1 or not masked or cut < STALL_RISK_CUT:
        return None
    return (
        f"{cut:.0%} of the first step's completions were cut at rollout.max_new_tokens={cap} "
        "and algo.mask_truncated trains none of them: runs like this often stall at the cap "
        "(6 of 29 recorded seeds at 48 tokens); a larger rollout.max_new_tokens avoids it"
    )


def verdict(w: Watch, th: Thresholds, step: int) -> Verdict | None:
    """The first signal that fires now and has not been reported in this attempt (pure)."""
    for signal in SIGNALS:
        if signal in w.fired:
            continue
        why = _CHECKS[signal](w, th)
        if why:
            return Verdict(signal, step, why)
    return None


SOLVED = "solved"
"""The verdict's ``signal`` when the task is solved (:func:`solved`; not in :data:`SIGNALS`)."""


def solved(w: Watch, th: Thresholds, step: int) -> Verdict | None:
    """The task is solved (pure): at least ``patience`` of the last ``window`` steps had
    every group earn the full reward in every completion, so there is nothing left to learn
    from these problems (and nothing to roll back from). Reported once per attempt."""
    n = sum(w.solved)
    if SOLVED in w.fired or not th.patience or len(w.solved) < th.window or n < th.patience:
        return None
    why = (
        f"{n} of the last {len(w.solved)} steps had every group answer correctly in every "
        "completion (full reward, no variance): these problems are solved and give no "
        "learning signal"
    )
    return Verdict(SOLVED, step, why)


def _all_cut(w: Watch, th: Thresholds) -> str | None:
    if th.cut_off_patience and w.all_cut >= th.cut_off_patience:
        cap = f"rollout.max_new_tokens={th.cap}" if th.cap else "the length cap"
        return (
            f"every completion ran to {cap} for {w.all_cut} consecutive steps and "
            "algo.mask_truncated trains none of them, so nothing trained: raise "
            "rollout.max_new_tokens (or set algo.mask_truncated=false)"
        )
    return None


def _no_signal(w: Watch, th: Thresholds) -> str | None:
    n = sum(w.dead)
    if th.patience and len(w.dead) >= th.window and n >= th.patience:
        cut = sum(w.cut) / len(w.cut)
        return (
            f"{n} of the last {len(w.dead)} steps trained nothing (zero gradient; "
            f"{cut:.0%} of completions cut at the cap): no learning signal left"
        )
    return None


def _pinned(w: Watch, th: Thresholds) -> str | None:
    if len(w.cut) >= th.window and th.pinned_share and sum(w.cut) / len(w.cut) >= th.pinned_share:
        return (
            f"{sum(w.cut) / len(w.cut):.0%} of completions cut at the length cap over the "
            f"last {len(w.cut)} steps: lengths pinned at rollout.max_new_tokens"
        )
    return None


def _entropy(w: Watch, th: Thresholds) -> str | None:
    if th.window and w.low_entropy >= th.window:
        return (
            f"policy entropy below {th.entropy_floor} nats/token for {w.low_entropy} steps: "
            "the policy has stopped exploring"
        )
    return None


def _noise(w: Watch, th: Thresholds, ref: float) -> float:
    """How far an accuracy may fall below ``ref`` by chance (``eval_sigmas`` SE): keep-best's
    test (grpo_hpc.core.best.eval_noise)."""
    return eval_noise(ref, w.problems, th.eval_sigmas)


def _eval_drop(w: Watch, th: Thresholds) -> str | None:
    n = th.eval_patience
    if not n or len(w.evals) < n + 1:
        return None
    ref = max(acc for _, acc, _ in w.evals[:-n])
    last = w.evals[-n:]
    bar = min(ref * (1 - th.eval_drop), ref - _noise(w, th, ref))
    if ref > 0 and all(acc <= bar for _, acc, _ in last):
        shown = ", ".join(f"{acc:.2f} at step {s}" for s, acc, _ in last)
        return f"held-out accuracy fell from {ref:.2f} (start or peak) to {shown}"
    return None


def _reward_hacking(w: Watch, th: Thresholds) -> str | None:
    n = th.eval_patience
    if not n or len(w.evals) < n + 1:
        return None
    seq = w.evals[-(n + 1) :]
    falls = all(b[1] < a[1] for a, b in zip(seq, seq[1:], strict=False))
    rewards = [r for _, _, r in seq[1:]]
    rises = all(b - a >= th.reward_rise for a, b in zip(rewards, rewards[1:], strict=False))
    fall = seq[0][1] - seq[-1][1]
    big = fall >= max(th.hack_fall, _noise(w, th, seq[0][1]))
    if falls and rises and len(rewards) > 1 and big:
        return (
            f"mean reward rose {rewards[0]:.2f} -> {rewards[-1]:.2f} while held-out accuracy "
            f"fell {seq[0][1]:.2f} -> {seq[-1][1]:.2f}: the reward is being gamed"
        )
    return None


_CHECKS = {
    "all_cut": _all_cut,
    "no_signal": _no_signal,
    "pinned": _pinned,
    "entropy": _entropy,
    "eval_drop": _eval_drop,
    "reward_hacking": _reward_hacking,
}


def reported(w: Watch, v: Verdict) -> Watch:
    """The watch once ``v`` has been acted on."""
    return replace(w, fired=(*w.fired, v.signal))


def replay(
    steps: list[dict[str, Any]],
    evals: list[dict[str, Any]],
    th: Thresholds,
    masked: bool = True,
    problems: int = 0,
) -> list[Verdict]:
    """Every verdict a recorded run would have drawn, in order (pure). ``steps``: rows
    with step, reward, grad_norm, cut, entropy (and solved, the share of solved groups);
    ``evals``: rows with step, accuracy (the learning benchmark's result files);
    ``problems``: how many each evaluation scored."""
    w, out = Watch(), []
    by_step = {int(e["step"]): float(e["accuracy"]) for e in evals}
    if 0 in by_step:
        w = w.after_eval(0, by_step[0], problems)
    for row in steps:
        s = int(row["step"])
        w = w.after_step(
            float(row.get("reward") or 0.0),
            row.get("grad_norm"),
            float(row.get("cut") or 0.0),
            row.get("entropy"),
            masked,
            th.window,
            th.entropy_floor,
            float(row.get("solved") or 0.0),
        )
        if s in by_step:
            w = w.after_eval(s, by_step[s], problems)
        v = verdict(w, th, s)
        if v is not None:
            out.append(v)
            w = reported(w, v)
    return out
