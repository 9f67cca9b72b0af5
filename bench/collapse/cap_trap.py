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
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script, too

# after the path
from bench.collapse.cap_hypotheses import (  # noqa: E402
    absorbing,
    by_system,
    coast,
    examples,
    first_update,
    samples,
    seed_agreement,
    seed_permutation,
    step1,
    trajectory,
)
from bench.collapse.cap_runs import HEALTHY_ACC, LAST, TRAPPED_CUT, Run, load_runs, outcome  # noqa: E402

DEFAULT = [
    "bench/results/learning_2term_mask_h100x4_2026-11-27.json",
    *sorted(str(p) for p in Path("bench/results/archive").glob("learning_2term_mask*.json")),
]
OUT = "bench/results/cap_trap_2026-11-28.json"


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
