"""Model-size ladder: which shapes fit which GPU budget, how fast a GRPO step is there, and how
close the memory estimator (grpo_hpc.memory.estimate) comes to the measured peak.

For each shape (bench/shapes: by default Qwen2.5 0.5B, 1.5B, 3B, 7B; ``--shapes families``:
one shape per model family of docs/models.md; random weights built on the GPU) x budget
x mode (full parameters, LoRA r=16), one step config: 8 prompts x G=8 per GPU, 512 new tokens.

- ``h100``: bf16 autocast, each GPU capped at 80 GiB (the h100x2 profile: DDP, FSDP2 where
  the plan needs it);
- ``supercloud``: fp16 autocast + grad scaler, SDPA, each GPU capped at 32 GiB (a V100's
  memory; the supercloud profile) with ``torch.cuda.set_per_process_memory_fraction``. The
  H100's kernels and ``auto`` decisions stay, unless ``GRPO_HPC_EMULATE_GPU=7.0:32`` is
  set: then every decision is a V100's (eager layers, no packing; recorded as
  ``env.emulated_gpu``).

Each row runs the real trainer (``grpo_hpc.train``) under torchrun with ``--nproc`` ranks
(one GPU each) in its own process group with a timeout, with the memory means the estimator
picks for that many GPUs under the cap: for ``--nproc 2`` what ``grpo-submit`` resolves for
the budget's 2-GPU profile (strategy, gradient checkpointing, token budget, optimizer CPU
offload), for ``--nproc 1`` the same on one GPU. Rows the estimator says cannot fit are not
run ("estimated: does not fit"). Beside every row: the estimator's figures for one GPU and
for the 2-GPU profile; ``measured`` says which figures come from a run, ``gpus`` on how many
GPUs. ladder.json is rewritten (atomically) after every row, and rows already settled in
it (fits, out of memory) are skipped, so a cut-short run continues where it stopped and
rows that timed out or failed run again, as do rows marked ``stale`` (measured before a
change to what they measure; the reason is in the row) and rows whose settings the
estimator now resolves differently.

    # 2 GPUs, ~15 min; then one GPU, ~8 min
    python -m bench.memory.ladder --nproc 2 --out bench/results/ladder_h100_2026-11-26.json
    python -m bench.memory.ladder --out bench/results/ladder_h100_2026-11-26.json
    python -m bench.memory.ladder --device cpu --shapes tiny --steps 2 --max-new 16 \
        --out /tmp/l.json
    # the 1.5B row with every decision a V100's (docs/profiles.md, Supercloud)
    GRPO_HPC_EMULATE_GPU=7.0:32 python -m bench.memory.ladder --shapes qwen2.5-1.5b \
        --budgets supercloud --out bench/results/ladder_supercloud_emulated_<gpu>_<date>.json
    # the model families of docs/models.md (FAMILY_SHAPES), one GPU
    python -m bench.memory.ladder --shapes families \
        --out bench/results/ladder_families_h100_<date>.json
    python -m bench.memory.ladder --out bench/results/ladder_h100_2026-11-26.json \
        --merge OUT/ladder_b.json
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import sys
import tempfile
import time
from pathlib import Path

from bench.common import SHAPES as COMMON_SHAPES
from bench.common import build_model, env_info, write_result
from bench.memory.ladder_plan import (  # noqa: F401  (re-exported: tests, bench/memory/probe.py)
    BUDGETS,
    FAMILY_SHAPES,
    HERE,
    MODES,
    SHAPES,
    decode_bw,
    estimates,
    load_shape,
)
from bench.memory.ladder_rows import (  # noqa: F401  (re-exported: bench/memory/probe.py)
    _run_group,
    child,
    row_overrides,
    run_row,
    run_trl,
)

KEY = ("shape", "budget", "mode", "gpus")


def wants_trl(args: argparse.Namespace, name: str, row: dict, elapsed: float) -> bool:
    """TRL beside a one-GPU row that ran, once, while the time budget lasts."""
    one_gpu = args.device == "cuda" and args.nproc == 1
    todo = row.get("measured") and "trl" not in row and elapsed < args.time_budget
    return bool(args.trl and one_gpu and name in COMMON_SHAPES and todo)


def same_settings(row: dict, plan) -> bool:  # noqa: ANN001
    """Whether ``row`` ran the settings ``plan`` resolves now (a field the row predates
    counts as its default)."""
    from grpo_hpc.memory import estimate as memory

    defaults = {
        f.name: f.default
        for f in dataclasses.fields(memory.Settings)
        if f.default is not dataclasses.MISSING
    }
    now = json.loads(json.dumps(dataclasses.asdict(plan.settings)))
    ran = row.get("run_settings") or {}
    return all(ran.get(k, defaults.get(k)) == v for k, v in now.items())


def _key(row: dict) -> tuple[str, str, str, int]:
    return row["shape"], row["budget"], row["mode"], row.get("gpus", 1)


def expand_shapes(names: list[str]) -> list[str]:
    """``--shapes`` as names in bench/shapes: ``families`` stands for FAMILY_SHAPES."""
    return [n for name in names for n in (FAMILY_SHAPES if name == "families" else [name])]


def merge_rows(base: list[dict], others: list[list[dict]]) -> list[dict]:
    """``base``'s rows with those that each of ``others`` holds differently (pure). Each
    other is a copy of ``base`` that another ladder ran on (two 2-GPU ladders side by side
    on one 4-GPU machine, each on its own shapes): a row it changed is one it ran or
    re-decided. Each is compared with ``base`` itself, so that one copy's untouched rows
    never undo another's new ones; where two copies changed a row, the later one wins."""
    mine = {_key(r): r for r in base}
    changed = {_key(r): r for other in others for r in other if mine.get(_key(r)) != r}
    return [r for r in base if _key(r) not in changed] + list(changed.values())


def emulated_gpu(budgets: list[str]) -> str | None:
    """``GRPO_HPC_EMULATE_GPU`` as the rows run under it (``7.0:32``), or None. A bad value,
    or a budget whose cap is not the emulated memory (the h100 budget's bf16 rows on an
    emulated V100 would only be refused by the trainer), stops the ladder before any row."""
    from grpo_hpc.core.errors import ConfigError
    from grpo_hpc.train.distributed import gpu

    try:
        emulated = gpu.emulation()
    except ConfigError as e:
        sys.exit(str(e))
    if emulated is None:
        return None
    other = [b for b in budgets if BUDGETS[b][1] != emulated.gib]
    if other:
        sys.exit(
            f"{gpu.EMULATE_ENV}={emulated.said()} emulates a {emulated.gib:g} GiB GPU: "
            f"leave out the budgets of another cap ({', '.join(other)}), e.g. --budgets supercloud"
        )
    return emulated.said()


def main() -> None:
    fmt = argparse.RawDescriptionHelpFormatter
    p = argparse.ArgumentParser(description=__doc__, formatter_class=fmt)
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument(
        "--shapes",
        nargs="+",
        default=list(SHAPES),
        help=f"names in bench/shapes; 'families' stands for {', '.join(FAMILY_SHAPES)}",
    )
    p.add_argument("--nproc", type=int, default=1, help="GPUs (ranks) per row: 1 or 2")
    p.add_argument("--budgets", nargs="+", default=list(BUDGETS), choices=list(BUDGETS))
    p.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--G", type=int, default=8)
    p.add_argument("--max-new", type=int, default=512)
    p.add_argument("--micro-tokens", type=int, default=4096)
    p.add_argument("--steps", type=int, default=3, help="steps per row (the first is warm-up)")
    p.add_argument("--row-timeout", type=float, default=150.0)
    p.add_argument(
        "--time-budget",
        type=float,
        default=420.0,
        help="start no row after this many seconds (with --row-timeout: under 10 minutes)",
    )
    p.add_argument("--redo", action="store_true", help="rerun rows already in --out")
    p.add_argument(
        "--trl",
        action="store_true",
        help="one GPU: also run TRL 1.16 in each row's budget (shapes of bench/common.py)",
    )
    p.add_argument("--out", type=Path, default=HERE / "results" / "ladder.json")
    p.add_argument(
        "--merge",
        type=Path,
        nargs="+",
        help="fold the rows these copies of --out changed into --out, and run nothing",
    )
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--cap-gib", type=float, default=0.0, help=argparse.SUPPRESS)
    args = p.parse_args()
    args.shapes = expand_shapes(args.shapes)
    if args.child:
        sys.exit(child(args.child, args.cap_gib))
    if args.merge:
        result = json.loads(args.out.read_text())
        others = [json.loads(other.read_text())["rows"] for other in args.merge]
        result["rows"] = merge_rows(result["rows"], others)
        write_result(result, args.out)
        return
    result = json.loads(args.out.read_text()) if args.out.exists() and not args.redo else {}
    result.setdefault("rows", [])
    # A row that fitted or ran out of memory is settled; a timeout or an error is run again,
    # and so is a row marked stale (measured before a change to what it measures) or one
    # whose settings the estimator would now choose differently (see the loop).
    settled = {
        _key(r): r
        for r in result["rows"]
        if r.get("status") in ("fits", "oom") and not r.get("stale")
    }
    result["config"] = {k: v for k, v in vars(args).items() if k not in ("child", "cap_gib")}
    result["config"]["out"] = str(args.out)
    result["env"] = env_info()
    result["env"]["decode_bw"] = decode_bw()
    result["env"]["emulated_gpu"] = emulated_gpu(args.budgets)
    start = time.monotonic()
    with tempfile.TemporaryDirectory() as work:

        @functools.cache
        def model_dir(name: str) -> Path:
            """The shape saved once for TRL (it loads a model directory)."""
            out = Path(work) / f"model-{name}"
            build_model(out, name)
            return out

        for name in args.shapes:
            for budget in args.budgets:
                for mode in args.modes:
                    key = (name, budget, mode, args.nproc)
                    est = estimates(args, name, budget, mode)
                    if key in settled and same_settings(settled[key], est[args.nproc]):
                        row = settled[key]
                        if wants_trl(args, name, row, time.monotonic() - start):
                            row["trl"] = run_trl(args, name, budget, mode, model_dir(name))
                            write_result(result, args.out)
                            print(json.dumps({**{k: row[k] for k in KEY}, "trl": row["trl"]}))
                        continue
                    row = {"shape": name, "budget": budget, "mode": mode, "gpus": args.nproc}
                    row["device"] = args.device
                    row |= {"prompt_tokens": est["prompt_tokens"], "estimate_1gpu": est["gpu1"]}
                    row["estimate_2gpu"] = est["gpu2"]
                    plan = est[args.nproc]
                    if args.device == "cuda" and not plan.fits:
                        row |= {"status": "estimated: does not fit", "measured": False}
                    elif time.monotonic() - start > args.time_budget:
                        row |= {"status": "not run: ladder time budget spent", "measured": False}
                    else:
                        row |= run_row(args, name, budget, mode, plan, Path(work))
                        row["measured"] = True
                        row["run_settings"] = dataclasses.asdict(plan.settings)
                    if wants_trl(args, name, row, time.monotonic() - start):
                        row["trl"] = run_trl(args, name, budget, mode, model_dir(name))
                    result["rows"] = [r for r in result["rows"] if _key(r) != key] + [row]
                    write_result(result, args.out)
                    shown = (*KEY, "status", "peak_gib", "s_per_step", "trl")
                    print(json.dumps({k: row.get(k) for k in shown}), flush=True)


if __name__ == "__main__":
    main()
