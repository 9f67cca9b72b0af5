"""One fault-campaign trial on the local test Slurm cluster: submit a tiny run, start the
monitor, strike at the planned moments (trainer, monitor, job, slurmctld, a rank, a node,
the disk), watch squeue for duplicate jobs, clean up. ``bench/faults/run.py`` runs many and
judges them; the plan (what, when) comes from ``bench/faults/plan.py``."""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict
from pathlib import Path

from bench.faults.plan import (
    EXCLUSIVE,
    PLACEMENT_OVERRIDES,
    TrialPlan,
    TrialResult,
    first_decision,
)
from bench.faults.strike import (  # noqa: F401 - kill, trainer_pids: gpu_run.py's, from here
    REPO,
    Injector,
    kill,
    restore_cluster,
    sh,
    trainer_pids,
)
from grpo_hpc.config.profiles import load_profile
from grpo_hpc.core.fsutil import read_jsonl
from grpo_hpc.core.paths import RunPaths
from grpo_hpc.core.progress import TrainState, read_progress
from grpo_hpc.core.slurm import job_name

PROFILES = REPO / "bench" / "faults" / "profiles"
"""The campaign's own profiles (``slurm-local-split``), found here before grpo_hpc's."""
MAX_STEPS = 6
"""Default steps per run (--max-steps)."""
RUN_OVERRIDES = [
    "training.save_every_steps=1",
    "training.keep_last=2",
    "training.num_threads=1",
    "faults.enabled=true",
    "faults.step_sleep=0.3",  # steps long enough that random moments land inside them
    "faults.slow_save=0.3",  # saves long enough to be hit
]
MONITOR_FLAGS = [
    "--interval", "1", "--step0-timeout", "60", "--heartbeat-timeout", "20",
    "--backoff", "0", "--max-retries", "8",
]  # fmt: skip
TRIAL_TIMEOUT_S = 600.0
"""Whole trial, queue waits included (the cluster is shared)."""
TMPFS_SIZE = "64m"
BAD_NODE_STATES = ("down", "drain", "fail", "unk")
REPAIR_EVERY_S = 15.0
"""How often a trial checks the cluster for nodes left drained by something outside its
own fault (e.g. "Kill task failed" when slurmctld was away during a cancel) and repairs
them as an admin would (slurm/up.sh resumes them); each repair is noted in the trial."""


def cli_env() -> dict[str, str]:
    """The CLIs' environment, which sbatch exports to the jobs: this checkout's code first
    on PYTHONPATH, so that the jobs train with the code the campaign runs from, not with an
    installed copy of grpo_hpc (another checkout's, installed editable)."""
    path = [str(REPO), *(p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p)]
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(dict.fromkeys(path)),
        "OMP_NUM_THREADS": "1",
        "PYTHONUNBUFFERED": "1",
        "TRANSFORMERS_VERBOSITY": "error",
        "HF_HUB_OFFLINE": "1",
        "WANDB_MODE": "disabled",
    }


def cli(name: str) -> list[str]:
    """A grpo_hpc command (``grpo-<name>``) by its module: works where the package is only
    on PYTHONPATH, as on the lent GPU machines (bench/faults/gpu_run.py)."""
    return [sys.executable, "-m", f"grpo_hpc.cli.{name}"]


def profile_arg(name: str) -> str:
    """What ``--profile`` gets for the plan's profile ``name``: the campaign's own file
    where it has one (bench/faults/profiles/), else the name (grpo_hpc's templates)."""
    own = PROFILES / f"{name}.yaml"
    return str(own) if own.is_file() else name


def unhealthy_nodes(partition: str | None = None) -> list[str]:
    """Nodes sinfo lists as down, drained, failing or unknown, with Slurm's reason; with
    ``partition``, only that partition's (a node of another one, down under someone else's
    test, is not this trial's to repair)."""
    where = ["-p", partition] if partition else []
    out = sh("sinfo", "-h", "-N", *where, "-o", "%N|%t|%E").stdout.splitlines()
    bad = [line.split("|") for line in out if line.count("|") == 2]
    return [f"{n} {t} ({why})" for n, t, why in bad if t.startswith(BAD_NODE_STATES)]


# ------------------------------------------------------------------------- one trial


class Trial(Injector):
    """One run under one fault plan: submit, monitor, inject, observe, clean up."""

    monitor_flags: list[str] = MONITOR_FLAGS
    """grpo-monitor's flags for the trial's run (the GPU campaign sets its own)."""

    def __init__(
        self, plan: TrialPlan, root: Path, seed: int, max_steps: int = MAX_STEPS,
        extra: tuple[str, ...] = (),
    ) -> None:  # fmt: skip
        """``extra``: config overrides every run of the campaign adds after its
        placement's (``--override``, ``--ending-model``)."""
        self.plan, self.root, self.seed, self.max_steps = plan, root, seed, max_steps
        self.extra = extra
        # The harness's pid in the name: job names (what squeue is asked about) never
        # collide with another campaign on the same cluster (CI's, say).
        self.paths = RunPaths.for_run(f"t{plan.index:03d}-{os.getpid()}", root)
        self.partition = load_profile(profile_arg(plan.profile)).partition
        """Where the run's jobs go: the nodes whose health this trial watches and repairs."""
        self.result = TrialResult(
            plan.index, plan.kind, plan.profile, [asdict(f) for f in plan.faults]
        )
        self.t0 = time.time()
        self.monitor: subprocess.Popen | None = None
        self.done = threading.Event()
        self.stopped: set[int] = set()
        self.fault_times: list[tuple[float, int]] = []
        self.mounted = False
        self.filler = root / ".filler"

    def repair_cluster(self) -> str:
        """Bring the cluster back to health as its admin would ("" when it is)."""
        return restore_cluster()

    def log(self, what: str) -> None:
        self.result.injected.append(f"{time.time() - self.t0:6.1f}s {what}")

    # -- lifecycle
    def run(self) -> TrialResult:
        try:
            self._setup()
            self._submit()
            self._start_monitor()
            threads = [threading.Thread(target=self._watch_squeue, daemon=True)]
            threads.append(threading.Thread(target=self._inject_all, daemon=True))
            for t in threads:
                t.start()
            self._wait_monitor()
        except Exception as e:  # noqa: BLE001 - a harness problem is recorded, not raised
            self.result.error = f"{type(e).__name__}: {e}"
        finally:
            self.done.set()
            self._cleanup()
        self._measure()
        self.result.wall_s = round(time.time() - self.t0, 1)
        return self.result

    def _setup(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        if any(f.kind == "disk_full" for f in self.plan.faults):
            r = sh("mount", "-t", "tmpfs", "-o", f"size={TMPFS_SIZE}", "tmpfs", str(self.root))
            if r.returncode:
                raise RuntimeError(f"mount tmpfs: {r.stderr.strip()}")
            self.mounted = True

    def _submit(self) -> None:
        profile = profile_arg(self.plan.profile)
        args = ["--profile", profile, "--config", "tiny", "--name", self.paths.name]
        args += ["--logs", str(self.root), "--no-wait", f"training.seed={self.seed}"]
        args += [f"training.max_steps={self.max_steps}", *PLACEMENT_OVERRIDES[self.plan.placement]]
        args += self.extra
        r = subprocess.run(
            [*cli("submit"), *args, *RUN_OVERRIDES],
            capture_output=True, text=True, env=cli_env(), timeout=120, cwd=REPO,
        )  # fmt: skip
        if r.returncode:
            raise RuntimeError(f"grpo-submit failed ({r.returncode}): {r.stderr.strip()}")

    def _start_monitor(self) -> None:
        log = open(self.root / "monitor.out", "ab")  # noqa: SIM115 - owned by the process
        cmd = [*cli("monitor"), self.paths.name, "--logs", str(self.root)]
        self.monitor = subprocess.Popen(
            [*cmd, *self.monitor_flags],
            stdout=log, stderr=subprocess.STDOUT, env=cli_env(), cwd=REPO,
        )  # fmt: skip

    def _wait_monitor(self) -> None:
        deadline, next_check = self.t0 + TRIAL_TIMEOUT_S, time.time() + REPAIR_EVERY_S
        own_nodes = any(f.kind in EXCLUSIVE for f in self.plan.faults)  # its injector repairs
        while time.time() < deadline:
            if not own_nodes and time.time() > next_check:
                next_check = time.time() + REPAIR_EVERY_S
                bad = unhealthy_nodes(self.partition)
                if bad:
                    why = self.repair_cluster()
                    self.result.notes.append(
                        f"cluster repaired: {bad}" + (f"; {why}" if why else "")
                    )
            mon = self.monitor
            if mon is not None and mon.poll() is not None and mon is self.monitor:
                self.result.monitor_rc = mon.returncode  # 0: DONE, 1: STOPPED, else a crash
                return
            time.sleep(0.5)
        raise TimeoutError(f"trial did not end within {TRIAL_TIMEOUT_S:.0f} s")

    # -- observation
    def _live_jobs(self) -> list[str]:
        r = sh("squeue", "-h", f"--name={job_name(self.paths.name)}", "-o", "%i|%T")
        if r.returncode:
            return []
        return [line.split("|")[0] for line in r.stdout.split() if "|" in line]

    def _watch_squeue(self) -> None:
        seen: set[str] = set()
        while not self.done.is_set():
            live = self._live_jobs()
            seen.update(live)
            if len(live) > self.result.max_live_jobs:
                self.result.max_live_jobs = len(live)
                if len(live) > 1:
                    self.log(f"DUPLICATE: squeue lists {live}")
            self.result.jobs_seen = len(seen)
            time.sleep(0.5)

    # -- end
    def _cleanup(self) -> None:
        kill(self.stopped, signal.SIGCONT)
        if self.monitor is not None and self.monitor.poll() is None:
            self.monitor.kill()
            self.monitor.wait()
        deadline = time.time() + 30  # a finished job may take seconds to leave squeue
        while (live := self._live_jobs()) and time.time() < deadline:
            time.sleep(0.5)
        if live:
            sh("scancel", *live)
            self.result.notes.append(f"jobs still queued 30 s after the end, cancelled: {live}")
        self.filler.unlink(missing_ok=True)

    def _measure(self) -> None:
        p, r = self.paths, self.result
        rec = read_progress(p.progress) if p.progress.exists() else None
        done = any(
            e.get("phase") == "decision" and e.get("action") == "DONE" for e in read_jsonl(p.events)
        )
        r.finished = bool(
            rec and rec.state == TrainState.FINISHED and rec.step == self.max_steps and done
        )
        r.jobs_submitted = len(read_jsonl(p.jobs))
        final = p.checkpoint(self.max_steps)
        if (final / "COMPLETE").exists():
            try:
                r.notes.append(f"weights {weights_hash(final)[:16]}")
            except Exception as e:  # noqa: BLE001 - unreadable weights: recorded
                r.notes.append(f"final weights unreadable: {e}")
        v = subprocess.run(
            [*cli("ckpt"), "verify", p.name, "--logs", str(self.root)],
            capture_output=True, text=True, env=cli_env(), timeout=120,
        )  # fmt: skip
        r.bad_checkpoints = sum(": BAD" in line for line in v.stdout.splitlines())
        if v.returncode not in (0, 1):
            r.notes.append(f"grpo-ckpt verify rc {v.returncode}: {v.stderr.strip()[-200:]}")
        r.recover_s = self._recovery()
        if self.fault_times:
            r.decision, r.act_s = first_decision(read_jsonl(p.events), self.fault_times[0][0])
        if self.mounted:  # keep the run's small files: the tmpfs goes away
            keep = shutil.ignore_patterns("checkpoints", "tiny_model", ".filler")
            with contextlib.suppress(OSError):
                shutil.copytree(
                    self.root, self.root.with_name(self.root.name + "-files"), ignore=keep
                )
            sh("umount", "-l", str(self.root))

    def _recovery(self) -> float | None:
        if not self.fault_times:
            return None
        t_f, step_f = self.fault_times[0]
        for m in read_jsonl(self.paths.metrics):
            if "reward/mean" in m and m["time"] > t_f and int(m["step"]) > step_f:
                return round(m["time"] - t_f, 1)
        return None


def weights_hash(ckpt: Path) -> str:
    """sha256 over every tensor of the checkpoint's model (name, dtype, shape, bytes)."""
    import torch

    from grpo_hpc.train.state.checkpoint import model_weights

    h = hashlib.sha256()
    for name, t in sorted(model_weights(ckpt).items()):
        t = t.contiguous().cpu()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()
