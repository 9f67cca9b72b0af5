"""grpo-monitor and grpo-status against the real local Slurm cluster and the real trainer.

One module-scoped *fleet* submits every scenario at once and starts one ``grpo-monitor``
for all of them, so the runs share the cluster's CPU slots instead of waiting for each
other; each test then waits (bounded) for its own run and checks what happened. ``hang``
runs on partition ``multi`` (one of its idle nodes, when up.sh --nodes 2 made them), the
rest on ``debug``: the hung attempt waits out its step-0 timeout without holding one of
``localhost``'s two slots (the fleet took ~138 s on two slots, the hang's jobs ~75 s of them).

* ``hang``     hangs at step 0 (heartbeat alive)   -> stalled_step0, cancelled, resubmitted
* ``limit``    2-minute time limit; its first attempt hangs (heartbeat alive) after 1 step
               until the time-limit signal -> USR2, checkpoint, in-job requeue, finished
* ``preempt``  scancel'd (a stand-in for preemption) after a checkpoint -> resumed
* ``zero``     zero reward                          -> circuit breaker, STOP, no resubmit
* ``crash``    crashes before its first step, every attempt -> retried, then budget exhausted

The monitor-restart test has its own runs, held pending by ``--begin`` (they never use CPU).
"""

from __future__ import annotations

import io
import json
import math
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from rich.console import Console

from grpo_hpc.core.fsutil import read_jsonl
from grpo_hpc.core.paths import RunPaths
from grpo_hpc.core.progress import TrainState, read_progress
from grpo_hpc.monitor.attempts import submit_next
from grpo_hpc.monitor.decision import ActionKind, MonitorPolicy
from grpo_hpc.monitor.loop import Backend, monitor_run
from grpo_hpc.status.report import collect_rows
from grpo_hpc.status.view import build_table
from grpo_hpc.submit import job as submit_mod

from ..slowdown import guard, scaled
from .slurm_helpers import (
    assert_one_slurm_job_per_entry,
    cli,
    cluster_lock,
    describe,
    events,
    final_event,
    job_ids,
    jobs_of_run,
    progress,
    queued,
    restart_nodes,
    sacct,
    sacct_attempts,
    sacct_start,
    scancel,
    start_cli,
    step_log,
    stop_slurmctld,
    submit,
    wait_for,
    wait_sacct,
    write_profile,
)

pytestmark = pytest.mark.slurm

MONITOR_ARGS = [
    "--interval", "1", "--step0-timeout", f"{scaled(40):.0f}",
    "--heartbeat-timeout", f"{scaled(60):.0f}", "--max-retries", "1", "--backoff", "1",
]  # fmt: skip
"""step0-timeout 40 s: on the loaded 2-core CI machine a fleet job's trainer wrote its first
progress record ~20 s after the job started and its first step ~10 s after that (the
``hang`` run is cancelled 40 s after its record). Stretched on a slow machine, like every
time below (tests/slowdown.py): at 42:53 of CI, the ``crash`` and ``zero`` runs' first
attempts had written no record 40 s after their jobs started and were cancelled as
stalled."""
FAULTS = "faults.enabled=true"
LIMIT_STEPS, LIMIT_SAVE_EVERY, LIMIT_HANG_AFTER = 2, 2, 1
LIMIT_SIGNAL_LEAD_S = 45
LIMIT_TIME_MIN = math.ceil((scaled(45) + 30 + LIMIT_SIGNAL_LEAD_S) / 60)
"""The ``limit`` run (2-minute time limit): its first attempt hangs after its first step
(heartbeat alive, so no monitor rule fires) until a stop signal, which only the time limit
sends; it saves step 1 then (no periodic save before step 2), is requeued in the job, and
the next attempt trains step 2. Slurm checks time limits every 30 s and sends a --signal up
to one check early, so with a 45 s lead the USR2 comes 45 to 75 s after a job starts: after
the first step of the first attempt and before the end of the second (each ~16 to 27 s after
its job's start on the loaded 2-core CI machine), and 45 s before the limit itself. On a slow
machine the limit grows so that the signal's earliest moment, 45 s, is stretched like the
attempts (tests/slowdown.py; at x5: 5 minutes, the signal 225 to 255 s in); the lead, a
checkpoint's save and a requeue, stays. (Before:
a 1-minute limit, 20 s lead, 24 steps of 2 s sleep: every attempt was signalled 10 to 40 s
after its start, most while still loading; ~5 attempts, 298 s.)"""
PREEMPT_STEPS, PREEMPT_SAVE_EVERY = 6, 2
FLEET_TIMEOUT_S = 480.0
"""Bound for any one run of the fleet to reach its end (all share two CPU slots)."""


@dataclass
class Fleet:
    logs: Path
    monitor: subprocess.Popen
    monitor_log: Path
    preempted: dict[str, object] = field(default_factory=dict)
    """What the scancel thread did: job, step and last_checkpoint when it cancelled."""

    def run(self, name: str) -> RunPaths:
        return RunPaths(self.logs / name)

    def monitor_output(self) -> str:
        return self.monitor_log.read_text() if self.monitor_log.exists() else ""

    def wait_final(self, name: str, timeout: float = FLEET_TIMEOUT_S) -> dict:
        """Wait for the monitor's STOP/DONE about the run's newest job."""
        paths = self.run(name)
        try:
            return wait_for(f"monitor STOP/DONE for {name}", lambda: final_event(paths), timeout)
        except AssertionError as e:
            raise AssertionError(
                f"{e}\n{describe(paths)}\n-- monitor\n{self.monitor_output()}"
            ) from None


def _scancel_after_checkpoint(paths: RunPaths, record: dict[str, object]) -> None:
    """Background: once the run has a checkpoint and is mid-training, scancel its job."""
    deadline = time.monotonic() + guard(FLEET_TIMEOUT_S)
    while time.monotonic() < deadline:
        rec = read_progress(paths.progress)
        ckpt = paths.latest_checkpoint()
        if rec is not None and ckpt and not rec.state.terminal and rec.step < rec.max_steps - 2:
            job = job_ids(paths)[0]
            record.update(job=job, step=rec.step, checkpoint=ckpt, at=time.time())
            scancel(job)
            return
        time.sleep(0.5)


@pytest.fixture(scope="module")
def fleet(slurm_cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    root = tmp_path_factory.mktemp("fleet")
    logs = root / "logs"
    short = write_profile(
        root / "short.yaml", time_min=LIMIT_TIME_MIN, signal_lead_s=LIMIT_SIGNAL_LEAD_S
    )
    # hang: on partition multi's idle nodes where there are some (else debug, as the rest),
    # on the node the two-node tests never kill (they run beside this module)
    hang = "slurm-local"
    if slurm_cluster.multi_nodes:
        node = slurm_cluster.multi_nodes[0]
        hang = str(write_profile(root / "hang.yaml", partition="multi",
                                 sbatch_extra={"nodelist": node}))  # fmt: skip
    # Longest first: Slurm starts jobs in submission order on the node's two CPUs.
    submit(
        logs, "limit", FAULTS, f"faults.hang_at_step={LIMIT_HANG_AFTER}",
        f"training.max_steps={LIMIT_STEPS}", f"training.save_every_steps={LIMIT_SAVE_EVERY}",
        profile=str(short),
    )  # fmt: skip
    submit(logs, "hang", FAULTS, "faults.hang_at_step=0", "training.max_steps=3", profile=hang)
    submit(
        logs, "preempt", FAULTS, "faults.step_sleep=1", f"training.max_steps={PREEMPT_STEPS}",
        f"training.save_every_steps={PREEMPT_SAVE_EVERY}",
    )  # fmt: skip
    submit(logs, "zero", FAULTS, "faults.zero_reward=true", "training.zero_reward_patience=2")
    submit(logs, "crash", FAULTS, "faults.crash_at_step=0")
    monitor_log = root / "monitor.log"
    monitor = start_cli("cli.monitor", "--logs", str(logs), *MONITOR_ARGS, log=monitor_log)
    f = Fleet(logs, monitor, monitor_log)
    killer = threading.Thread(
        target=_scancel_after_checkpoint, args=(f.run("preempt"), f.preempted), daemon=True
    )
    killer.start()
    try:
        yield f
    finally:
        if monitor.poll() is None:
            monitor.kill()
            monitor.wait()
        scancel(*(j for d in logs.iterdir() if d.is_dir() for j in job_ids(RunPaths(d))))


# ------------------------------------------------------------------------------- tests


@pytest.mark.slow
def test_hang_at_step0_is_cancelled_and_resubmitted(fleet: Fleet) -> None:
    paths = fleet.run("hang")
    done = fleet.wait_final("hang")
    assert done["action"] == "DONE", describe(paths)
    jobs = read_jsonl(paths.jobs)
    assert [j["attempt"] for j in jobs] == [0, 1], describe(paths)
    assert jobs[1]["reason"] == "monitor: stalled_step0"
    assert_one_slurm_job_per_entry(paths)
    first, second = jobs[0]["job_id"], jobs[1]["job_id"]
    assert wait_sacct(first, "CANCELLED", "COMPLETED", "FAILED") == "CANCELLED"
    assert wait_sacct(second, "COMPLETED", "FAILED", "CANCELLED") == "COMPLETED"
    stall = [e for e in events(paths, "decision") if e["class"] == "stalled_step0"]
    assert stall and stall[0]["action"] == "CANCEL_AND_RESUBMIT" and stall[0]["job_id"] == first
    assert "step 0 for" in stall[0]["reason"] and "step0_timeout" in stall[0]["reason"]
    (intent,) = [e for e in events(paths, "intent") if e["job_id"] == first]
    assert intent["cancel"] is True
    assert [e["new_job_id"] for e in events(paths, "done") if e["job_id"] == first] == [second]
    rec = progress(paths)
    assert rec.state is TrainState.FINISHED and rec.step == rec.max_steps == 3
    assert rec.job_id == second and rec.attempt == 1
    assert step_log(paths) == [1, 2, 3]  # the hung attempt never finished a step
    assert "hang job" in fleet.monitor_output() and "stalled_step0" in fleet.monitor_output()


@pytest.mark.slow
def test_time_limit_requeues_until_all_steps_done(fleet: Fleet) -> None:
    paths = fleet.run("limit")
    assert fleet.wait_final("limit")["action"] == "DONE", describe(paths)
    rec = progress(paths)
    assert rec.state is TrainState.FINISHED and rec.step == LIMIT_STEPS, describe(paths)
    assert rec.attempt >= 1 and rec.restarts >= 1, describe(paths)
    steps = step_log(paths)
    assert set(steps) == set(range(1, LIMIT_STEPS + 1)), steps
    _assert_only_uncheckpointed_steps_repeat(steps, LIMIT_SAVE_EVERY)
    # One run directory (no second run made by a requeue), no second W&B identity.
    assert [d.name for d in fleet.logs.iterdir() if d.name.startswith("limit")] == ["limit"]
    assert len(list(paths.root.glob("wandb_id*"))) <= 1
    # Every job of the run was requeued in place or resubmitted by the monitor, and
    # each resubmission is one job in jobs.jsonl and in sacct.
    ids = job_ids(paths)
    assert_one_slurm_job_per_entry(paths)
    reasons = [e["class"] for e in events(paths, "intent")]
    assert set(reasons) <= {"checkpointed", "timeout", "preempted"}, reasons
    assert len(ids) == 1 + len(reasons)
    out = (paths.submitit_dir / ids[0] / f"{ids[0]}_0_log.out").read_text()
    # submitit's in-job requeue on USR2 happened: it caught the signal, ran `scontrol
    # requeue`, and Slurm ended that run REQUEUED (Slurm never requeues a time limit by
    # itself). Its "Requeued job" line may be missing: Slurm's requeue can SIGTERM the
    # job's processes, scontrol among them, before scontrol returns (one CI run here, the
    # machine loaded: "Command '['scontrol', 'requeue', ...]' died with SIGTERM").
    assert "Caught signal SIGUSR2" in out, out
    assert sacct_attempts(ids[0])[0][0] == "REQUEUED", sacct_attempts(ids[0])
    verify = cli("cli.ckpt", "verify", "limit", "--logs", str(fleet.logs))
    assert verify.returncode == 0 and f"step-{LIMIT_STEPS}: ok" in verify.stdout, verify


def _assert_only_uncheckpointed_steps_repeat(steps: list[int], save_every: int) -> None:
    """A resumed attempt starts after its checkpoint: it may redo only the steps that the
    previous attempt did after its last checkpoint (fewer than save_every)."""
    for prev, nxt in zip(steps, steps[1:], strict=False):
        if nxt <= prev:  # a restart: resumed from checkpoint nxt - 1
            assert prev - (nxt - 1) < save_every, f"lost {prev - nxt + 1} steps: {steps}"


@pytest.mark.slow
def test_scancel_resubmits_from_last_checkpoint(fleet: Fleet) -> None:
    paths = fleet.run("preempt")
    assert fleet.wait_final("preempt")["action"] == "DONE", describe(paths)
    assert fleet.preempted, "the scancel thread never found a checkpoint to cancel after"
    first = str(fleet.preempted["job"])
    ids = job_ids(paths)
    assert len(ids) == 2 and ids[0] == first, describe(paths)
    assert_one_slurm_job_per_entry(paths)
    assert wait_sacct(first, "CANCELLED", "COMPLETED", "FAILED") == "CANCELLED"
    assert sacct(ids[1])[ids[1]] in ("COMPLETED", "RUNNING", "COMPLETING")
    (decision,) = [e for e in events(paths, "decision") if e["action"] == "RESUBMIT"]
    assert decision["class"] == "preempted" and decision["slurm_state"] == "CANCELLED"
    rec = progress(paths)
    assert rec.state is TrainState.FINISHED and rec.step == PREEMPT_STEPS
    assert rec.restarts >= 1 and rec.job_id == ids[1]
    steps = step_log(paths)
    assert set(steps) == set(range(1, PREEMPT_STEPS + 1)), steps
    # Steps logged by the first job and by the resubmitted one (it started after sacct Start).
    second_start = sacct_start(ids[1])
    logged = [m for m in read_jsonl(paths.metrics) if "reward/mean" in m]
    before = [int(m["step"]) for m in logged if m["time"] < second_start]
    after = [int(m["step"]) for m in logged if m["time"] >= second_start]
    assert before and after, (second_start, logged)
    resumed_from = after[0] - 1
    # Resumed from the newest checkpoint: the one the trainer saved on SIGTERM, or at
    # worst the periodic one that existed when the job was cancelled.
    assert resumed_from >= int(fleet.preempted["checkpoint"]), (fleet.preempted, steps)
    assert max(before) - resumed_from < PREEMPT_SAVE_EVERY, steps
    assert after == list(range(after[0], PREEMPT_STEPS + 1)), steps


@pytest.mark.slow
def test_circuit_breaker_stops_without_resubmitting(fleet: Fleet) -> None:
    paths = fleet.run("zero")
    stop = fleet.wait_final("zero")
    assert stop["action"] == "STOP" and stop["class"] == "circuit_breaker", describe(paths)
    assert "mean reward was 0 for 2 consecutive steps" in stop["reason"]
    assert "never resubmitted" in stop["reason"]
    (job,) = job_ids(paths)
    assert_one_slurm_job_per_entry(paths)
    assert wait_sacct(job, "FAILED", "COMPLETED", "CANCELLED") == "FAILED"
    rec = progress(paths)
    assert rec.state is TrainState.FAILED and rec.exit_code == 3 and rec.step == 2
    assert not events(paths, "intent")
    assert "zero job" in fleet.monitor_output() and "STOP circuit_breaker" in (
        fleet.monitor_output()
    )


@pytest.mark.slow
def test_crash_every_attempt_stops_when_budget_is_spent(fleet: Fleet) -> None:
    paths = fleet.run("crash")
    stop = fleet.wait_final("crash")
    assert stop["action"] == "STOP" and stop["class"] == "budget_exhausted", describe(paths)
    assert "retry budget exhausted (total 1/1): crash" in stop["reason"]
    ids = job_ids(paths)
    assert len(ids) == 2, describe(paths)
    assert_one_slurm_job_per_entry(paths)
    for job in ids:
        assert wait_sacct(job, "FAILED", "COMPLETED", "CANCELLED") == "FAILED"
    assert [e["class"] for e in events(paths, "intent")] == ["crash"]
    waits = [e for e in events(paths, "decision") if e["action"] == "WAIT"]
    assert waits and waits[0]["job_id"] == ids[0]  # backoff before the retry
    rec = progress(paths)
    assert rec.state is TrainState.FAILED and rec.exit_code == 1 and rec.attempt == 1
    assert "fault injection: crash at step 0" in (rec.reason or "")
    out = fleet.monitor_output()
    assert "crash job" in out and "STOP budget_exhausted" in out


@pytest.mark.slow
def test_status_shows_finished_stopped_and_exhausted(fleet: Fleet) -> None:
    for name in ("hang", "limit", "preempt", "zero", "crash"):
        fleet.wait_final(name)
    rc = fleet.monitor.wait(timeout=guard(60))
    assert rc == 1, fleet.monitor_output()  # every run ended; some were stopped

    def status_rows() -> dict[str, dict] | None:
        proc = cli("cli.status", "--json", "--logs", str(fleet.logs))
        assert proc.returncode == 0, proc.stderr
        rows = {r["run"]: r for r in json.loads(proc.stdout)}
        ended = all(rows[n]["slurm_state"] not in ("RUNNING", "COMPLETING") for n in rows)
        return rows if ended else None  # a DONE run's job may still be tearing down

    rows = wait_for("every job of the fleet to end", status_rows, 60)
    assert set(rows) == {"hang", "limit", "preempt", "zero", "crash"}
    for name in ("hang", "limit", "preempt"):
        r = rows[name]
        assert r["train_state"] == "finished" and r["step"] == r["max_steps"], r
        assert r["monitor_action"] == "DONE" and r["flags"] == [], r
        assert r["slurm_state"] == "COMPLETED", r
    assert rows["hang"]["attempts"] == 2 and rows["preempt"]["attempts"] == 2
    zero, crash = rows["zero"], rows["crash"]
    assert zero["train_state"] == "failed" and zero["monitor_action"] == "STOP"
    assert zero["monitor_class"] == "circuit_breaker" and zero["attempts"] == 1
    assert "stopped: circuit_breaker" in zero["flags"] and "zero reward" in zero["flags"]
    assert crash["monitor_action"] == "STOP" and crash["monitor_class"] == "budget_exhausted"
    assert "budget exhausted" in crash["flags"] and crash["attempts"] == 2
    assert crash["slurm_state"] == "FAILED"

    # The table, rendered to a string the way grpo-status prints it.
    console = Console(file=io.StringIO(), width=250, color_system=None)
    console.print(build_table(collect_rows(fleet.logs), time.time()))
    lines = {line.split()[0]: line for line in console.file.getvalue().splitlines()[1:] if line}
    assert "finished" in lines["hang"] and "DONE" not in lines["hang"]
    assert "stopped: circuit_breaker" in lines["zero"] and "failed" in lines["zero"]
    assert "budget exhausted" in lines["crash"] and "FAILED" in lines["crash"]
    detail = cli("cli.status", "crash", "--logs", str(fleet.logs))
    assert detail.returncode == 0 and "retry budget exhausted" in detail.stdout


# ------------------------------------------------------------ monitor killed mid-action


class Killed(BaseException):
    """Stands in for SIGKILL between sbatch and the jobs.jsonl write."""


@pytest.mark.slow
def test_killed_monitor_never_submits_twice(
    slurm_cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    logs = tmp_path / "logs"
    held = write_profile(tmp_path / "held.yaml", sbatch_extra={"begin": "now+1hour"})
    paths = RunPaths(logs / "k")
    try:
        _killed_after_intent(logs, paths, held)
        _killed_between_sbatch_and_record(paths, monkeypatch)
    finally:
        scancel(*jobs_of_run(paths))


def _killed_after_intent(logs: Path, paths: RunPaths, held: Path) -> None:
    """SIGKILL right after the intent event; restarted monitors finish the action once."""
    first = submit(logs, "k", profile=str(held))  # pending until --begin: never runs
    scancel(first)
    wait_sacct(first, "CANCELLED")
    mon = start_cli("cli.monitor", "--logs", str(logs), "--interval", "0.5", log=logs / "m1.log")
    try:
        wait_for("an intent event", lambda: events(paths, "intent"), 60, interval=0.005)
    finally:
        mon.send_signal(signal.SIGKILL)
        mon.wait()
    killed_before_submit = len(job_ids(paths)) == 1
    for _ in range(2):
        proc = cli("cli.monitor", "k", "--logs", str(logs), "--once")
        assert proc.returncode == 0, proc.stderr
    ids = job_ids(paths)
    assert len(ids) == 2, (killed_before_submit, describe(paths))
    assert_one_slurm_job_per_entry(paths)
    done = [e for e in events(paths, "done") if e["job_id"] == first]
    assert [e["new_job_id"] for e in done] == [ids[1]], describe(paths)
    assert ids[1] in queued()  # held by --begin


def _killed_between_sbatch_and_record(paths: RunPaths, monkeypatch: pytest.MonkeyPatch) -> None:
    """The monitor's sbatch went through but it died before writing jobs.jsonl: the
    restarted monitor adopts that job instead of submitting another."""
    current = job_ids(paths)[-1]
    scancel(current)
    wait_sacct(current, "CANCELLED")

    def die(*args: object, **kwargs: object) -> int:
        raise Killed()

    monkeypatch.setattr(submit_mod, "record_job", die)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    with pytest.raises(Killed):  # the real monitor pass, real sacct/squeue/sbatch
        monitor_run(paths, MonitorPolicy(backoff_base_s=1))
    monkeypatch.undo()
    orphans = jobs_of_run(paths) - set(job_ids(paths))
    assert len(orphans) == 1, describe(paths)
    (orphan,) = orphans
    proc = cli("cli.monitor", "k", "--logs", str(paths.root.parent), "--once")
    assert proc.returncode == 0, proc.stderr
    assert "-> job " + orphan in proc.stdout, proc.stdout
    cli("cli.monitor", "k", "--logs", str(paths.root.parent), "--once")
    ids = job_ids(paths)
    assert ids[-1] == orphan and len(ids) == 3, describe(paths)
    assert "adopted" in json.loads(paths.jobs.read_text().splitlines()[-1])["reason"]
    assert_one_slurm_job_per_entry(paths)
    assert [e.get("note") for e in events(paths, "done")][-1] == "adopted"


# ------------------------------------------------------------------ Slurm away for a while


@pytest.mark.slow
def test_monitor_waits_while_slurmctld_is_away(
    slurm_cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """slurmctld stopped (a restart, a failover): a resubmission it refuses does not stop the
    run (SlurmUnavailableError is exempt from the config-error STOP in monitor/loop.py), the
    grpo-monitor loop warns and retries instead of dying (cli/monitor.py), and once
    slurmctld is back the run's next attempt is submitted, once. The run's jobs are held by
    --begin, so none of them ever uses a CPU."""
    with cluster_lock(exclusive=True):  # no two-node test runs while slurmctld is away
        _slurmctld_away(slurm_cluster, tmp_path, monkeypatch)


def _slurmctld_away(slurm_cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    logs = tmp_path / "logs"
    held = write_profile(tmp_path / "held.yaml", sbatch_extra={"begin": "now+1hour"})
    paths = RunPaths(logs / "away")
    first = submit(logs, "away", profile=str(held))
    mon = None
    try:
        scancel(first)
        wait_sacct(first, "CANCELLED")

        # 1. One pass decides RESUBMIT (preempted); slurmctld goes away just before the
        # submission, whose real `sinfo` then fails.
        def away_then_submit(p: RunPaths, reason: str) -> object:
            stop_slurmctld(slurm_cluster.state_dir)
            return submit_next(p, reason)

        monkeypatch.setenv("OMP_NUM_THREADS", "1")
        out = monitor_run(
            paths, MonitorPolicy(backoff_base_s=1), backend=Backend(resubmit=away_then_submit)
        )
        monkeypatch.undo()
        assert out is not None and out.action.kind is ActionKind.RESUBMIT, out
        assert out.error and "Slurm is not reachable" in out.error, out
        assert job_ids(paths) == [first]
        assert not [e for e in events(paths, "decision") if e["action"] == "STOP"], describe(paths)
        assert events(paths)[-1]["phase"] == "error", describe(paths)

        # 2. The monitor loop while slurmctld is still away: squeue fails on every pass.
        log = tmp_path / "monitor.log"
        mon = start_cli("cli.monitor", "away", "--logs", str(logs), "--interval", "1", log=log)
        wait_for(
            "two warnings of the monitor",
            lambda: log.read_text().count("grpo-monitor: warning:") >= 2,
            120,
            interval=0.2,
        )
        assert mon.poll() is None, log.read_text()
        assert job_ids(paths) == [first]

        # 3. slurmctld back: the same monitor submits the next attempt, once.
        restart_nodes()
        wait_for(f"a second job\n{log.read_text()}", lambda: len(job_ids(paths)) == 2, 60, 0.2)
        assert mon.poll() is None, log.read_text()
        assert_one_slurm_job_per_entry(paths)
        (done,) = [e for e in events(paths, "done") if e["job_id"] == first]
        assert done["new_job_id"] == job_ids(paths)[1], describe(paths)
        assert "RESUBMIT preempted" in log.read_text()
    finally:
        if mon is not None and mon.poll() is None:
            mon.kill()
            mon.wait()
        restart_nodes()  # whatever happened above, slurmctld runs again
        scancel(*jobs_of_run(paths))
