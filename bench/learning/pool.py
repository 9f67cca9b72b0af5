"""Paired differences pooled over several result files of the learning benchmark: the
20-seed sets of one comparison, run on different days, read together (a single set's
spread is wide: a run ends trapped at the cap near 0 or healthy near 0.75).

    python -m bench.learning.pool --pair grpo_hpc grpo_hpc_async FILE [FILE ...]

Each system's runs are gathered from every file given; a seed is paired where both
systems ran it (:func:`bench.learning.results.paired`), so a system of one file pairs with
another file's runs of the same seeds. A seed run twice by one system (two files) is
refused: which run counts would be a choice. Per pair: the pooled line, then the same per
seed set of each file that holds the ``other`` system. (How many runs ended trapped at the
cap: ``bench.collapse.cap_runs``, which reads these files from above.)"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from bench.learning.results import paired, paired_line


def gather(files: list[Path]) -> dict[str, dict[int, dict]]:
    """System -> seed -> run over ``files`` (pure but for reading). A seed twice: ValueError."""
    out: dict[str, dict[int, dict]] = {}
    for path in files:
        for system, runs in json.loads(path.read_text()).get("systems", {}).items():
            mine = out.setdefault(system, {})
            for r in runs:
                if r["seed"] in mine:
                    raise ValueError(
                        f"{system} ran seed {r['seed']} twice ({path.name} and another file)"
                    )
                mine[r["seed"]] = r | {"file": path.name}
    return out


def pair_lines(runs: dict[str, dict[int, dict]], base: str, other: str) -> list[str]:
    """The pooled pairing of ``other`` against ``base``, then one per file of ``other``'s
    runs (pure)."""
    if base not in runs or other not in runs:
        return [f"{other} - {base}: no runs of {base if base not in runs else other}"]
    p = paired(list(runs[base].values()), list(runs[other].values()))
    if p is None:
        return [f"{other} - {base}: no seed run by both"]
    lines = [paired_line(f"{other} - {base}", p)]
    for name in sorted({r["file"] for r in runs[other].values()}):
        part = [r for r in runs[other].values() if r["file"] == name]
        if (q := paired(list(runs[base].values()), part)) is not None:
            lines.append(
                f"  seeds {min(q['seeds'])}-{max(q['seeds'])}: {q['diff_mean']:+.3f} ± "
                f"{q['diff_se']:.3f} ({q['other_higher']} higher, {q['other_lower']} lower) "
                f"{Path(name).stem}"
            )
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="example:\n  python -m bench.learning.pool --pair grpo_hpc grpo_hpc_async "
        "bench/results/learning_2term_mask_async48_h100_2026-12-05.json "
        "bench/results/learning_2term_mask_warm48_h100_2026-12-06.json",
    )
    ap.add_argument(
        "--pair",
        nargs=2,
        action="append",
        required=True,
        metavar=("BASE", "OTHER"),
        help="a system and the one compared with it; repeat for more pairs",
    )
    ap.add_argument("files", nargs="+", type=Path, help="result files of bench/learning")
    args = ap.parse_args(argv)
    missing = [str(f) for f in args.files if not f.is_file()]
    if missing:
        ap.error(f"no such result file: {', '.join(missing)}")
    try:
        runs = gather(args.files)
    except ValueError as e:
        ap.error(str(e))
    for base, other in args.pair:
        print("\n".join(pair_lines(runs, base, other)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
