"""The recorded runs of the cap-trap analysis (bench/collapse/cap_trap.py): loading them from
bench/learning/run.py's result files, their outcome labels, and the statistics that compare
trapped against healthy runs on one feature."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.collapse.cap_samples import CAP, describe, mean

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
