"""Benchmark: the same run synchronous (``algo.max_staleness=0``) and asynchronous (``=1``)
on the same device, under a long tail of completion lengths.

    python -m bench.speed.longtail --out DIR [--staleness [K ...]] [--variant NAME=OVERRIDES]...
        -- GRPO_STEP_ARGS...

runs ``bench/speed/grpo_step.py`` once per staleness with GRPO_STEP_ARGS (a shape or
``--model-dir``, ``--max-new``, ``--prompts``, ``--G``, ``--steps``, ...) plus ``--engine
native``, ``--override algo.max_staleness=K`` and either the caller's ``--length-dist FILE``
(random weights: each row's length drawn from FILE, the same draws in both runs) or
``--record`` (a real model: its own lengths). ``--variant NAME=OVERRIDES`` adds a run of
its own after those (e.g. ``k1high=algo.max_staleness=1 rollout.decode_priority=high``:
space-separated config overrides, in ``DIR/NAME/``), compared with the first run like the
others (``partial=algo.max_staleness=2 rollout.partial_pool=2``: partial rollouts, each
row's drawn length carried across the rounds that continue it and judged in total answer
length); ``--staleness`` with no value runs the variants alone. Runs too long for one
call run in two (``--staleness 0``, then ``--staleness --variant ...``), their folders
copied into one DIR, then ``--analyze-only --staleness 0 --variant ...`` compares them.
Each run's metrics and generation records land in ``DIR/k<K>/`` (with
``grpo_step.log``, its stderr); a run stopped at ``--run-timeout`` or failed is kept as far
as it went, and the next still runs.
``bench/speed/longtail_analysis.py`` turns them into ``DIR/longtail.md`` (a table) and
``DIR/longtail.json``: tokens/s/GPU as NeMo RL counts them, each phase's idle share, the
wait for the longest row, ``time/wait_rollouts`` and ``time/weight_sync`` where logged,
and whether every imposed length was honoured.

CPU smoke (the tiny shape, seconds; tests/bench/test_longtail_cpu.py)::

    python -m bench.speed.longtail --out /tmp/lt -- --shape tiny --precision fp32 \
        --max-new 32 --prompts 2 --G 4 --steps 3 --length-dist FILE
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from bench.common import env_info, write_result
from bench.speed.grpo_step import keep_run
from bench.speed.longtail_analysis import markdown, speedup, summarize, train_steps, window


@dataclass(frozen=True)
class Planned:
    """One run of the comparison."""

    name: str
    """Its folder under DIR (``k<K>`` or a variant's NAME)."""
    label: str
    """Its row in the table."""
    overrides: tuple[str, ...]
    """The config overrides it adds to GRPO_STEP_ARGS."""


def plan_runs(staleness: list[int], variants: list[str]) -> list[Planned]:
    """The runs, in order (pure): one per staleness, then one per ``NAME=OVERRIDES``
    variant. A name must be a plain folder name and appear once; at least one run."""
    runs = [Planned(f"k{k}", f"max_staleness={k}", (f"algo.max_staleness={k}",)) for k in staleness]
    for v in variants:
        name, _, overrides = v.partition("=")
        if not name.replace("_", "").isalnum() or not overrides.split():
            raise ValueError(f"--variant {v!r}: NAME=OVERRIDES, e.g. k1high=algo.max_staleness=1")
        runs.append(Planned(name, f"{name}: {overrides}", tuple(overrides.split())))
    names = [r.name for r in runs]
    if not runs:
        raise ValueError("no runs: give --staleness values or a --variant")
    if len(set(names)) != len(names):
        raise ValueError(f"runs named twice: {names}")
    return runs


def step_command(run: Planned, out: Path, work: Path, passthrough: list[str]) -> list[str]:
    """The grpo_step command of one run (pure)."""
    record = [] if "--length-dist" in passthrough else ["--record"]
    overrides = [w for o in run.overrides for w in ("--override", o)]
    return [
        sys.executable, "-m", "bench.speed.grpo_step", *passthrough, "--engine", "native",
        *record, *overrides, "--work", str(work / run.name),
        "--keep", str(out / run.name), "--out", str(out / f"{run.name}.json"),
    ]  # fmt: skip


def run_one(cmd: list[str], timeout: float, log: Path) -> int | None:
    """Run ``cmd`` in a session of its own, its stderr to ``log``; past ``timeout`` s stop
    all of it (torchrun and its ranks too, which would otherwise keep the GPU) and return
    None."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            return None


def tail(path: Path, chars: int = 3000) -> str:
    """The end of a log, for the stage's output when a run failed."""
    text = path.read_text(errors="replace") if path.exists() else ""
    return text[-chars:]


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def window_of(kept: Path, steps: int, cut: bool) -> tuple[int, int, int]:
    """``longtail_analysis.window`` of the run kept in ``kept`` (its ``config.yaml``), and
    its ``rollout.steps_per_generation``."""
    path = kept / "config.yaml"
    cfg = yaml.safe_load(path.read_text()) if path.exists() else {}
    algo, rollout = cfg.get("algo") or {}, cfg.get("rollout") or {}
    k, pool = int(algo.get("max_staleness", 0)), int(rollout.get("partial_pool", 0))
    grouped = int(rollout.get("steps_per_generation", 1))
    return (*window(steps, k, pool, grouped, cut), grouped)


def analyze(out: Path, planned: list[Planned], passthrough: list[str]) -> dict:
    """The comparison of the runs kept under ``out`` (written to longtail.{json,md}); a run
    stopped at its timeout (``k<K>/CUT``) or failed (``k<K>/FAILED``) counts the steps it
    finished. The environment is the runs' own (grpo_step's result), not the analyzer's."""
    runs, env = [], None
    for p in planned:
        kept = out / p.name
        records = [r for f in sorted((kept / "generations").glob("*.jsonl")) for r in read_jsonl(f)]
        rows = read_jsonl(kept / "metrics.jsonl") if (kept / "metrics.jsonl").exists() else []
        cut = (kept / "CUT").exists() or (kept / "FAILED").exists()
        skip, drain, grouped = window_of(kept, len(train_steps(rows)), cut)
        run = summarize(p.label, rows, records, skip, cut, drain, grouped)
        if (kept / "FAILED").exists():
            run["failed"] = (kept / "FAILED").read_text().strip()
        runs.append(run)
        if env is None and (out / f"{p.name}.json").exists():
            env = json.loads((out / f"{p.name}.json").read_text()).get("env")
    lengths = "real lengths (the model's own EOS), recorded"
    if "--length-dist" in passthrough:
        lengths = f"lengths imposed from {passthrough[passthrough.index('--length-dist') + 1]}"
    result = {
        "benchmark": "longtail",
        "lengths": lengths,
        "grpo_step_args": passthrough,
        "runs": runs,
        "speedup_tokens_per_gpu_s": {r["run"]: speedup(runs[0], r) for r in runs[1:]},
        "env": env or {"analyzed_on": env_info()},
    }
    write_result(result, out / "longtail.json")
    table = markdown(runs)
    (out / "longtail.md").write_text(
        f"# Long-tail speed, synchronous against asynchronous\n\n{lengths}; "
        f"`bench.speed.grpo_step {' '.join(passthrough)}`\n\n{table}\n"
    )
    return result


def main() -> None:
    argv = sys.argv[1:]
    ours, passthrough = (
        (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    )
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--out", type=Path, required=True)
    p.add_argument(
        "--staleness",
        type=int,
        nargs="*",
        default=[0, 1],
        help="one run per value (default 0 1); given with no value, the variants alone (a "
        "comparison across calls: --analyze-only over both runs' folders, copied into DIR)",
    )
    p.add_argument(
        "--variant",
        action="append",
        default=[],
        help="NAME=OVERRIDES: one more run with these space-separated config overrides",
    )
    p.add_argument("--analyze-only", action="store_true", help="only read DIR's runs again")
    p.add_argument(
        "--run-timeout", type=float, default=3600, help="stop a run after this many s (kept)"
    )
    a = p.parse_args(ours)
    try:
        planned = plan_runs(a.staleness, a.variant)
    except ValueError as e:
        p.error(str(e))
    a.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="longtail-"))  # the runs' folders (not copied back)
    failed = 0
    for run in [] if a.analyze_only else planned:
        cmd = step_command(run, a.out, work, passthrough)
        print("+", " ".join(cmd), flush=True)
        t0 = time.time()
        log = a.out / run.name / "grpo_step.log"
        code = run_one(cmd, a.run_timeout, log)
        print(f"{run.label}: exit {code} in {time.time() - t0:.0f} s", flush=True)
        if code == 0:
            continue
        # stopped or failed: what it finished is kept and counted, and the next run still
        # runs (an asynchronous run out of memory says nothing against the synchronous one)
        from grpo_hpc.core.paths import RunPaths

        keep_run(RunPaths(work / run.name / "run"), a.out / run.name)
        if code is None:
            (a.out / run.name / "CUT").write_text(f"stopped after {a.run_timeout:.0f} s\n")
        else:
            (a.out / run.name / "FAILED").write_text(f"exit {code}\n")
            print(tail(log), file=sys.stderr)
            failed = failed or code
    shutil.rmtree(work, ignore_errors=True)  # what the analysis reads was kept in DIR
    result = analyze(a.out, planned, passthrough)
    print((a.out / "longtail.md").read_text())
    bad = [m for r in result["runs"] for m in r["lengths_mismatched"]]
    if bad:
        print("lengths not honoured:\n" + "\n".join(bad[:10]), file=sys.stderr)
        sys.exit(4)
    sys.exit(failed)


if __name__ == "__main__":
    main()
