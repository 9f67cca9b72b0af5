"""GPU fault campaign on a Slurm GPU node (slurm/up.sh --real-gpus): per trial,
one 2-rank FSDP2 run of the random ``tiny`` model in bf16 on two GPUs, submitted with
grpo-submit and watched by grpo-monitor, as a user would; one fault per trial (a rank
killed, a rank hung, a rank killed inside a DCP save, the time limit, a step-0 stall, a
CUDA OOM: bench/faults/gpu_plan.py). Per trial: when the job ended after the fault, when
the monitor acted, when training went on, steps redone, duplicate jobs, checkpoints that
fail ``grpo-ckpt verify``, and whether every resumed rank's state (weights, optimizer, RNG,
data position) equals its checkpoint's digest.

Trials run K at a time (K = the node's GPUs / 2), longest kinds first. Results go to --out
after every trial (temp file, then rename); each trial's small files go to --evidence.
Every process it starts, and every job, gets NVLink multicast off.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path

import yaml

from bench.faults.gpu_plan import (
    STRUCK,
    GpuTrialPlan,
    GpuTrialResult,
    markdown_table,
    plan_trial,
    repeated_steps,
    summarize,
    verdict,
)
from bench.faults.plan import Fault, TrialPlan
from bench.faults.trial import REPO, Trial, cli, kill, sh, trainer_pids
from grpo_hpc.core.fsutil import atomic_write_text, read_jsonl
from grpo_hpc.core.progress import read_progress
from grpo_hpc.core.slurm import job_name
from grpo_hpc.train.state import state_digest

NO_MULTICAST = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}
SAVE_EVERY = 2
MAX_STEPS = 10
RUN_OVERRIDES = [
    "rollout.prompts_per_step=8",
    "rollout.num_generations=4",
    "rollout.max_new_tokens=16",
    "algo.micro_batch_size=16",
    f"training.save_every_steps={SAVE_EVERY}",
    "training.keep_last=2",
    "training.num_threads=4",
    "training.eval_every=0",
    "faults.enabled=true",
    "faults.step_sleep=1.0",  # steps long enough to be struck in
    "faults.slow_save=0.5",  # saves long enough to be struck in
    "faults.state_digest=true",
]
KIND_OVERRIDES = {
    "time_limit": ["training.max_steps=30", "faults.step_sleep=3.0"],
    "step0_stall": ["faults.hang_at_step=0"],
    "cuda_oom": ["faults.oom_at_step=3", "faults.oom_gpu_gb=0.01"],
}
MONITOR_FLAGS = ["--interval", "5", "--step0-timeout", "60", "--backoff", "0",
                 "--max-retries", "8"]  # fmt: skip
"""The step-0 limit is the campaign's (the default, 1800 s, covers a 7B start-up); the
heartbeat limit is the default: a hung rank must be ended by the job itself."""
TIME_LIMIT = {"time_min": 2, "signal_lead_s": 45}
EXPECTED_S = {"time_limit": 250, "step0_stall": 130, "cuda_oom": 45}
"""Trial lengths seen on 2x H100 (the struck kinds ~120 s): no trial starts that would
overrun --deadline."""


def write_profile(folder: Path, base: Path, node_mem_gb: int, parallel: int, kind: str) -> Path:
    """The base profile (bench/slurm-h100x2.yaml) for a campaign job: a share of the node's
    memory and CPUs, quieter NCCL, the time limit of its kind. A CPU base (the test
    cluster's templates/slurm-local.yaml, to try the harness) gets 2 processes."""
    prof = yaml.safe_load(base.read_text())
    prof["mem_gb"] = max(4, int(node_mem_gb * 0.8 / parallel))
    prof["time_min"] = 10
    prof.setdefault("env", {})["NCCL_DEBUG"] = "WARN"
    if prof.get("gpus_per_node"):
        prof["cpus_per_task"] = 8
    else:
        prof.update(nproc_per_node=2, cpus_per_task=2, strategy="fsdp")
    if kind == "time_limit":
        prof.update(TIME_LIMIT)
    folder.mkdir(parents=True, exist_ok=True)
    if prof.get("template"):
        shutil.copy(base.parent / prof["template"], folder / prof["template"])
    path = folder / f"gpu-{kind}.yaml"
    path.write_text(yaml.safe_dump(prof, sort_keys=False))
    return path


class GpuTrial(Trial):
    """One GPU trial: Trial's submission, monitor and squeue watch, with its own faults."""

    monitor_flags = MONITOR_FLAGS

    def __init__(
        self, plan: GpuTrialPlan, root: Path, seed: int, profile: Path, steps: int = MAX_STEPS
    ) -> None:
        fault = Fault(plan.kind, plan.delay_s, target=plan.target)
        faults = (fault,) if plan.kind in STRUCK else ()
        super().__init__(TrialPlan(plan.index, plan.kind, str(profile), faults), root, seed)
        self.gplan, self.profile = plan, profile
        self.max_steps = 30 if plan.kind == "time_limit" else steps
        self.states: list[tuple[float, str, str]] = []  # (time, job id, state) on change

    def repair_cluster(self) -> str:
        r = sh("bash", str(REPO / "slurm" / "up.sh"), "--real-gpus", timeout=180)
        return "" if r.returncode == 0 else f"up.sh --real-gpus rc {r.returncode}"

    def _submit(self) -> None:
        args = ["--profile", str(self.profile), "--config", "tiny", "--name", self.paths.name]
        args += ["--logs", str(self.root), "--no-wait", f"training.seed={self.seed}"]
        args += [f"training.max_steps={self.max_steps}", *RUN_OVERRIDES]
        args += KIND_OVERRIDES.get(self.plan.kind, [])
        r = sh(*cli("submit"), *args, timeout=180)
        if r.returncode:
            raise RuntimeError(f"grpo-submit failed ({r.returncode}): {r.stderr.strip()[-500:]}")

    def _live_jobs(self) -> list[str]:
        """Trial's squeue poll, also keeping each job's state changes (ended, requeued)."""
        r = sh("squeue", "-h", f"--name={job_name(self.paths.name)}", "-o", "%i|%T")
        if r.returncode:
            return []
        rows = dict(line.split("|") for line in r.stdout.split() if "|" in line)
        now, last = time.time(), {j: s for _, j, s in self.states}
        for job, state in rows.items():
            if last.get(job) != state:
                self.states.append((now, job, state))
        for job, state in last.items():
            if job not in rows and state != "GONE":
                self.states.append((now, job, "GONE"))
        return list(rows)

    def _trigger(self, f: Fault) -> bool:
        ckpt_steps = lambda: self.paths.checkpoint_steps(complete_only=True)  # noqa: E731
        if f.kind == "kill_rank_in_save":  # a save with a complete checkpoint before it

            def saving() -> bool:
                tmp = self.paths.checkpoints.glob(".tmp-step-*")
                steps = [int(p.name.rsplit("-", 1)[1]) for p in tmp]
                return any(s > SAVE_EVERY for s in steps) and bool(ckpt_steps())

            return self._wait("checkpoint save after the first", saving, poll_s=0.02)

        def past_first_checkpoint() -> bool:
            rec = read_progress(self.paths.progress)
            return bool(ckpt_steps()) and rec is not None and rec.step > SAVE_EVERY

        return self._wait("a step past the first checkpoint", past_first_checkpoint)

    def _strike(self, f: Fault) -> None:
        pids = [p for p, r in trainer_pids(self.paths).items() if r == f.target]
        if f.kind == "hang_rank":
            kill(pids, signal.SIGSTOP)
            self.stopped.update(pids)
        else:
            kill(pids, signal.SIGKILL)
        self.log(f"{f.kind}: {'SIGSTOP' if f.kind == 'hang_rank' else 'SIGKILL'} rank "
                 f"{f.target} pids {pids}")  # fmt: skip

    def _measure(self) -> None:
        super()._measure()  # finished, jobs, grpo-ckpt verify, recover_s
        self.gpu = gpu_result(self)


def gpu_result(t: GpuTrial) -> GpuTrialResult:
    """What the trial's files, squeue record and monitor events say (after it ended)."""
    base, p, plan = t.result, t.paths, t.gplan
    r = GpuTrialResult(plan.index, plan.kind, plan.target, finished=base.finished)
    r.jobs_submitted, r.max_live_jobs = base.jobs_submitted, base.max_live_jobs
    r.bad_checkpoints, r.injected = base.bad_checkpoints, base.injected
    r.notes, r.error = base.notes, base.error
    rec = read_progress(p.progress) if p.progress.exists() else None
    r.attempts = rec.attempt + 1 if rec else 0
    events = read_jsonl(p.events)
    decisions = [e for e in events if e.get("phase") == "decision" and e.get("action") != "NONE"]
    r.decisions = [f"{e.get('class')} {e.get('action')}" for e in decisions]
    r.stopped = next((str(e.get("class")) for e in decisions if e.get("action") == "STOP"), "")
    metrics = [m for m in read_jsonl(p.metrics) if "reward/mean" in m]
    r.steps_repeated = repeated_steps([int(m["step"]) for m in metrics])
    first_job = next((j for _, j, _ in t.states), None)
    run_at = next((s for s, j, st in t.states if j == first_job and st == "RUNNING"), None)
    if t.fault_times:
        t_fault, r.fault_step = t.fault_times[0]
    else:  # the built-in faults: from the job's start
        t_fault = run_at
    left = [s for s, j, st in t.states if j == first_job and st != "RUNNING"]
    end = next((s for s in left if run_at is not None and s > run_at), None)
    if t_fault is not None and end is not None:
        r.ended_s = round(end - t_fault, 1)
        # the monitor's first decision after the fault, or the job running again when Slurm
        # requeued it in place (the time limit: submitit requeues up to 3 times)
        acted = [float(e["time"]) for e in decisions
                 if float(e["time"]) > t_fault and e.get("action") != "DONE"]  # fmt: skip
        again = [s for s, j, st in t.states if j == first_job and st == "RUNNING" and s > end]
        nxt = min(acted + again, default=None)
        r.act_s = round(nxt - t_fault, 1) if nxt is not None else None
        later = [m["time"] - t_fault for m in metrics if m["time"] > end]
        r.recover_s = round(min(later), 1) if later else None
    r.reason = _faulted_reason(t)
    r.resumes, r.resume_mismatch = state_digest.compare_folder(p.state_digest)
    return r


def _faulted_reason(t: GpuTrial) -> str:
    """The faulted attempt's reason as progress.json showed it (the monitor's events keep
    it: a later attempt overwrites progress.json)."""
    for e in read_jsonl(t.paths.events):
        if e.get("phase") == "decision" and e.get("action") not in (None, "NONE", "DONE"):
            return str(e.get("reason", ""))
    rec = read_progress(t.paths.progress) if t.paths.progress.exists() else None
    return rec.reason or "" if rec else ""


def keep_evidence(t: GpuTrial, dest: Path) -> None:
    """The trial's small files (logs' tails, records, digests) for the results folder."""
    dest.mkdir(parents=True, exist_ok=True)
    p = t.paths
    for f in (p.progress, p.events, p.jobs, p.metrics, t.root / "monitor.out", p.job_summary):
        if f.exists():
            shutil.copy(f, dest / f.name)
    if p.training_log.exists():
        (dest / "training_output_tail.log").write_bytes(p.training_log.read_bytes()[-20000:])
    for sub in (p.state_digest, p.nccl_trace):
        if sub.is_dir():
            shutil.copytree(sub, dest / sub.name, dirs_exist_ok=True)
    for f in p.submitit_dir.glob("*/*_log.*"):
        (dest / f"job_{f.name}").write_bytes(f.read_bytes()[-8000:])
    states = [f"{s:.1f} {j} {st}" for s, j, st in t.states]
    (dest / "squeue_states.txt").write_text("\n".join(states) + "\n")


def _devices() -> list[str]:
    if not shutil.which("nvidia-smi"):
        return ["cpu (no nvidia-smi)"]
    return sh("nvidia-smi", "-L").stdout.strip().splitlines()


def node_facts() -> tuple[int, int]:
    """(GPUs as GRES, memory in GB) of the cluster's node."""
    out = sh("scontrol", "show", "node").stdout
    gpus = int(out.split("Gres=gpu:")[1].split()[0].split("(")[0]) if "Gres=gpu:" in out else 0
    mem = int(out.split("RealMemory=")[1].split()[0]) // 1024 if "RealMemory=" in out else 64
    return gpus, mem


def order(plans: list[GpuTrialPlan]) -> list[GpuTrialPlan]:
    """Longest kinds first, so that the short ones fill in around them."""
    return sorted(plans, key=lambda p: (-EXPECTED_S.get(p.kind, 120), p.index))


EXAMPLES = """examples:
  python -m bench.faults.gpu_run --trials 18 --out bench/results/gpu_faults.json
  python -m bench.faults.gpu_run --only 3,9 --deadline 540 --out /tmp/rerun.json
  python -m bench.faults.gpu_run --table bench/results/gpu_faults.json
Trial i is KINDS[i % 6] with moments drawn from (seed, i). Needs root, a cluster from
slurm/up.sh --real-gpus with 2 or more GPUs, and grpo_hpc importable (bench/gpu.sh faults).
"""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench.faults.gpu_run", description=__doc__.split("\n\n")[0],
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    ap.add_argument("--trials", type=int, default=18, help="trials 0..N-1 (default 18)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--only", help="comma-separated trial indices")
    ap.add_argument(
        "--max-steps", type=int, default=MAX_STEPS,
        help=f"steps per run but the time limit's 30 (default {MAX_STEPS}; at least "
        f"{3 * SAVE_EVERY}: faults strike after the first checkpoint)",
    )  # fmt: skip
    ap.add_argument("--out", type=Path, default=REPO / "bench/results/gpu_faults.json")
    ap.add_argument("--evidence", type=Path, help="folder for each trial's small files")
    ap.add_argument("--work", type=Path, default=Path("/tmp/grpo-gpu-faults"))
    ap.add_argument("--deadline", type=float, default=0, help="start no trial that would end "
                    "later than this many seconds from now (0: none)")  # fmt: skip
    ap.add_argument(
        "--profile",
        type=Path,
        default=REPO / "bench/slurm-h100x2.yaml",
        help="base profile (templates/slurm-local.yaml: the CPU test cluster)",
    )
    ap.add_argument("--table", type=Path, metavar="JSON", help="print a results file's table")
    args = ap.parse_args(argv)
    if args.table:
        print(markdown_table(json.loads(args.table.read_text())["summary"]))
        return 0
    os.environ.update(NO_MULTICAST)
    indices = [int(i) for i in args.only.split(",")] if args.only else range(args.trials)
    plans = order([plan_trial(args.seed, i) for i in indices])
    gpus, mem = node_facts()
    cpu = not yaml.safe_load(args.profile.read_text()).get("gpus_per_node")
    if gpus < 2 and not cpu:
        raise SystemExit("gpu_run.py: the cluster's node declares fewer than 2 GPUs "
                         "(start it with slurm/up.sh --real-gpus)")  # fmt: skip
    parallel = 1 if cpu else gpus // 2
    old = json.loads(args.out.read_text()) if args.out.exists() else {}
    results = {r["index"]: r for r in old.get("trials", [])}
    meta = {
        "campaign": {"seed": args.seed, "gpus": gpus, "parallel": parallel,
                     "command": " ".join(["python -m bench.faults.gpu_run",
                                          *(argv or sys.argv[1:])]),
                     "device": _devices()},
        "run": {"config": "tiny", "overrides": RUN_OVERRIDES, "by_kind": KIND_OVERRIDES,
                "monitor": MONITOR_FLAGS, "profile": "bench/slurm-h100x2.yaml + "
                f"time_min 10 (time_limit: {TIME_LIMIT}), NCCL_DEBUG=WARN"},
    }  # fmt: skip
    start, lock = time.time(), threading.Lock()

    def one(plan: GpuTrialPlan) -> None:
        if args.deadline and time.time() - start + EXPECTED_S.get(plan.kind, 120) > args.deadline:
            print(f"trial {plan.index} {plan.kind}: skipped (deadline)", flush=True)
            return
        root = args.work / f"trial-{plan.index:03d}"
        shutil.rmtree(root, ignore_errors=True)
        profile = write_profile(args.work / "profiles", args.profile, mem, parallel, plan.kind)
        trial = GpuTrial(plan, root, args.seed, profile, args.max_steps)
        trial.run()
        r = trial.gpu
        r.wall_s = trial.result.wall_s
        if args.evidence:
            keep_evidence(trial, args.evidence / f"trial-{plan.index:03d}-{plan.kind}")
        why = verdict(r, SAVE_EVERY)
        with lock:
            results[plan.index] = {**asdict(r), "passed": not why, "why": why}
            rows = [GpuTrialResult(**{k: v for k, v in x.items() if k not in ("passed", "why")})
                    for _, x in sorted(results.items())]  # fmt: skip
            doc = {**meta, "summary": summarize(rows, SAVE_EVERY),
                   "trials": [x for _, x in sorted(results.items())]}  # fmt: skip
            args.out.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_text(args.out, json.dumps(doc, indent=1) + "\n")
        state = "ok" if not why else "FAIL: " + "; ".join(why)
        print(f"trial {plan.index:3d} {plan.kind:18s} {r.wall_s:6.1f}s ended {r.ended_s} "
              f"acted {r.act_s} recovered {r.recover_s} jobs {r.jobs_submitted} {state}",
              flush=True)  # fmt: skip

    with ThreadPoolExecutor(max_workers=parallel) as pool:
        for f in [pool.submit(one, p) for p in plans]:
            f.result()
    if not results:
        return 1
    doc = json.loads(args.out.read_text())
    print(markdown_table(doc["summary"]))
    return 0 if not doc["summary"]["failed"] else 1


if __name__ == "__main__":
    sys.exit(main())
