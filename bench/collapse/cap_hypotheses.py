"""The hypotheses of the cap-trap analysis (bench/collapse/cap_trap.py), each a pure
function of the recorded runs: step 1, the seed, the trajectory, absorbing runs, AdamW's
coast on zero gradients, and what the sampled completions look like."""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from itertools import combinations

from bench.collapse.cap_runs import TRAPPED_CUT, Run, compare, late_cut, outcome, zero_grad
from bench.collapse.cap_samples import CAP, describe, mean, sample_kind

# ---------------------------------------------------------------- hypotheses on records


def step1(runs: list[Run]) -> list[dict]:
    """Early features of trapped against healthy runs (step 1 precedes any update)."""
    return [
        compare(runs, "cut at step 1", lambda r: r.steps[0]["cut"]),
        compare(runs, "length at step 1", lambda r: r.steps[0]["length"]),
        compare(runs, "reward at step 1", lambda r: r.steps[0]["reward"]),
        compare(runs, "mean cut steps 1-3", lambda r: mean([s["cut"] for s in r.steps[:3]])),
        compare(runs, "zero-gradient steps of 1-3", lambda r: sum(map(zero_grad, r.steps[:3]))),
    ]


def by_system(runs: list[Run]) -> dict:
    """Outcome counts per system (all files together), and within each system with 3+
    trapped runs the AUC of the cut share right after the first real update."""
    out: dict[str, Counter] = defaultdict(Counter)
    for r in runs:
        out[r.system][outcome(r)] += 1
    table = {s: dict(c) | {"runs": sum(c.values())} for s, c in sorted(out.items())}
    for s, row in table.items():
        if row.get("trapped", 0) >= 3 and row.get("healthy", 0) >= 3:
            mine = [r for r in runs if r.system == s]
            row["auc_cut_after_first_update"] = compare(mine, "", cut_after_first)["auc"]
    return table


def seed_agreement(runs: list[Run]) -> dict:
    """Is the trap a property of the seed? Over pairs of runs (trapped or not): the share
    that agree when both have the same seed, against pairs with different seeds. Also the
    runs whose first rollout (step 1 cut, length, reward) was identical to another's."""
    trapped = [(r.seed, outcome(r) == "trapped", first_batch(r)) for r in runs]
    same = [a[1] == b[1] for a, b in combinations(trapped, 2) if a[0] == b[0]]
    cross = [
        (a.seed, outcome(a) == "trapped", outcome(b) == "trapped")
        for a in runs
        for b in runs
        if a.system == "trl" and b.system != "trl" and a.seed == b.seed
    ]
    diff = [a[1] == b[1] for a, b in combinations(trapped, 2) if a[0] != b[0]]
    per_seed: dict[int, list[bool]] = defaultdict(list)
    for seed, t, _ in trapped:
        per_seed[seed].append(t)
    groups: dict[tuple, list[bool]] = defaultdict(list)
    for _, t, fb in trapped:
        groups[fb].append(t)
    shared = [g for g in groups.values() if len(g) >= 2]
    return {
        "pairs_same_seed": len(same),
        "agree_same_seed": round(mean(same), 3),
        "trl_vs_grpo_hpc_same_seed": {
            "pairs": len(cross),
            "both_trapped": sum(x[1] and x[2] for x in cross),
            "trl_only": sum(x[1] and not x[2] for x in cross),
            "grpo_hpc_only": sum(x[2] and not x[1] for x in cross),
            "agree": round(mean([x[1] == x[2] for x in cross]), 3),
        },
        "pairs_different_seed": len(diff),
        "agree_different_seed": round(mean(diff), 3),
        "trapped_share_per_seed": {
            s: f"{sum(v)}/{len(v)}" for s, v in sorted(per_seed.items()) if len(v) >= 3
        },
        "identical_first_rollout_groups": len(shared),
        "of_them_mixed_outcome": sum(0 < sum(g) < len(g) for g in shared),
        "runs_in_mixed_groups": sum(len(g) for g in shared if 0 < sum(g) < len(g)),
    }


def first_batch(run: Run) -> tuple:
    s = run.steps[0]
    return (run.seed, run.native, round(s["cut"], 4), round(s["length"], 3), round(s["reward"], 4))


def trap_entry(run: Run, k: int = 3) -> int | None:
    """First step opening ``k`` consecutive steps with cut share >= 0.9 that lasts to the
    end in the sense of :func:`outcome` (trapped runs only)."""
    if outcome(run) != "trapped":
        return None
    cut = [s["cut"] for s in run.steps]
    for i in range(len(cut) - k + 1):
        if all(c >= TRAPPED_CUT for c in cut[i : i + k]) and mean(cut[i:]) >= TRAPPED_CUT:
            return run.steps[i]["step"]
    return None


def trajectory(runs: list[Run], upto: int = 12) -> dict:
    """Per-step means for trapped and healthy runs, and when the trap closes."""
    out: dict = {}
    for label in ("trapped", "healthy"):
        rs = [r for r in runs if outcome(r) == label]
        out[label] = {
            "runs": len(rs),
            "cut": [round(mean([r.steps[i]["cut"] for r in rs]), 3) for i in range(upto)],
            "length": [round(mean([r.steps[i]["length"] for r in rs]), 2) for i in range(upto)],
            "zero_grad": [round(mean([zero_grad(r.steps[i]) for r in rs]), 3) for i in range(upto)],
            "length_change_1_to_5": describe(
                [r.steps[4]["length"] - r.steps[0]["length"] for r in rs]
            ),
        }
    trapped = [r for r in runs if outcome(r) == "trapped"]
    entries = [trap_entry(r) for r in trapped]
    updates = [
        sum(not zero_grad(s) for s in r.steps if s["step"] < e)
        for r, e in zip(trapped, entries, strict=True)
        if e is not None
    ]
    out["trap_entry_step"] = describe([e for e in entries if e is not None])
    best = [max(r.evals, key=lambda e: e["accuracy"])["step"] for r in trapped]
    out["trapped_best_eval_step"] = dict(sorted(Counter(best).items()))
    out["real_updates_before_entry"] = describe(updates) | {"counts": dict(Counter(updates))}
    out["zero_grad_steps_per_run"] = {
        label: describe([sum(map(zero_grad, r.steps)) for r in runs if outcome(r) == label])
        for label in ("trapped", "healthy", "other")
        if any(outcome(r) == label for r in runs)
    }
    return out


def after_first(run: Run) -> tuple[float, float]:
    """Cut share of the rollout after the first real update, and its change over it."""
    k = next((i for i, s in enumerate(run.steps) if not zero_grad(s)), len(run.steps) - 1)
    k = min(k, len(run.steps) - 2)
    return run.steps[k + 1]["cut"], run.steps[k + 1]["cut"] - run.steps[k]["cut"]


def cut_after_first(run: Run) -> float:
    return after_first(run)[0]


def first_real(run: Run) -> dict:
    """The run's first step with a non-zero gradient (its last step if none)."""
    return next((s for s in run.steps if not zero_grad(s)), run.steps[-1])


def first_update(runs: list[Run]) -> list[dict]:
    """The cut share right after a run's first non-zero-gradient step (the first rollout
    that saw a real update) and its change from the step before, trapped against healthy;
    and how many of steps 1-5 had a real update."""

    return [
        compare(runs, "cut after the first real update", cut_after_first),
        compare(runs, "cut change over the first real update", lambda r: after_first(r)[1]),
        compare(runs, "grad norm of the first real update", lambda r: first_real(r)["grad_norm"]),
        compare(runs, "reward at the first real update", lambda r: first_real(r)["reward"]),
        compare(runs, "zero-gradient steps of 1-5", lambda r: sum(map(zero_grad, r.steps[:5]))),
    ]


def seed_permutation(runs: list[Run], rounds: int = 2000, seed: int = 0) -> dict:
    """Same-seed agreement against outcomes shuffled among the runs of each system (which
    keeps each system's trap rate): the share of shuffles agreeing as much (a p-value)."""
    import random

    rng = random.Random(seed)
    seeds = [r.seed for r in runs]
    pairs = [(i, j) for i, j in combinations(range(len(runs)), 2) if seeds[i] == seeds[j]]
    labels = [outcome(r) == "trapped" for r in runs]

    def agree(ls: list[bool]) -> float:
        return mean([ls[i] == ls[j] for i, j in pairs])

    observed = agree(labels)
    by_sys: dict[str, list[int]] = defaultdict(list)
    for i, r in enumerate(runs):
        by_sys[r.system].append(i)
    hits = 0
    for _ in range(rounds):
        ls = labels[:]
        for idx in by_sys.values():
            vals = [labels[i] for i in idx]
            rng.shuffle(vals)
            for i, v in zip(idx, vals, strict=True):
                ls[i] = v
        hits += agree(ls) >= observed
    return {
        "observed": round(observed, 3),
        "rounds": rounds,
        "p": round((hits + 1) / (rounds + 1), 4),
    }


def absorbing(runs: list[Run], k: int = 5, pinned: float = 0.97) -> dict:
    """Runs that had ``k`` consecutive steps with cut share >= ``pinned``: how many ended
    with a mean cut share below 0.5 over their last 10 steps (came back)."""
    hit, back = [], []
    for r in runs:
        cut = [s["cut"] for s in r.steps]
        at = next(
            (i for i in range(len(cut) - k + 1) if all(c >= pinned for c in cut[i : i + k])),
            None,
        )
        if at is None:
            continue
        hit.append(r)
        if late_cut(r) < 0.5:
            back.append(
                {"system": r.system, "seed": r.seed, "file": r.file, "pinned_from": at + 1}
                | {"final_accuracy": r.evals[-1]["accuracy"]}
            )
    return {"pinned_runs": len(hit), "of_runs": len(runs), "came_back": back}


def adam_coast(steps: int, beta1: float = 0.9, beta2: float = 0.99) -> list[float]:
    """|update| per weight, in units of the learning rate, for AdamW (no weight decay) that
    saw one gradient at step 1 and zeros after it (eps negligible: grads ~1e-4 >> 1e-8)."""
    out = []
    m = v = 0.0
    for t in range(1, steps + 1):
        g = 1.0 if t == 1 else 0.0
        m, v = beta1 * m + (1 - beta1) * g, beta2 * v + (1 - beta2) * g * g
        out.append((m / (1 - beta1**t)) / math.sqrt(v / (1 - beta2**t)))
    return out


def coast_runs(runs: list[Run], after: int = 5) -> dict:
    """Runs whose first real update was followed by ``after`` zero-gradient steps: their
    mean cut share at the step of that update and at each step after it. A frozen policy
    would keep its cut share (its prompts change, their distribution does not); AdamW
    moves the weights on each of these steps along the one gradient it saw."""
    rows = []
    for r in runs:
        k = next((i for i, s in enumerate(r.steps) if not zero_grad(s)), None)
        if k is None or k + after >= len(r.steps):
            continue
        if all(zero_grad(s) for s in r.steps[k + 1 : k + 1 + after]):
            rows.append([s["cut"] for s in r.steps[k : k + 1 + after]])
    return {
        "runs": len(rows),
        "mean_cut_from_the_update_step": [round(mean(c), 3) for c in zip(*rows, strict=True)],
    }


def coast(runs: list[Run]) -> dict:
    u = adam_coast(39)
    return {
        "records": coast_runs(runs),
        "update_per_step_after_one_gradient": [round(x, 3) for x in u[:10]],
        "total_after_5_steps": round(sum(u[:5]), 2),
        "total_after_39_steps": round(sum(u), 2),
    }


# ---------------------------------------------------------------- sampled completions

FEATURES = ("gold_written", "answer_line", "repeated_line", "repeated_6gram", "correct", "format")


def samples(runs: list[Run]) -> dict:
    """Cut (at the cap) against finished sampled completions, trapped and healthy runs."""
    out: dict = {}
    rows = [(outcome(r), s) for r in runs for s in r.samples]
    for label in ("trapped", "healthy"):
        for window, lo, hi in (("step 1", 1, 1), ("steps 5-10", 5, 10), ("steps 15-40", 15, 40)):
            kinds = [sample_kind(s) for o, s in rows if o == label and lo <= s["step"] <= hi]
            for cut in (True, False):
                ks = [k for k in kinds if k["at_cap"] == cut]
                if not ks:
                    continue
                key = f"{label} {window} {'at cap' if cut else 'finished'}"
                out[key] = {"n": len(ks)} | {
                    f: round(mean([k[f] for k in ks]), 3) for f in FEATURES
                }
    return out


def examples(runs: list[Run], n: int = 3) -> list[dict]:
    """A few sampled completions of trapped runs at steps >= 5 (at the cap)."""
    out = []
    for r in runs:
        if outcome(r) != "trapped":
            continue
        for s in r.samples:
            if s["step"] >= 5 and s["tokens"] >= CAP and len(out) < n:
                out.append({"system": r.system, "seed": r.seed, "step": s["step"]} | s)
    return out
