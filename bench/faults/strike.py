"""How a fault-campaign trial strikes (bench/faults/trial.py's Trial inherits ``Injector``):
the run's processes by rank, which of them a fault hits, when its trigger comes, and each
fault's blow (a process, the monitor, the job, slurmctld, a node, the disk). The moments
and targets come from the plan (bench/faults/plan.py)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

from bench.faults.plan import ROLE_KINDS, Fault, TrialPlan, TrialResult
from grpo_hpc.core.paths import RunPaths
from grpo_hpc.core.progress import TrainState, read_progress

REPO = Path(__file__).resolve().parents[2]
STATE = Path(os.environ.get("GRPO_SLURM_STATE", "/var/lib/grpo-slurm"))
TRIGGER_TIMEOUT_S = 300.0
BUSY = (TrainState.GENERATING, TrainState.SCORING, TrainState.TRAINING)
"""A trainer inside a step."""
STOPS = ("hang_rank", "hang_generator")
"""The kinds that SIGSTOP their target (every other process kind SIGKILLs it)."""


def sh(*cmd: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """Run a command; a hang (slurmctld away) reads as exit 124, never raises."""
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(cmd, 124, "", f"timed out after {timeout} s")


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


# ------------------------------------------------------------------------- processes


def trainer_pids(paths: RunPaths) -> dict[int, int]:
    """pid -> rank of the run's trainer processes (not torchrun, and not their forked
    helpers such as the math-verify worker, which share the trainer's command line). In a
    split run the generator is one of them: the last rank."""
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


def struck_pids(kind: str, pids: dict[int, int], target: int = 0) -> list[int]:
    """Which of the run's processes (pid -> rank) a fault of ``kind`` hits (pure): the
    generator (the last rank) or trainer rank 0 alone for the role kinds, and nothing when
    the run has no second role up; rank ``target`` for ``hang_rank`` (else the first one
    found); every process for the other kinds (``kill_trainer``: the whole job)."""
    if kind in ROLE_KINDS:
        if len(set(pids.values())) < 2:
            return []
        rank = 0 if kind == "kill_trainer_only" else max(pids.values())
        return sorted(p for p, r in pids.items() if r == rank)
    if kind == "hang_rank":
        return [p for p, r in pids.items() if r == target] or list(pids)[:1]
    return sorted(pids)


def kill(pids, sig: int) -> None:  # noqa: ANN001
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


# ------------------------------------------------------------------------- injection


class Injector:
    """A trial's faults: waits for each one's trigger and moment, then strikes. The trial
    (bench/faults/trial.py) provides the run, the monitor and the squeue watch."""

    plan: TrialPlan
    paths: RunPaths
    result: TrialResult
    done: threading.Event
    stopped: set[int]
    """Processes SIGSTOPped: continued at the trial's end."""
    fault_times: list[tuple[float, int]]
    """(time, step in progress) of each fault that struck."""
    monitor: subprocess.Popen | None
    filler: Path

    def log(self, what: str) -> None:  # the trial's
        raise NotImplementedError

    def _start_monitor(self) -> None:  # the trial's
        raise NotImplementedError

    def _live_jobs(self) -> list[str]:  # the trial's
        raise NotImplementedError

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
                in_step0 = rec is not None and rec.state in BUSY and rec.step == 0
                return in_step0 and bool(trainer_pids(self.paths))

            return self._wait("first step", first_step, poll_s=0.02)
        if f.kind in ROLE_KINDS:

            def past_first_checkpoint() -> bool:
                rec = read_progress(self.paths.progress)
                if rec is None or rec.state not in BUSY or rec.step < 1:
                    return False
                return len(set(trainer_pids(self.paths).values())) >= 2

            return self._wait("a step past the first checkpoint, both roles up",
                              past_first_checkpoint, poll_s=0.05)  # fmt: skip
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
        if f.kind.startswith("kill_trainer") or f.kind == "kill_generator":
            victims = struck_pids(f.kind, pids, f.target)
            kill(victims, signal.SIGKILL)
            who = "" if len(victims) == len(pids) else f" rank {[pids[p] for p in victims]}"
            self.log(f"{f.kind}: SIGKILL{who} {victims}")
        elif f.kind in STOPS:
            stop = struck_pids(f.kind, pids, f.target)
            kill(stop, signal.SIGSTOP)
            self.stopped.update(stop)
            self.log(f"{f.kind}: SIGSTOP rank {[pids[p] for p in stop]} pids {stop}")
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
