"""Why some seeds of the learning benchmark fall into the 48-token cap and stop learning.

    python -m bench.collapse.cap_trap [RESULT.json ...] [--out OUT.json]
    OMP_NUM_THREADS=1 python -m bench.collapse.cap_trap --probe 32      # + a CPU probe, ~5 min

Reads the per-step records of bench/learning/run.py at 48 new tokens with ``--overlong mask``
(``learning_2term_mask_h100x4_2026-11-27.json`` and ``archive/learning_*mask*.json``:
grpo_hpc variants and TRL; an exact duplicate run is counted once) and tests hypotheses
about the stall with numbers:

* ``outcomes``: each run is ``trapped`` (mean cut share over its last 10 steps >= 0.9),
  ``healthy`` (not trapped, final held-out accuracy >= 0.5) or ``other``.
* ``step1``: does the first rollout (before any update) predict the trap? Cut share,
  length and reward at step 1 (and steps 1-3), trapped against healthy: ranges, the
  area under the ROC curve and the best threshold with its hits and false alarms.
* ``seed``: is the trap a property of the seed (its prompts and first samples)? Agreement
  of two runs of one seed against two runs of different seeds; runs whose first rollout
  was identical and whose outcomes still differ.
* ``trajectory``: cut share, length and zero-gradient share per step, trapped against
  healthy; the step the trap closes and how many real (non-zero) updates came before it.
* ``absorbing``: runs that were pinned at the cap for 5 steps, and how many came back.
* ``coast``: AdamW (betas 0.9/0.99) keeps moving every weight on zero-gradient steps: the
  update after one real gradient, step by step (pure arithmetic, no data).
* ``samples``: grpo_hpc's sampled completions (one per 5 steps): what the cut ones look
  like (the answer already written, an ``Answer:`` line, a repeated line) and how
  they score (the reward's last-number fallback can credit a cut completion).
* ``probe`` (``--probe N``: the real SmolLM2-135M-Instruct on the CPU, HF generate,
  T=0.9, N training prompts x G=8 at step 0, each sampled to 96 tokens and also read at
  48): who gets gradient under the mask and with what sign; the push on ending (the sum
  of the trained rows' advantages, + towards finishing); the same at a 96-token cap.
  Without ``--probe`` the output file's earlier probe section is kept.

Prints a short summary; writes everything (with the command) to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import combinations
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script, too

# after the path; re-exported (tests read them here)
from bench.collapse.cap_samples import (  # noqa: E402, F401
    CAP,
    NUMBER,
    describe,
    gold_of,
    mean,
    repeated_line,
    repeated_ngram,
    sample_kind,
)

DEFAULT = [
    "bench/results/learning_2term_mask_h100x4_2026-11-27.json",
    *sorted(str(p) for p in Path("bench/results/archive").glob("learning_2term_mask*.json")),
]
OUT = "bench/results/cap_trap_2026-11-28.json"
TRAPPED_CUT = 0.9
HEALTHY_ACC = 0.5
LAST = 10


@dataclass(frozen=True)
class Run:
    """One recorded seed of one system in one result file."""

    file: str
    system: str
    seed: int
    steps: list[dict]
    evals: list[dict]
    samples: list[dict]

    @property
    def native(self) -> bool:
        """Sampled by grpo_hpc's native engine (not HF generate: trl, grpo_hpc_hf)."""
        return self.system not in ("trl", "trl_fp32", "grpo_hpc_hf")


# ---------------------------------------------------------------- loading and labels


def load_runs(paths: Iterable[str]) -> list[Run]:
    """Every run with per-step metrics; an exact duplicate (same system, seed, steps) once."""
    out, seen = [], set()
    for path in paths:
        d = json.loads(Path(path).read_text())
        if d.get("config", {}).get("max_new") != CAP or d["config"].get("overlong") != "mask":
            continue
        for system, runs in d.get("systems", {}).items():
            for r in runs:
                if not (r.get("steps") and r.get("evals")):
                    continue
                key = (system, r["seed"], json.dumps(r["steps"], sort_keys=True))
                if key in seen:
                    continue
                seen.add(key)
                out.append(
                    Run(
                        Path(path).name,
                        system,
                        r["seed"],
                        r["steps"],
                        r["evals"],
                        r.get("samples", []),
                    )
                )
    return out


def late_cut(run: Run, last: int = LAST) -> float:
    """Mean cut share over the run's last ``last`` steps."""
    return mean([s["cut"] for s in run.steps[-last:]])


def outcome(run: Run) -> str:
    """``trapped`` (pinned at the cap at the end), ``healthy`` or ``other``."""
    if late_cut(run) >= TRAPPED_CUT:
        return "trapped"
    return "healthy" if run.evals[-1]["accuracy"] >= HEALTHY_ACC else "other"


def zero_grad(step: dict) -> bool:
    return not step.get("grad_norm")


# ---------------------------------------------------------------- statistics


def auc(pos: Sequence[float], neg: Sequence[float]) -> float:
    """P(a positive scores above a negative), ties half (Mann-Whitney U / n_pos n_neg)."""
    wins = sum((p > n) + 0.5 * (p == n) for p in pos for n in neg)
    return wins / (len(pos) * len(neg))


def best_threshold(pos: Sequence[float], neg: Sequence[float]) -> dict:
    """The cut ``x >= t`` that maximises hits - false alarms (Youden), with its counts."""
    best: dict = {}
    for t in sorted(set(pos) | set(neg)):
        hits = sum(p >= t for p in pos)
        alarms = sum(n >= t for n in neg)
        score = hits / len(pos) - alarms / len(neg)
        if not best or score > best["youden"]:
            best = {"threshold": round(t, 4), "hits": hits, "of": len(pos), "false_alarms": alarms}
            best |= {"of_healthy": len(neg), "youden": round(score, 3)}
    return best


def compare(runs: list[Run], feature: str, value) -> dict:  # noqa: ANN001
    """Trapped against healthy runs on one early feature."""
    pos = [value(r) for r in runs if outcome(r) == "trapped"]
    neg = [value(r) for r in runs if outcome(r) == "healthy"]
    area = auc(pos, neg)
    sign = 1 if area >= 0.5 else -1  # a low value predicting the trap: threshold x <= t
    best = best_threshold([sign * x for x in pos], [sign * x for x in neg])
    best["threshold"] *= sign
    return {
        "feature": feature,
        "trapped": describe(pos),
        "healthy": describe(neg),
        "auc": round(area, 3),
        "best_threshold": best | {"trapped_if": ">=" if sign > 0 else "<="},
    }


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


# ---------------------------------------------------------------- main


def analyse(runs: list[Run]) -> dict:
    return {
        "definitions": {
            "trapped": f"mean cut share over the last {LAST} steps >= {TRAPPED_CUT}",
            "healthy": f"not trapped and final held-out accuracy >= {HEALTHY_ACC}",
            "other": "neither",
        },
        "runs": len(runs),
        "outcomes": dict(Counter(outcome(r) for r in runs)),
        "by_system": by_system(runs),
        "step1": step1(runs),
        "seed": seed_agreement(runs) | {"permutation": seed_permutation(runs)},
        "first_update": first_update(runs),
        "trajectory": trajectory(runs),
        "absorbing": absorbing(runs),
        "coast": coast(runs),
        "samples": samples(runs),
        "examples": examples(runs),
    }


def summary_lines(res: dict) -> list[str]:
    o, tr = res["outcomes"], res["trajectory"]
    lines = [f"{res['runs']} runs: " + ", ".join(f"{k} {v}" for k, v in sorted(o.items()))]
    for c in res["step1"] + res["first_update"]:
        t = c["best_threshold"]
        lines.append(
            f"{c['feature']}: median trapped {c['trapped']['median']} healthy "
            f"{c['healthy']['median']} "
            f"AUC {c['auc']}; {t['trapped_if']} {t['threshold']}: {t['hits']}/{t['of']} trapped, "
            f"{t['false_alarms']}/{t['of_healthy']} healthy"
        )
    s = res["seed"]
    lines.append(
        f"same seed agree {s['agree_same_seed']} ({s['pairs_same_seed']} pairs) vs different "
        f"seeds {s['agree_different_seed']}; identical first rollouts with mixed outcome: "
        f"{s['of_them_mixed_outcome']}/{s['identical_first_rollout_groups']} groups; "
        f"permutation p {s['permutation']['p']}"
    )
    lines.append(
        f"cut by step, trapped {tr['trapped']['cut'][:6]} healthy {tr['healthy']['cut'][:6]}"
    )
    lines.append(
        f"trap closes at step {tr['trap_entry_step']['median']} (median) after "
        f"{tr['real_updates_before_entry']['counts']} real updates (count: runs)"
    )
    a = res["absorbing"]
    lines.append(
        f"pinned 5 steps at >= 0.97 cut: {a['pinned_runs']} runs, came back: {len(a['came_back'])}"
    )
    c = res["coast"]
    lines.append(
        f"AdamW after one gradient then zeros: {c['update_per_step_after_one_gradient'][:4]} "
        f"lr/step, {c['total_after_39_steps']} lr in all; runs with 5 zero-gradient steps after "
        f"their first update ({c['records']['runs']}): cut "
        f"{c['records']['mean_cut_from_the_update_step']}"
    )
    for cap, p in (res.get("probe_summary") or {}).items():
        if not isinstance(p, dict) or "cut_share" not in p:
            continue
        lines.append(
            f"probe cap {cap}: cut {p['cut_share']}, correct cut {p['cut']['correct']} finished "
            f"{p['finished']['correct']}; groups training {p['groups_that_train']}/{p['groups']}, "
            f"trained rows +{p['trained_rows_positive']}/-{p['trained_rows_negative']}, groups "
            f"pushing to end {p['groups_pushing_to_end']} vs run on {p['groups_pushing_to_run_on']}"
            f", steps pushing to run on {p['steps_pushing_to_run_on']}/{len(p['step_push_to_end'])}"
        )
    return lines


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("results", nargs="*", default=DEFAULT, help="bench/learning/run.py result files")
    p.add_argument("--out", default=OUT, help="where the JSON goes (default: %(default)s)")
    p.add_argument("--probe", type=int, default=0, metavar="N", help="CPU probe over N prompts")
    args = p.parse_args(argv)
    command = "python -m bench.collapse.cap_trap " + " ".join(
        sys.argv[1:] if argv is None else argv
    )
    res = {"command": command.strip(), "files": args.results} | analyse(load_runs(args.results))
    out = Path(args.out)
    pr = None
    if args.probe:
        from bench.collapse.cap_trap_probe import probe  # torch and transformers: only when probing

        pr = probe(args.probe) | {"command": command.strip()}
    if pr is None and out.is_file():
        pr = json.loads(out.read_text()).get("probe")  # kept, with the command that made it
    if pr:
        from bench.collapse.cap_trap_probe import probe_summaries

        res["probe_summary"] = probe_summaries(pr)
        res["probe"] = pr
    out.write_text(json.dumps(res, indent=1) + "\n")
    print("\n".join(summary_lines(res)))
    print(f"-> {out}")


if __name__ == "__main__":
    main()
