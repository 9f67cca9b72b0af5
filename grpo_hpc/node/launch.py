"""The per-node job: build the torchrun command (pure) and run it.

submitit runs one task per node; each calls :class:`NodeLauncher`, which starts
``torchrun`` for its node. One node uses ``--standalone`` (a private rendezvous
on a free port, so two jobs on one node never collide); several nodes meet at a
c10d rendezvous on the first node of the allocation.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grpo_hpc.core.errors import ExitCode
from grpo_hpc.core.paths import RunPaths
from grpo_hpc.core.progress import TrainState, read_progress, write_progress
from grpo_hpc.node import root_cause

PREEMPT_SIGNALS = (signal.SIGUSR1, signal.SIGUSR2)
CHECKPOINT_WAIT_S = 300.0
"""How long the preemption hook waits for torchrun to exit after the trainer's save."""


@dataclass(frozen=True)
class NodeContext:
    """Where this node sits in the job."""

    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    job_id: str = "local"


def rendezvous_port(job_id: str) -> int:
    """A port derived from the job id, so concurrent multi-node jobs differ."""
    digits = "".join(c for c in job_id if c.isdigit()) or "0"
    return 29500 + int(digits[-6:]) % 20000


def torchrun_command(
    run_dir: str, nproc_per_node: int, ctx: NodeContext, python: str = sys.executable
) -> list[str]:
    """The exact torchrun command for one node (pure; shown by --dry-run)."""
    cmd = [python, "-m", "torch.distributed.run", f"--nproc-per-node={nproc_per_node}"]
    if ctx.nnodes == 1:
        cmd += ["--standalone", "--nnodes=1"]
    else:
        # No --node-rank: c10d assigns node ranks itself (torchrun warns that it ignores it).
        cmd += [
            f"--nnodes={ctx.nnodes}",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint={ctx.master_addr}:{rendezvous_port(ctx.job_id)}",
            f"--rdzv-id={ctx.job_id}",
        ]
    return cmd + ["--max-restarts=0", "-m", "grpo_hpc.train", run_dir]


def node_context() -> NodeContext:
    """Read this node's place from submitit's job environment (Slurm) or default to local."""
    try:
        import submitit

        env = submitit.JobEnvironment()
        hosts = env.hostnames
        nnodes = env.num_nodes
        return NodeContext(
            nnodes=nnodes,
            node_rank=env.node,
            master_addr=rendezvous_host(hosts[0]) if hosts and nnodes > 1 else "127.0.0.1",
            job_id=str(env.job_id),
        )
    except RuntimeError:  # not inside a submitit job
        return NodeContext(job_id=str(os.getpid()))


def rendezvous_host(first_node: str) -> str:
    """The address of the allocation's first node (from SLURM_JOB_NODELIST), resolved here,
    inside the job, where the cluster's name service knows the compute nodes: torchrun's
    c10d store binds on that node and every node's agent connects to it."""
    try:
        return socket.gethostbyname(first_node)
    except OSError as e:
        raise RuntimeError(
            f"cannot resolve the first node {first_node!r} of the allocation ({e}): the "
            "compute nodes must resolve each other's names (DNS or /etc/hosts)"
        ) from None


def exit_code_from_progress(paths: RunPaths, returncode: int) -> int:
    """The trainer records why it ended in progress.json; torchrun's own code is coarser."""
    rec = read_progress(paths.progress)
    if rec is not None and rec.exit_code is not None and rec.state.terminal:
        return int(rec.exit_code)
    if returncode == 0:
        return ExitCode.OK
    return ExitCode.CRASH


TAIL_LINES = 200
"""Lines of torchrun's output kept for its root-cause report (about 20 per failed rank)."""


def ignore_preempt_signals() -> None:
    # Slurm signals every process of the step. torchrun's agent does not handle
    # USR1/USR2 and would die on them, orphaning the workers mid-checkpoint; an
    # ignored disposition survives exec, and the trainer installs its own handlers.
    for sig in PREEMPT_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)


def _pump(stream, log_path: Path, tail: deque[bytes]) -> None:
    """torchrun's output into the run's log and the job's stdout; the last lines kept in
    ``tail`` (torchrun's report of which process failed first is at the end)."""
    with open(log_path, "ab") as log:
        for line in iter(stream.readline, b""):
            log.write(line)
            log.flush()
            tail.append(line)
            sys.stdout.buffer.write(line)
            sys.stdout.flush()


def record_root_cause(paths: RunPaths, tail: deque[bytes], started: float, nnodes: int = 1) -> None:
    """A worker killed by a signal recorded nothing: name it in progress.json's reason
    from torchrun's root-cause report (grpo_hpc.node.root_cause); ``nnodes``: the job's
    nodes (the report's rank is global)."""
    cause = root_cause.parse(b"".join(tail).decode("utf-8", "replace"))
    if cause is None:
        return
    role = _split_role(paths, cause.rank, nnodes)
    rec = root_cause.explained(read_progress(paths.progress), cause, started, role)
    if rec is not None:
        write_progress(paths.progress, rec)


def _split_role(paths: RunPaths, rank: int, nnodes: int) -> str | None:
    """What global ``rank`` did in a ``rollout.placement=split`` run of ``nnodes`` nodes
    (``generator 1``; ranks are numbered node by node: the generators are the last node's
    last processes), None in another run or where the config cannot be read."""
    from grpo_hpc.config.load import load_resolved
    from grpo_hpc.config.roles import role_of
    from grpo_hpc.core.errors import GrpoError

    try:
        cfg = load_resolved(paths.config)
    except (GrpoError, OSError, ValueError):
        return None
    if cfg.rollout.placement != "split":
        return None
    return role_of(cfg, rank, nnodes * cfg.dist.nproc_per_node).label


def write_summary(paths: RunPaths, ctx: NodeContext, code: int, started: float) -> None:
    from grpo_hpc.core.fsutil import atomic_write_text

    rec = read_progress(paths.progress)
    lines = [
        f"run:        {paths.name}",
        f"job:        {ctx.job_id} (node {ctx.node_rank}/{ctx.nnodes})",
        f"exit code:  {code} ({ExitCode(code).name if code in iter(ExitCode) else 'unknown'})",
        f"duration:   {time.time() - started:.0f} s",
    ]
    if rec is not None:
        lines += [
            f"attempt:    {rec.attempt}",
            f"state:      {rec.state.value}",
            f"step:       {rec.step}/{rec.max_steps}",
            f"checkpoint: {rec.last_checkpoint}",
            f"reason:     {rec.reason or '-'}",
        ]
        if rec.peak_gpu_gib is not None:
            lines.append(f"peak GPU:   {rec.peak_gpu_gib:.1f} GiB allocated")
    atomic_write_text(paths.job_summary, "\n".join(lines) + "\n")


class TrainingExit(RuntimeError):
    """Raised by the launcher so that Slurm records the job as FAILED; the class of
    failure is in progress.json (exit_code, reason) for the monitor."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(f"training ended with exit code {code}: {reason}")
        self.code = code


class _AttemptEnded(Exception):  # noqa: N818 - control flow, never escapes the launcher
    """Raised by the preemption hook (a signal handler) into ``NodeLauncher.__call__``'s
    wait when the trainer finished or failed anyway: the job must then end like any other
    attempt (COMPLETED, or FAILED with the trainer's reason), not be requeued, and not fail
    with submitit's "checkpoint function returned None"."""


FLIGHT_RECORDER = {
    "TORCH_FR_BUFFER_SIZE": "2000",  # torch >= 2.7's name
    "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000",  # older torch (newer warns it is deprecated)
    "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
}
"""PyTorch's NCCL flight recorder: the last collectives of each rank, dumped when NCCL's own
watchdog times a collective out, so the run directory says which collective hung."""


def trainer_env(base: dict[str, str], paths: RunPaths, job_id: str) -> dict[str, str]:
    """The environment torchrun and the trainer get (pure): the job's, plus the job id and
    the flight recorder writing into ``<run>/nccl_trace/rank_<R>``. A setting the profile's
    ``env:`` (or the user) already made is kept."""
    env = {**base, "GRPO_HPC_JOB_ID": job_id, "PYTHONUNBUFFERED": "1"}
    for key, value in FLIGHT_RECORDER.items():
        env.setdefault(key, value)
    env.setdefault("TORCH_FR_DUMP_TEMP_FILE", str(paths.nccl_trace / "rank_"))
    return env


@dataclass
class NodeLauncher:
    """The callable submitit pickles and runs once per node."""

    run_dir: str
    nproc_per_node: int = 1
    env: dict[str, str] = field(default_factory=dict)
    """The profile's ``env:`` where no setup lines export it: submitit's LocalExecutor runs
    no sbatch script (a Slurm job gets it from its setup lines and this stays empty)."""
    _proc: subprocess.Popen | None = field(default=None, init=False, repr=False, compare=False)
    _started: float = field(default=0.0, init=False, repr=False, compare=False)
    _waiting: bool = field(default=False, init=False, repr=False, compare=False)

    def __getstate__(self) -> dict[str, Any]:
        # submitit pickles the launcher (at submission and again for a requeue): drop the
        # process handle of a running torchrun.
        return {**self.__dict__, "_proc": None, "_started": 0.0, "_waiting": False}

    def __call__(self) -> int:
        paths = RunPaths(Path(self.run_dir))
        paths.nccl_trace.mkdir(exist_ok=True)  # the flight recorder does not create it
        ctx = node_context()
        from grpo_hpc.node.job_torch import check_job_torch  # torch_check: job

        check_job_torch(paths, ctx.job_id)
        cmd = torchrun_command(self.run_dir, self.nproc_per_node, ctx)
        env = trainer_env({**os.environ, **self.env}, paths, ctx.job_id)
        self._started = time.time()
        proc = subprocess.Popen(
            cmd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            preexec_fn=ignore_preempt_signals,
        )
        self._proc = proc
        tail: deque[bytes] = deque(maxlen=TAIL_LINES)
        pump = threading.Thread(
            target=_pump, args=(proc.stdout, paths.training_log, tail), daemon=True
        )
        pump.start()
        returncode = self._wait(proc)
        pump.join(timeout=10)
        if returncode != 0:
            record_root_cause(paths, tail, self._started, ctx.nnodes)
        code = exit_code_from_progress(paths, returncode)
        if ctx.node_rank == 0:
            write_summary(paths, ctx, code, self._started)
        if code != ExitCode.OK:
            rec = read_progress(paths.progress)
            raise TrainingExit(code, rec.reason if rec and rec.reason else f"torchrun {returncode}")
        return code

    def _wait(self, proc: subprocess.Popen) -> int:
        """torchrun's exit status; then no more preemption hooks (the attempt is over)."""
        while True:
            try:
                # Set inside the try: a hook that raises right after it is caught below.
                self._waiting = True
                returncode = proc.wait()
                if threading.current_thread() is threading.main_thread():
                    ignore_preempt_signals()  # a late signal must not fail the ended attempt
                self._waiting = False
                return returncode
            except _AttemptEnded:  # from the hook, at any point above: wait() again
                continue

    def checkpoint(self, *args, **kwargs):  # noqa: ANN201 - submitit's Checkpointable hook
        """Called by submitit on the timeout/preemption signal: the trainer got the same
        signal and is saving; wait for torchrun to exit, then ask to be requeued unless
        this attempt finished or failed: then the job ends as usual and the monitor decides."""
        import submitit

        self._wait_for_torchrun(CHECKPOINT_WAIT_S)
        rec = read_progress(RunPaths(Path(self.run_dir)).progress)
        # Only a record written by this attempt counts: a requeued job starts with the
        # previous attempt's terminal record on disk until its trainer writes a new one.
        mine = rec is not None and self._started > 0 and rec.heartbeat >= self._started
        if mine and rec.state in (TrainState.FINISHED, TrainState.FAILED):
            if self._waiting:
                raise _AttemptEnded()
            return None  # nothing to resume: let the job end
        again = NodeLauncher(self.run_dir, self.nproc_per_node, self.env)
        return submitit.helpers.DelayedSubmission(again)

    def _wait_for_torchrun(self, timeout_s: float) -> None:
        """Until torchrun (so every trainer process) has exited, or ``timeout_s``."""
        if self._proc is None:
            return
        deadline = time.monotonic() + timeout_s
        while not child_exited(self._proc.pid) and time.monotonic() < deadline:
            time.sleep(0.2)


def child_exited(pid: int) -> bool:
    """Whether a child process has exited, without reaping it.

    The preemption hook runs as a signal handler in the main thread while that thread is
    inside ``Popen.wait()``, which holds the Popen's wait lock: ``poll()``/``wait()`` from
    the handler could never see the exit (they would give up on the lock, or spin until
    their timeout). ``waitid(WNOWAIT)`` peeks and leaves the exit status to ``wait()``.
    """
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:  # already reaped
        return True
