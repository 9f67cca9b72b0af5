"""bench/learning/run.py's results: the summary of a system's runs over seeds (accuracy at
each evaluation, mean and standard error, time to the target), its plot, and the merge
of files made apart (``--merge``: several GPUs, or a re-run)."""

from __future__ import annotations

import json
import math
from pathlib import Path

from bench.common import write_result
from bench.learning.systems import HANDED, NUM_VAL, PAIRS, SYSTEMS


def time_to(evals: list[dict], target: float) -> float | None:
    """Training seconds at the first evaluation at or above ``target`` (None: never)."""
    return next((e["s"] for e in evals if e["accuracy"] >= target), None)


def mean_se(xs: list[float]) -> tuple[float, float]:
    """Mean and its standard error (sample std / sqrt(n); 0 for one value)."""
    n = len(xs)
    m = sum(xs) / n
    if n < 2:
        return m, 0.0
    return m, math.sqrt(sum((x - m) ** 2 for x in xs) / (n - 1) / n)


def by_step(runs: list[dict], key: str, field: str) -> dict[int, list[float]]:
    """Values of ``field`` at each step over the runs that have it (``key``: evals/steps);
    a missing or non-finite value (e.g. the entropy of a step whose groups were all flat,
    which skips the forward) is left out."""
    out: dict[int, list[float]] = {}
    for r in runs:
        for e in r[key]:
            if isinstance(e.get(field), (int, float)) and math.isfinite(e[field]):
                out.setdefault(e["step"], []).append(e[field])
    return dict(sorted(out.items()))


def handed_accuracy(run: dict) -> float:
    """Test accuracy of the model a run hands over: ``final/`` scored after a keep-best
    run (``handed``), else its last evaluation (the last step's model on the test
    problems). Pure."""
    if "handed" in run:
        return run["handed"]["accuracy"]
    return run["evals"][-1]["accuracy"]


def summarize(runs: list[dict], target: float) -> dict:
    """Per system: final held-out accuracy (mean, SE over seeds), time to ``target`` (mean
    over the seeds that reach it in runs that had the machine to themselves, and how many
    seeds reach it at all), the curve as mean/SE per eval step (its clock: of those runs).
    Pure."""
    finals = [r["evals"][-1]["accuracy"] for r in runs if r["evals"]]
    handed = [handed_accuracy(r) for r in runs if r["evals"] or "handed" in r]
    reached = [r for r in runs if time_to(r["evals"], target) is not None]
    alone = [r for r in runs if r.get("jobs", 1) == 1]  # wall-clock of a run not sharing
    timed = [t for r in alone if (t := time_to(r["evals"], target)) is not None]
    mean, se = mean_se(finals) if finals else (None, None)
    curve = {s: mean_se(v) for s, v in by_step(runs, "evals", "accuracy").items()}
    clock = {s: mean_se(v)[0] for s, v in by_step(alone or runs, "evals", "s").items()}
    return {
        "seeds": [r["seed"] for r in runs],
        "final_accuracy_mean": mean,
        "final_accuracy_se": se,
        # the model the user is handed, on the test problems: final/ of a keep-best run,
        # else the last step's (TRL's saved model, grpo_hpc without a validation split)
        "handed_accuracy_mean": mean_se(handed)[0] if handed else None,
        "handed_accuracy_se": mean_se(handed)[1] if handed else None,
        "handed_below_half": sum(a < 0.5 for a in handed),
        # a keep-best run's own evaluations (its curve) score the validation split
        "curve_split": "validation" if any("handed" in r for r in runs) else "test",
        "collapses_acted_on": sum(
            1 for r in runs for c in r.get("collapses", ()) if c["action"] != "FLAG"
        ),
        # the GPUs its runs ran on (a file's systems may have run on different ones)
        "devices": sorted({r["device"] for r in runs if "device" in r}),
        "time_to_target_mean_s": sum(timed) / len(timed) if timed else None,
        "timed_seeds": len(timed),
        "seeds_reaching_target": len(reached),
        "curve": [
            {"step": s, "s": clock.get(s), "accuracy_mean": m, "accuracy_se": e}
            for s, (m, e) in curve.items()
        ],
    }


def paired(base: list[dict], other: list[dict]) -> dict | None:
    """``other`` against ``base`` on the seeds both ran (pure): the accuracy each hands over
    (:func:`handed_accuracy`), the mean of the per-seed differences (other - base) and that
    mean's standard error. The seeds pair the two (same problems, same sampling seeds), so
    the difference's own spread is the noise, not each system's. ``within_one_se``: the
    mean difference is no larger than its standard error: no difference told apart.
    None when no seed was run by both."""
    mine = {r["seed"]: handed_accuracy(r) for r in base if r["evals"] or "handed" in r}
    theirs = {r["seed"]: handed_accuracy(r) for r in other if r["evals"] or "handed" in r}
    seeds = sorted(mine.keys() & theirs.keys())
    if not seeds:
        return None
    diffs = [theirs[s] - mine[s] for s in seeds]
    mean, se = mean_se(diffs)
    return {
        "seeds": seeds,
        "base_mean": mean_se([mine[s] for s in seeds])[0],
        "other_mean": mean_se([theirs[s] for s in seeds])[0],
        "diff_mean": mean,
        "diff_se": se,
        "within_one_se": abs(mean) <= se,
        "other_higher": sum(d > 0 for d in diffs),
        "other_lower": sum(d < 0 for d in diffs),
    }


def pairings(systems: dict[str, list[dict]]) -> dict[str, dict]:
    """:func:`paired` for each pair of ``PAIRS`` whose two systems the file holds."""
    out = {}
    for base, other in PAIRS:
        if base in systems and other in systems:
            if (p := paired(systems[base], systems[other])) is not None:
                out[f"{other} - {base}"] = p
    return out


def paired_line(name: str, p: dict) -> str:
    """One line of a pairing, for the runner's output."""
    verdict = "within one standard error" if p["within_one_se"] else "more than one SE apart"
    return (
        f"{name}: {p['diff_mean']:+.3f} ± {p['diff_se']:.3f} over {len(p['seeds'])} paired "
        f"seeds ({p['other_higher']} higher, {p['other_lower']} lower): {verdict}"
    )


COLORS = {
    "grpo_hpc": "tab:blue",
    "grpo_hpc_plain": "tab:gray",
    "grpo_hpc_tempered": "tab:green",
    "trl": "tab:orange",
    "trl_fp32": "tab:red",
    "grpo_hpc_hf": "tab:purple",
    "grpo_hpc_tis": "tab:cyan",
    "grpo_hpc_fp32head": "tab:olive",
    "grpo_hpc_eager": "tab:brown",
    "grpo_hpc_int8": "tab:pink",
    "grpo_hpc_async": "navy",
    "grpo_hpc_partial": "darkgreen",
    "grpo_hpc_grouped": "darkorange",
    "grpo_hpc_grouped3": "saddlebrown",
    "grpo_hpc_rollback_grouped3": "peru",
    "grpo_hpc_async_notis": "slategray",
    "grpo_hpc_sync_tis": "olive",
    "grpo_hpc_async_warm10": "cadetblue",
    "grpo_hpc_grouped3_warm10": "goldenrod",
    "grpo_hpc_async_opsm": "slateblue",
    "grpo_hpc_rollback_async": "teal",
}


def curve_problems(system: str, num_eval: int) -> str:
    """What a system's in-run evaluations (its accuracy curve) score: the validation split
    where it has one (the keep-best systems of systems.py), else the test problems."""
    extra = SYSTEMS.get(system, ("", []))[1]  # TRL's entry holds its precision, a string
    if isinstance(extra, list) and HANDED[0] in extra:
        return f"{NUM_VAL} validation"
    return f"{num_eval} test"


def plot(result: dict, out: Path) -> None:
    """Accuracy (mean +- SE over seeds) against step and against training wall-clock;
    reward, entropy and mean length against step (means over seeds)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(15, 7.5))
    (acc_step, acc_time, reward), (entropy, length, grad) = axes
    c = result["config"]
    for name, runs in result["systems"].items():
        color = COLORS.get(name, "tab:gray")
        label = f"{name} ({len(runs)} seeds; curve: {curve_problems(name, c['num_eval'])})"
        curve = result["summary"][name]["curve"]
        steps = [c["step"] for c in curve]
        m = [c["accuracy_mean"] for c in curve]
        lo = [c["accuracy_mean"] - c["accuracy_se"] for c in curve]
        hi = [c["accuracy_mean"] + c["accuracy_se"] for c in curve]
        acc_step.plot(steps, m, "o-", color=color, label=label)
        acc_step.fill_between(steps, lo, hi, color=color, alpha=0.2)
        secs = [c["s"] for c in curve]
        acc_time.plot(secs, m, "o-", color=color, label=label)
        acc_time.fill_between(secs, lo, hi, color=color, alpha=0.2)
        for ax, field in ((reward, "reward"), (entropy, "entropy"), (length, "length")):
            series = {s: mean_se(v)[0] for s, v in by_step(runs, "steps", field).items()}
            ax.plot(list(series), list(series.values()), color=color, label=label)
        g = {s: mean_se(v)[0] for s, v in by_step(runs, "steps", "grad_norm").items()}
        grad.semilogy(list(g), list(g.values()), color=color, label=label)
    acc_step.axhline(result["target"], color="gray", ls="--", lw=1)
    acc_time.axhline(result["target"], color="gray", ls="--", lw=1)
    acc_step.set(xlabel="step", ylabel="greedy accuracy (mean ± SE)", ylim=(0, 1.02))
    acc_time.set(xlabel="training wall-clock, s (evaluation excluded)", ylim=(0, 1.02))
    reward.set(xlabel="step", ylabel="mean training reward")
    entropy.set(xlabel="step", ylabel="policy entropy (nats/token)")
    length.set(xlabel="step", ylabel="mean completion length (tokens)")
    grad.set(xlabel="step", ylabel="grad norm before the clip")
    for ax in axes.flat:
        ax.grid(alpha=0.3)
    acc_step.legend(loc="lower right", fontsize=8)
    fig.suptitle(
        f"SmolLM2-135M, {c['terms']}-term sums, overlong {c.get('overlong', 'penalty')}, "
        f"{c['prompts']}x{c['G']}, {c['steps']} steps, "
        f"accuracy on the problems the legend names ({devices(result)})"
    )
    fig.tight_layout()
    tmp = out.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=110)
    tmp.rename(out)


def stamp_devices(result: dict) -> None:
    """Each run of ``result`` that names no device gets its file's (``env.device``): a file
    adds runs made on other machines since, and its ``env`` is then the last call's."""
    device = result.get("env", {}).get("device")
    if device is None:
        return
    for runs in result["systems"].values():
        for run in runs:
            run.setdefault("device", device)


def devices(result: dict) -> str:
    """The GPUs a file's runs ran on, for a title: one, or several joined."""
    runs = [r for rs in result["systems"].values() for r in rs]
    found = sorted({r["device"] for r in runs if "device" in r})
    return " and ".join(found) or result.get("env", {}).get("device", "?")


def merge_runs(result: dict, other: dict) -> int:
    """Adds ``other``'s runs to ``result`` (pure but for mutating ``result``); a run of a
    (system, seed) already there is replaced: a merge brings runs made since, on several
    GPUs at once (one ``--out`` each) or again after a change. Returns the runs taken."""
    taken = 0
    stamp_devices(result)
    stamp_devices(other)
    for name, runs in other["systems"].items():
        mine = result["systems"].setdefault(name, [])
        seeds = {r["seed"] for r in runs}
        mine[:] = sorted(
            [r for r in mine if r["seed"] not in seeds] + runs, key=lambda r: r["seed"]
        )
        taken += len(runs)
    return taken


def merge_files(path: Path, others: list[Path], target: float) -> None:
    """``--merge``: the runs of ``others`` into ``path`` (created from the first when
    missing); every file must hold the same settings."""
    result = json.loads(path.read_text()) if path.exists() else None
    for other_path in others:
        if not other_path.exists():  # a GPU's part that never wrote a run
            print(f"{other_path}: missing, skipped", flush=True)
            continue
        other = json.loads(other_path.read_text())
        if result is None:
            result = other | {"systems": {}}
        if _settings(other) != _settings(result):
            raise SystemExit(f"{other_path} holds runs of other settings: {other['config']}")
        print(f"{other_path}: {merge_runs(result, other)} run(s) merged", flush=True)
    if result is None:
        raise SystemExit("--merge: none of the files exists")
    result["summary"] = {n: summarize(r, target) for n, r in result["systems"].items()}
    result["paired"] = pairings(result["systems"])
    write_result(result, path)
    finish(result, path, target)


def _settings(result: dict) -> dict:
    """What a file's runs were run with, less the file's own name."""
    return {k: v for k, v in result["config"].items() if k != "name"}


def finish(result: dict, path: Path, target: float) -> None:
    """The plot beside the JSON, and one line per system."""
    plot(result, path.with_suffix(".png"))
    for name, s in result["summary"].items():
        final = f"{s['final_accuracy_mean']:.3f} ± {s['final_accuracy_se']:.3f}"
        if s.get("handed_accuracy_mean") is not None:
            final += (
                f", handed over {s['handed_accuracy_mean']:.3f} ± {s['handed_accuracy_se']:.3f}"
                f" ({s['handed_below_half']} below 0.5)"
            )
        t = s["time_to_target_mean_s"]
        reach = f"{t:.1f} s" if t is not None else "never"
        print(
            f"{name:18} final {final}  to {target}: {reach} "
            f"({s['seeds_reaching_target']}/{len(s['seeds'])} seeds)"
        )
    for name, p in pairings(result["systems"]).items():
        print(paired_line(name, p))
