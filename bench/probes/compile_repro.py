"""Benchmark: do a GPU run's bits depend on the machine it runs on? (Inductor autotuning.)

torch.compile's Inductor times several launch configurations of some generated kernels
on the device and keeps the fastest; for a reduction, the configuration sets the order in
which it sums, so the choice changes the result's last bits, and a near-tie between two
configurations is decided by timing noise. The choice is then cached on the machine
(``TORCHINDUCTOR_CACHE_DIR``), so runs on one machine repeat each other while a run
resubmitted on another node need not. Inductor's deterministic mode skips the timings
that affect numerics; the trainer runs in it unless ``dist.deterministic_kernels=false``.

This script starts ``--runs`` copies of the same short ``bench/learning/run.py`` run (one
seed, grpo_hpc's defaults) at once, each with an empty Inductor cache of its own (so each
compiles and times afresh, while the others load the GPU), first with Inductor's timed
choices (``learning.py``'s system ``grpo_hpc_timed``) and then in the deterministic mode
(``grpo_hpc``, the default), and reports how many distinct trajectories (the reward
and gradient norm of every step, to the last bit) each mode gave.

    python -m bench.probes.compile_repro --runs 4 --seed 5 --steps 3 \
        --out bench/results/archive/h100_compile_repro.json
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.common import env_info, write_result


def launch(work: Path, i: int, deterministic: bool, args: argparse.Namespace) -> subprocess.Popen:
    """One learning.py run with a fresh Inductor cache (and its own output directory)."""
    out = work / f"run{i}"
    out.mkdir()
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(out / "inductor"))
    cmd = [sys.executable, "-m", "bench.learning", "--out", str(out), "--name", "run"]
    cmd += ["--systems", system(deterministic), "--seeds", str(args.seed)]
    cmd += ["--steps", str(args.steps)]
    cmd += ["--eval-every", str(args.steps), "--num-eval", str(args.num_eval)]
    cmd += shlex.split(args.learning_args)
    return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def system(deterministic: bool) -> str:
    """learning.py's name for grpo_hpc's defaults with or without deterministic kernels."""
    return "grpo_hpc" if deterministic else "grpo_hpc_timed"


def trajectory(out: Path, deterministic: bool) -> list[tuple[float, float]]:
    """(reward, gradient norm) of every step of the run in ``out``."""
    run = json.loads((out / "run.json").read_text())["systems"][system(deterministic)][0]
    return [(s["reward"], s["grad_norm"]) for s in run["steps"]]


def one_mode(deterministic: bool, args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory() as d:
        work = Path(d)
        procs = [launch(work, i, deterministic, args) for i in range(args.runs)]
        trajs, errors = [], []
        for i, p in enumerate(procs):
            _, err = p.communicate()
            if p.returncode == 0:
                trajs.append(trajectory(work / f"run{i}", deterministic))
            else:
                errors.append(err.decode()[-1500:])
    distinct = sorted({json.dumps(t) for t in trajs})
    return {
        "deterministic": deterministic,
        "runs_ok": len(trajs),
        "errors": errors,
        "distinct_trajectories": len(distinct),
        "trajectories": [json.loads(t) for t in distinct],
    }


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--runs", type=int, default=4, help="copies per mode, started at once")
    p.add_argument("--seed", type=int, default=5)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--num-eval", type=int, default=16)
    p.add_argument("--modes", nargs="+", default=["default", "deterministic"])
    p.add_argument(
        "--learning-args", default="", help="more learning.py options (a small CPU check)"
    )
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    modes = []
    for mode in args.modes:
        r = one_mode(mode == "deterministic", args)
        modes.append(r | {"mode": mode})
        print(f"{mode:14} {r['runs_ok']}/{args.runs} runs, {r['distinct_trajectories']} distinct")
        for t in r["trajectories"]:
            print("   ", " ".join(f"{rew:.4f}/{g:.6f}" for rew, g in t))
        for e in r["errors"]:
            print("   error:", e.splitlines()[-1] if e else "?")
    config = {k: getattr(args, k) for k in ("runs", "seed", "steps", "num_eval", "learning_args")}
    write_result(
        {"benchmark": "compile_repro", "config": config, "modes": modes, "env": env_info()},
        args.out,
    )


if __name__ == "__main__":
    main()
