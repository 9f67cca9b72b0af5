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

from bench.faults.plan import EXCLUSIVE, Fault, TrialPlan, TrialResult
from grpo_hpc.config.profiles import load_profile
from grpo_hpc.core.fsutil import read_jsonl
from grpo_hpc.core.paths import RunPaths
from grpo_hpc.core.progress import TrainState, read_progress
from grpo_hpc.core.slurm import job_name

REPO = Path(__file__).resolve().parents[2]
STATE = Path(os.environ.get("GRPO_SLURM_STATE", "/var/lib/grpo-slurm"))
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
TRIGGER_TIMEOUT_S = 300.0
TMPFS_SIZE = "64m"
BAD_NODE_STATES = ("down", "drain", "fail", "unk")
REPAIR_EVERY_S = 15.0
"""How often a trial checks the cluster for nodes left drained by something outside its
own fault (e.g. "Kill task failed" when slurmctld was away during a cancel) and repairs
them as an admin would (slurm/up.sh resumes them); each repair is noted in the trial."""


def cli_env() -> dict[str, str]:
    return {
        **os.environ,
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


def sh(*cmd: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """Run a command; a hang (slurmctld away) reads as exit 124, never raises."""
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(cmd, 124, "", f"timed out after {timeout} s")


# ------------------------------------------------------------------------- processes


def trainer_pids(paths: RunPaths) -> dict[int, int]:
    """pid -> rank of the run's trainer processes (not torchrun, and not their forked
    helpers such as the math-verify worker, which share the trainer's command line)."""
    found: dict[int, tuple[int, int]] = {}
    want = str(paths.root).encode()
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            argv = (d / "cmdline").read_bytes().split(b"\0")
            if b"grpo_hpc.train" not in argv or b"torch.distributed.run" in argv:
                continue
            if want not in argv:
                continue
            stat = (d / "stat").read_text().rsplit(")", 1)[1].split()
            if stat[0] in "ZX":
                continue
            env = (d / "environ").read_bytes().split(b"\0")
            rank = next((int(e[5:]) for e in env if e.startswith(b"RANK=")), 0)
            found[int(d.name)] = (rank, int(stat[1]))
        except (OSError, ValueError, IndexError):
            continue
    return {pid: rank for pid, (rank, ppid) in found.items() if ppid not in found}


def kill(pids, sig: int) -> None:  # noqa: ANN001
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def unhealthy_nodes(partition: str | None = None) -> list[str]:
    """Nodes sinfo lists as down, drained, failing or unknown, with Slurm's reason; with
    ``partition``, only that partition's (a node of another one, down under someone else's
    test, is not this trial's to repair)."""
    where = ["-p", partition] if partition else []
    out = sh("sinfo", "-h", "-N", *where, "-o", "%N|%t|%E").stdout.splitlines()
    bad = [line.split("|") for line in out if line.count("|") == 2]
    return [f"{n} {t} ({why})" for n, t, why in bad if t.startswith(BAD_NODE_STATES)]


def restore_cluster() -> str:
    """slurm/up.sh --nodes 2 (restarts what is missing), then wait for no node down."""
    proc = sh("bash", str(REPO / "slurm" / "up.sh"), "--nodes", "2", timeout=180)
    deadline = time.time() + 90
    while time.time() < deadline:
        states = sh("sinfo", "-h", "-N", "-o", "%N %t").stdout.split()
        if states and not any(s.startswith(("down", "drain", "fail", "unk")) for s in states):
            return ""
        time.sleep(1)
    return f"cluster not healthy after up.sh (rc {proc.returncode}): {states}"


# ------------------------------------------------------------------------- one trial


class Trial:
    """One run under one fault plan: submit, monitor, inject, observe, clean up."""

    monitor_flags: list[str] = MONITOR_FLAGS
    """grpo-monitor's flags for the trial's run (the GPU campaign sets its own)."""

    def __init__(self, plan: TrialPlan, root: Path, seed: int, max_steps: int = MAX_STEPS) -> None:
        self.plan, self.root, self.seed, self.max_steps = plan, root, seed, max_steps
        # The harness's pid in the name: job names (what squeue is asked about) never
        # collide with another campaign on the same cluster (CI's, say).
        self.paths = RunPaths.for_run(f"t{plan.index:03d}-{os.getpid()}", root)
        self.partition = load_profile(plan.profile).partition
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
        args = ["--profile", self.plan.profile, "--config", "tiny", "--name", self.paths.name]
        args += ["--logs", str(self.root), "--no-wait", f"training.seed={self.seed}"]
        args += [f"training.max_steps={self.max_steps}"]
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

    # -- injection
    def _wait(self, what: str, probe, poll_s: float = 0.1) -> bool:  # noqa: ANN001
        deadline = time.time() + TRIGGER_TIMEOUT_S
        while time.time() < deadline and not self.done.is_set():
            if probe():
                return True
            time.sleep(poll_s)
        self.log(f"missed: no {what}")
        return False

    def _trigger(self, f: Fault) -> bool:
        if f.kind == "kill_trainer_in_save":
            saving = lambda: any(self.paths.checkpoints.glob(".tmp-step-*"))  # noqa: E731
            return self._wait("checkpoint save", saving, poll_s=0.02)
        if f.kind == "kill_trainer_in_first_step":

            def first_step() -> bool:
                rec = read_progress(self.paths.progress)
                busy = (TrainState.GENERATING, TrainState.SCORING, TrainState.TRAINING)
                in_step0 = rec is not None and rec.state in busy and rec.step == 0
                return in_step0 and bool(trainer_pids(self.paths))

            return self._wait("first step", first_step, poll_s=0.02)
        return self._wait("trainer process", lambda: trainer_pids(self.paths))

    def _inject_all(self) -> None:
        try:
            for f in self.plan.faults:
                if not self._trigger(f):
                    continue
                time.sleep(f.delay_s)
                if self.done.is_set():
                    return
                rec = read_progress(self.paths.progress)
                self.fault_times.append((time.time(), rec.step if rec else 0))
                self.result.struck += 1
                self._strike(f)
        except Exception as e:  # noqa: BLE001
            self.log(f"injector error: {type(e).__name__}: {e}")

    def _strike(self, f: Fault) -> None:
        pids = trainer_pids(self.paths)
        if f.kind.startswith("kill_trainer"):
            kill(pids, signal.SIGKILL)
            self.log(f"{f.kind}: SIGKILL {sorted(pids)}")
        elif f.kind == "hang_rank":
            stop = [p for p, r in pids.items() if r == f.target] or list(pids)[:1]
            kill(stop, signal.SIGSTOP)
            self.stopped.update(stop)
            self.log(f"hang_rank: SIGSTOP rank {f.target} pids {stop}")
        elif f.kind == "scancel":
            live = self._live_jobs()
            sh("scancel", *live)
            self.log(f"scancel {live}")
        elif f.kind == "kill_monitor":
            self._kill_monitor(f.hold_s)
        elif f.kind == "restart_slurmctld":
            self._restart_slurmctld(f.hold_s)
        elif f.kind == "node_down":
            self._node_down(f)
        elif f.kind == "disk_full":
            self._disk_full(f.hold_s)

    def _kill_monitor(self, hold_s: float) -> None:
        mon = self.monitor
        self.monitor = None
        if mon is not None:
            mon.kill()
            mon.wait()
        self.log(f"kill_monitor: SIGKILL, down {hold_s} s")
        time.sleep(hold_s)
        if not self.done.is_set():
            self._start_monitor()
            self.log("monitor started again")

    def _restart_slurmctld(self, hold_s: float) -> None:
        pid = int((STATE / "run" / "slurmctld.pid").read_text().split()[0])
        os.kill(pid, signal.SIGTERM)
        for _ in range(100):
            if not Path(f"/proc/{pid}").exists():
                break
            time.sleep(0.1)
        self.log(f"restart_slurmctld: stopped pid {pid}, down {hold_s} s")
        time.sleep(hold_s)
        why = restore_cluster()
        self.log("slurmctld back" + (f" ({why})" if why else ""))

    def _node_down(self, f: Fault) -> None:
        node = f"grpo-n{f.target + 1}"
        pids = [int(p) for p in sh("ip", "netns", "pids", node).stdout.split()]
        kill(pids, signal.SIGKILL)
        self.log(f"node_down: killed {len(pids)} processes of {node} (slurmd included)")
        # Bring it back once Slurm has noticed (its job left RUNNING) or after a minute.
        deadline = time.time() + 60
        time.sleep(f.hold_s)
        while time.time() < deadline and not self.done.is_set():
            down = "down" in sh("sinfo", "-h", "-n", node, "-o", "%t").stdout
            if down:
                break
            time.sleep(1)
        why = restore_cluster()
        self.log(f"{node} back" + (f" ({why})" if why else ""))

    def _disk_full(self, hold_s: float) -> None:
        written = 0
        with contextlib.suppress(OSError), open(self.filler, "wb") as f:
            block = b"\0" * 2**20
            while True:
                f.write(block)
                f.flush()
                written += 1
        self.log(f"disk_full: filled {written} MiB, held {hold_s} s")
        time.sleep(hold_s)
        self.filler.unlink(missing_ok=True)
        self.log("disk freed")

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
