"""What one monitor pass asks of Slurm, counted at the process level: every sacct, squeue
and scancel the pass starts goes through grpo_hpc.core.slurm's subprocess call, faked
here to answer as Slurm 22.05 does. The real counts on the test cluster, 100 runs:
bench/faults/monitor_cost.py (bench/results/monitor_cost_100runs_cpu_2026-12-04.md)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from grpo_hpc.core import events as event_log
from grpo_hpc.core import slurm as slurm_mod
from grpo_hpc.core.fsutil import append_jsonl
from grpo_hpc.core.paths import RunPaths
from grpo_hpc.core.progress import ProgressRecord, TrainState, write_progress
from grpo_hpc.monitor.attempts import poll_delays
from grpo_hpc.monitor.decision import ActionKind, MonitorPolicy, pending_intent
from grpo_hpc.monitor.loop import CANCEL_WAIT_S, Backend, monitor_pass


class FakeSlurmTools:
    """sacct/squeue/scancel as processes: records each argv, answers from ``states``."""

    def __init__(self, states: dict[str, str], cancel_takes_effect: bool = True) -> None:
        self.states = states
        self.cancel_takes_effect = cancel_takes_effect
        self.lingering: set[str] = set()
        """Jobs squeue still lists whatever sacct says (a job ending: COMPLETING)."""
        self.calls: list[list[str]] = []

    def run(self, cmd: list[str], **_: object) -> subprocess.CompletedProcess:
        self.calls.append(list(cmd))
        out = ""
        if cmd[0] == "sacct":
            ids = cmd[cmd.index("-j") + 1].split(",")
            start = int(time.time()) - 600
            out = "".join(
                f"{j}|{self.states[j]}|0:0|00:10:00|{start}|localhost\n"
                for j in ids
                if j in self.states
            )
        elif cmd[0] == "squeue":
            listed = {j for j, s in self.states.items() if s in slurm_mod.ACTIVE_STATES}
            out = "".join(f"{j}\n" for j in sorted(listed | self.lingering))
        elif cmd[0] == "scancel" and self.cancel_takes_effect:
            self.states[cmd[-1]] = "CANCELLED"
        return subprocess.CompletedProcess(cmd, 0, out, "")

    def tools(self) -> list[str]:
        return [c[0] for c in self.calls]


@pytest.fixture
def fake_tools(monkeypatch: pytest.MonkeyPatch):
    def install(states: dict[str, str], **kw: bool) -> FakeSlurmTools:
        fake = FakeSlurmTools(states, **kw)
        fake_sub = SimpleNamespace(run=fake.run, TimeoutExpired=subprocess.TimeoutExpired)
        monkeypatch.setattr(slurm_mod, "subprocess", fake_sub)
        monkeypatch.setattr(slurm_mod, "shutil", SimpleNamespace(which=lambda c: f"/bin/{c}"))
        return fake

    return install


def make_runs(root: Path, n: int, heartbeat_age_s: float = 5.0) -> tuple[list[RunPaths], dict]:
    """n runs, each with one Slurm job: even ones RUNNING with a live trainer, odd PENDING."""
    runs, states, now = [], {}, time.time()
    for i in range(n):
        paths, job = RunPaths(root / f"r{i:03d}"), str(1000 + i)
        paths.root.mkdir(parents=True)
        entry = {"job_id": job, "attempt": 0, "submitted_at": now - 900, "executor": "slurm"}
        append_jsonl(paths.jobs, entry)
        states[job] = "RUNNING" if i % 2 == 0 else "PENDING"
        if i % 2 == 0:
            rec = ProgressRecord(run=paths.name, job_id=job, state=TrainState.TRAINING, step=3)
            rec.max_steps, rec.heartbeat, rec.started_at = 100, now - heartbeat_age_s, now - 700
            write_progress(paths.progress, rec)
        runs.append(paths)
    return runs, states


@pytest.mark.parametrize("n", [1, 10, 100])
def test_a_pass_is_one_sacct_and_one_squeue_whatever_the_number_of_runs(
    tmp_path: Path, fake_tools, n: int
) -> None:
    runs, states = make_runs(tmp_path, n)
    fake = fake_tools(states)
    for _ in range(3):
        outcomes = monitor_pass(runs, MonitorPolicy())
        assert {o.action.kind for o in outcomes} == {ActionKind.NONE}
    assert fake.tools() == ["sacct", "squeue"] * 3
    sacct = fake.calls[0]
    assert sacct[sacct.index("-j") + 1].split(",") == sorted(states)  # every job, one call


def test_waiting_for_a_cancelled_job_polls_squeue_at_growing_intervals(
    tmp_path: Path, fake_tools
) -> None:
    """A stalled run is cancelled, but its job does not leave the queue (a site's KillWait,
    a slow epilog): the pass waits CANCEL_WAIT_S for it with about ten squeue calls, not one
    every half second (61), then leaves its intent open for the next pass."""
    runs, states = make_runs(tmp_path, 1, heartbeat_age_s=3600)
    fake = fake_tools(states, cancel_takes_effect=False)
    slept: list[float] = []
    (out,) = monitor_pass(runs, MonitorPolicy(), backend=Backend(sleep=slept.append))
    assert out.action.kind is ActionKind.CANCEL_AND_RESUBMIT and "still ending" in (out.error or "")
    tools = fake.tools()
    assert tools[:3] == ["sacct", "squeue", "scancel"]
    waits = tools[3:]
    assert set(waits) == {"squeue"} and len(waits) == len(poll_delays(CANCEL_WAIT_S)) + 1 <= 12
    assert sum(slept) >= CANCEL_WAIT_S  # still waits as long as before


def test_a_job_still_completing_after_the_cancel_holds_no_later_pass(
    tmp_path: Path, fake_tools
) -> None:
    """The cancel took effect in accounting (CANCELLED) but Slurm still lists the job (an
    unkillable step): the first pass waited CANCEL_WAIT_S and left its intent open. A later
    pass neither cancels again nor waits: one sacct and one squeue, no sleep, the intent
    left open for the pass that finds the job gone (re-applying an open intent: the
    real-Slurm tests of a killed monitor)."""
    runs, states = make_runs(tmp_path, 1, heartbeat_age_s=3600)
    fake = fake_tools(states)
    fake.lingering.add("1000")
    slept: list[float] = []
    backend = Backend(sleep=slept.append)
    (first,) = monitor_pass(runs, MonitorPolicy(), backend=backend)
    assert first.action.kind is ActionKind.CANCEL_AND_RESUBMIT and "still ending" in first.error
    assert states["1000"] == "CANCELLED" and sum(slept) >= CANCEL_WAIT_S
    fake.calls.clear()
    slept.clear()
    (later,) = monitor_pass(runs, MonitorPolicy(), backend=backend)
    assert fake.tools() == ["sacct", "squeue"] and slept == []
    assert later.action.kind is ActionKind.CANCEL_AND_RESUBMIT
    assert "still COMPLETING" in (later.error or "") and later.new_job_id is None
    assert pending_intent(event_log.read(runs[0].events), "1000") is not None


def test_poll_delays_double_up_to_a_cap_and_cover_the_wait() -> None:
    assert poll_delays(30) == [0.5, 1, 2, 4, 5, 5, 5, 5, 5]
    assert poll_delays(0.5) == [0.5]
    assert poll_delays(0) == []
    assert poll_delays(60, first_s=1, cap_s=10) == [1, 2, 4, 8, 10, 10, 10, 10, 10]
