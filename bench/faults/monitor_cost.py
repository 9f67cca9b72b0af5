"""What one grpo-monitor costs Slurm: N runs watched on the local test cluster.

Each of the N runs is a real Slurm job (``sbatch``, job name ``grpo-<run>``, recorded in
the run's ``jobs.jsonl`` as grpo-submit records it) whose payload writes the run's
``progress.json`` through grpo_hpc's own writer every few seconds, as a training rank 0
does (state ``training``, step counting up, a fresh heartbeat). No model is trained: what
the monitor does per pass (read jobs.jsonl, events.jsonl and progress.json, ask Slurm,
decide) does not depend on what the job computes, and 100 trainers do not fit on two
cores. The partition is made to hold all N at once for the measurement (``scontrol update
PartitionName=... OverSubscribe=FORCE:N``, set back afterwards), so the monitor watches N
RUNNING jobs with live heartbeats, the case where it reads the most.

The monitor passes run in this process: the same calls ``grpo-monitor --forever`` makes
per pass (``monitor_pass`` over ``resolve_runs``, then ``is_final`` per run, a Slurm
error logged and retried; cli/monitor.py), so each pass can be timed and its CPU
counted. Every Slurm command the passes start goes through a logging shim first on PATH
(one line per call, then ``exec`` of the real tool). slurmctld's own per-RPC counters
(``sdiag``) and slurmdbd's (``sacctmgr show stats``) are read before and after each phase.

Phases: ``steady`` (Slurm answering), ``ctld_stopped`` (slurmctld SIGSTOPped: alive but
silent, the slow-controller case), ``dbd_stopped`` (slurmdbd SIGSTOPped), ``recovered``,
and with ``--stall N`` ``stalled``: N jobs stop beating and ignore SIGTERM, so the monitor
(heartbeat limit 20 s) cancels each and waits for it to leave the queue (Slurm's KillWait),
then fails to resubmit it (a benchmark run directory has no config.yaml) and stops it.

Examples::

    sudo bash slurm/up.sh --nodes 2
    python -m bench.faults.monitor_cost --runs 100 --interval 20 --steady-s 180 --stop-s 60 \
        --out bench/results/monitor_cost_cpu_2026-12-04.json
    python -m bench.faults.monitor_cost --runs 10 --steady-s 30 --stop-s 0   # a quick look
    python -m bench.faults.monitor_cost --runs 20 --steady-s 40 --stop-s 0 --stall 5 --interval 10
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

TOOLS = ("sacct", "squeue", "scancel", "sbatch", "sinfo", "scontrol")
STATE_DIR = Path(os.environ.get("GRPO_SLURM_STATE", "/var/lib/grpo-slurm"))
REPO = Path(__file__).resolve().parents[1]
STALL_FILE = "stall-now"
"""A job whose run directory holds this file stops beating and ignores SIGTERM (``--stall``):
the monitor cancels it, and it leaves the queue only at Slurm's KillWait (SIGKILL)."""


@dataclass
class PassRecord:
    """One monitor pass."""

    phase: str
    """Which phase it ran in."""
    start: float
    """Unix time it began."""
    wall_s: float
    """How long it took."""
    cpu_self_s: float
    """CPU time of the monitor's own process during it (user + system)."""
    cpu_children_s: float
    """CPU time of the commands it started (the Slurm tools and the logging shim)."""
    calls: dict[str, int] = field(default_factory=dict)
    """Slurm commands it started, by tool."""
    error: str | None = None
    """The Slurm error that ended it early (the CLI logs it and retries next pass)."""


# ------------------------------------------------------------------ the job's payload


def job_payload(run_dir: Path, beat_s: float) -> None:
    """What each benchmark job runs: the progress file a training rank 0 writes."""
    from grpo_hpc.core.paths import RunPaths
    from grpo_hpc.core.progress import ProgressRecord, TrainState, write_progress

    paths, stop = RunPaths(run_dir), []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    job = os.environ.get("SLURM_JOB_ID")
    rec = ProgressRecord(run=paths.name, job_id=job, state=TrainState.TRAINING, max_steps=10**6)
    while not stop:
        if (run_dir / STALL_FILE).exists():  # a hung trainer: no beat, deaf to SIGTERM
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        else:
            rec.heartbeat = time.time()
            write_progress(paths.progress, rec)
            rec.step += 1
        time.sleep(beat_s)


# ------------------------------------------------------------------- the cluster side


def make_shim(shim_dir: Path, log: Path) -> None:
    """One script per Slurm tool: log the call (time, tool, argv), then exec the real one."""
    shim_dir.mkdir(parents=True, exist_ok=True)
    for tool in TOOLS:
        real = shutil.which(tool)
        if real is None:
            raise SystemExit(f"monitor_cost: {tool} not on PATH: bring the cluster up first")
        script = f'#!/bin/bash\necho "$EPOCHREALTIME {tool} $*" >> {log}\nexec {real} "$@"\n'
        (shim_dir / tool).write_text(script)
        (shim_dir / tool).chmod(0o755)


def daemon_pid(name: str) -> int:
    return int((STATE_DIR / "run" / f"{name}.pid").read_text().split()[0])


def rpc_counts(text: str) -> dict[str, tuple[int, int]]:
    """``NAME (id) count:C ave_time:A total_time:T`` lines of sdiag / sacctmgr show stats
    -> {NAME: (count, total microseconds)} (pure; the per-user section is skipped)."""
    out: dict[str, tuple[int, int]] = {}
    section = text.split("by user")[0]
    for m in re.finditer(r"^\s*(\w+)\s+\(\s*\d+\)\s+count:(\d+).*?total_time:(\d+)", section, re.M):
        out[m.group(1)] = (int(m.group(2)), int(m.group(3)))
    return out


def server_stats() -> dict[str, dict[str, tuple[int, int]]]:
    """slurmctld's and slurmdbd's RPC counters now (reset afterwards)."""
    ctld = subprocess.run(["sdiag"], capture_output=True, text=True, timeout=30).stdout
    dbd = subprocess.run(["sacctmgr", "show", "stats"], capture_output=True, text=True, timeout=30)
    subprocess.run(["sdiag", "-r"], capture_output=True, timeout=30)
    subprocess.run(["sacctmgr", "-i", "clear", "stats"], capture_output=True, timeout=30)
    return {"slurmctld": rpc_counts(ctld), "slurmdbd": rpc_counts(dbd.stdout)}


def submit_runs(logs: Path, n: int, partition: str, beat_s: float) -> list[str]:
    """N run directories, each with one job submitted and recorded as grpo-submit does."""
    from grpo_hpc.core.fsutil import append_jsonl
    from grpo_hpc.core.paths import RunPaths
    from grpo_hpc.core.slurm import job_name

    ids = []
    for i in range(n):
        paths = RunPaths(logs / f"cost-{i:03d}")
        paths.root.mkdir(parents=True)
        payload = (
            f"exec {sys.executable} -m bench.faults.monitor_cost --job {paths.root} --beat {beat_s}"
        )
        cmd = ["sbatch", "--parsable", "-p", partition, "-J", job_name(paths.name), "--mem=64M"]
        cmd += ["-o", str(paths.root / "slurm.out"), "--chdir", str(REPO), "--wrap", payload]
        job = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip()
        entry = {"job_id": job.split(";")[0], "attempt": 0, "submitted_at": time.time()}
        append_jsonl(paths.jobs, {**entry, "reason": "initial submission", "executor": "slurm"})
        ids.append(entry["job_id"])
    return ids


def wait_all_beating(logs: Path, n: int, timeout_s: float) -> int:
    """Wait until every run's job has written its progress file; returns how many did."""
    deadline = time.monotonic() + timeout_s
    while True:
        beating = sum(1 for d in logs.iterdir() if (d / "progress.json").exists())
        if beating >= n or time.monotonic() > deadline:
            return beating
        time.sleep(2)


def wait_gone(ids: list[str], timeout_s: float) -> None:
    """Until squeue lists none of ``ids`` (their payloads stopped writing), or timeout."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        out = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True)
        if not set(ids) & set(out.stdout.split()):
            return
        time.sleep(2)


# ------------------------------------------------------------------------ the passes


def _cpu() -> tuple[float, float]:
    me, kids = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return me.ru_utime + me.ru_stime, kids.ru_utime + kids.ru_stime


def calls_since(log: Path, offset: int) -> tuple[Counter[str], int]:
    """Tools called since byte ``offset`` of the shim's log, and the new offset."""
    text = log.read_text() if log.exists() else ""
    return Counter(line.split()[1] for line in text[offset:].splitlines() if line), len(text)


def one_pass(logs: Path, phase: str, shim_log: Path, heartbeat_s: float = 600.0) -> PassRecord:
    """The calls of one ``grpo-monitor`` pass (cli/monitor.py's loop body), measured."""
    from grpo_hpc.core.errors import SlurmUnavailableError
    from grpo_hpc.core.runs import resolve_runs
    from grpo_hpc.monitor.decision import MonitorPolicy
    from grpo_hpc.monitor.loop import is_final, monitor_pass

    _, offset = calls_since(shim_log, 0)
    start, (s0, c0), t0 = time.time(), _cpu(), time.monotonic()
    error = None
    runs = resolve_runs([], logs)
    try:
        monitor_pass(runs, MonitorPolicy(heartbeat_timeout_s=heartbeat_s))
    except (SlurmUnavailableError, OSError) as e:
        error = str(e)
    [is_final(p) for p in runs]
    wall, (s1, c1) = time.monotonic() - t0, _cpu()
    calls, _ = calls_since(shim_log, offset)
    return PassRecord(phase, start, wall, s1 - s0, c1 - c0, dict(calls), error)


def run_phase(
    logs: Path, phase: str, seconds: float, interval: float, shim: Path, heartbeat_s: float = 600.0
) -> list:
    """Passes every ``interval`` seconds (sleeping ``interval`` after each, as the CLI
    does) for ``seconds``; at least one pass."""
    out, end = [], time.monotonic() + seconds
    while True:
        rec = one_pass(logs, phase, shim, heartbeat_s)
        out.append(rec)
        print(f"  {phase}: pass {rec.wall_s:.2f} s, calls {rec.calls}, err {rec.error}", flush=True)
        if time.monotonic() + interval > end:
            return out
        time.sleep(interval)


def stopped(daemon: str, phase: str, logs: Path, a: argparse.Namespace, shim: Path) -> list:
    """Passes while ``daemon`` is SIGSTOPped (alive, not answering), then SIGCONT."""
    pid = daemon_pid(daemon)
    os.kill(pid, signal.SIGSTOP)
    try:
        return run_phase(logs, phase, a.stop_s, a.interval, shim)
    finally:
        os.kill(pid, signal.SIGCONT)


# ------------------------------------------------------------------------ the summary


def summarize(passes: list[PassRecord], interval: float) -> dict[str, dict]:
    """Per phase: passes, calls per pass (mean, max), pass time, CPU per pass, calls per
    minute at this interval (pure)."""
    out: dict[str, dict] = {}
    for phase in dict.fromkeys(p.phase for p in passes):
        ps = [p for p in passes if p.phase == phase]
        tools = sorted({t for p in ps for t in p.calls})
        per_pass = {t: [p.calls.get(t, 0) for p in ps] for t in tools}
        minutes = sum(p.wall_s + interval for p in ps) / 60
        out[phase] = {
            "passes": len(ps),
            "failed_passes": sum(1 for p in ps if p.error),
            "calls_per_pass_mean": {t: sum(v) / len(v) for t, v in per_pass.items()},
            "calls_per_pass_max": {t: max(v) for t, v in per_pass.items()},
            "calls_per_minute": {t: sum(v) / minutes for t, v in per_pass.items()},
            "pass_s_median": sorted(p.wall_s for p in ps)[len(ps) // 2],
            "pass_s_max": max(p.wall_s for p in ps),
            "cpu_self_s_per_pass": sum(p.cpu_self_s for p in ps) / len(ps),
            "cpu_children_s_per_pass": sum(p.cpu_children_s for p in ps) / len(ps),
            "errors": sorted({p.error for p in ps if p.error}),
        }
    return out


def markdown(result: dict) -> str:
    """The result as a markdown table, one row per phase."""
    lines = [
        f"# grpo-monitor's cost: {result['runs']} runs, pass every {result['interval_s']:.0f} s",
        "",
        f"{result['command']}",
        "",
        "| phase | passes (failed) | sacct/pass | squeue/pass | other/pass | pass s (median, max) "
        "| CPU s/pass (monitor + tools) | server RPCs |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for phase, s in result["summary"].items():
        mean = s["calls_per_pass_mean"]
        other = sum(v for t, v in mean.items() if t not in ("sacct", "squeue"))
        rpcs = result["server"].get(phase, {})
        top = {k: v[0] for part in rpcs.values() for k, v in part.items() if "JOB" in k}
        lines.append(
            f"| {phase} | {s['passes']} ({s['failed_passes']}) | {mean.get('sacct', 0):.2f} "
            f"| {mean.get('squeue', 0):.2f} | {other:.2f} | {s['pass_s_median']:.2f}, "
            f"{s['pass_s_max']:.2f} | {s['cpu_self_s_per_pass']:.3f} + "
            f"{s['cpu_children_s_per_pass']:.3f} | {top} |"
        )
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------ main


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench.faults.monitor_cost",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--runs", type=int, default=100, help="runs (Slurm jobs) watched")
    p.add_argument("--interval", type=float, default=20.0, help="seconds between passes")
    p.add_argument("--steady-s", type=float, default=180.0, help="length of the steady phase")
    p.add_argument("--stop-s", type=float, default=60.0, help="each daemon's stop (0: skip)")
    p.add_argument("--beat", type=float, default=10.0, help="the jobs' progress period, s")
    p.add_argument("--stall", type=int, default=0, help="runs that hang at the end (cancelled)")
    p.add_argument("--partition", default="debug", help="partition the jobs run in")
    p.add_argument("--out", type=Path, help="result JSON (a .md beside it)")
    p.add_argument("--job", type=Path, help=argparse.SUPPRESS)  # the jobs' payload
    return p


def measure(a: argparse.Namespace, work: Path) -> dict:
    logs, shim_log = work / "logs", work / "calls.log"
    logs.mkdir()
    make_shim(work / "shim", shim_log)
    part = f"PartitionName={a.partition}"
    subprocess.run(["scontrol", "update", part, f"OverSubscribe=FORCE:{a.runs}"], check=True)
    ids: list[str] = []
    try:
        ids = submit_runs(logs, a.runs, a.partition, a.beat)
        beating = wait_all_beating(logs, a.runs, 300)
        print(f"{beating}/{a.runs} runs beating", flush=True)
        os.environ["PATH"] = f"{work / 'shim'}:{os.environ['PATH']}"
        server_stats()  # reset the counters
        passes = run_phase(logs, "steady", a.steady_s, a.interval, shim_log)
        server = {"steady": server_stats()}
        for daemon, phase in (("slurmctld", "ctld_stopped"), ("slurmdbd", "dbd_stopped")):
            if a.stop_s > 0:
                passes += stopped(daemon, phase, logs, a, shim_log)
                server[phase] = server_stats()
        if a.stop_s > 0:
            passes += run_phase(logs, "recovered", 2 * a.interval, a.interval, shim_log)
            server["recovered"] = server_stats()
        if a.stall > 0:  # hung trainers: the monitor cancels each (heartbeat limit 20 s)
            for d in sorted(logs.iterdir())[: a.stall]:
                (d / STALL_FILE).touch()
            passes += run_phase(logs, "stalled", 40 + 2 * a.interval, a.interval, shim_log, 20.0)
            server["stalled"] = server_stats()
    finally:
        for pid_name in ("slurmctld", "slurmdbd"):  # never leave a daemon stopped
            os.kill(daemon_pid(pid_name), signal.SIGCONT)
        if ids:
            subprocess.run(["scancel", *ids], capture_output=True)
            wait_gone(ids, 120)
        subprocess.run(["scontrol", "update", part, "OverSubscribe=NO"], capture_output=True)
    return {
        "runs": a.runs,
        "beating": beating,
        "interval_s": a.interval,
        "command": "python -m bench.faults.monitor_cost " + " ".join(sys.argv[1:]),
        "summary": summarize(passes, a.interval),
        "server": server,
        "passes": [asdict(p) for p in passes],
    }


def main(argv: list[str] | None = None) -> int:
    a = _parser().parse_args(argv)
    if a.job is not None:
        job_payload(a.job, a.beat)
        return 0
    with tempfile.TemporaryDirectory(prefix="monitor-cost-", ignore_cleanup_errors=True) as tmp:
        result = measure(a, Path(tmp))
        text = markdown(result)
        print(text)
        if a.out is not None:
            a.out.write_text(json.dumps(result, indent=1) + "\n")
            a.out.with_suffix(".md").write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
