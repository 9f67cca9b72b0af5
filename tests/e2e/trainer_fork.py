"""Trainer runs forked from a server that has imported the trainer once.

Every trainer process spends ~4.5 s of CPU importing torch, transformers and the trainer
before it trains a tiny model for ~1 s: on the 2-core test machine the suite's runs spent
minutes importing the same modules again. Here a multiprocessing fork server (one per
pytest worker, started at the first run) imports ``grpo_hpc.train.trainer`` once; each
run is a fresh process forked from it that runs the trainer's own entry point,
``grpo_hpc.train.__main__.main``, with the run's environment and its output in files.

A run of several processes (:class:`ForkedRun` with ``nproc > 1``) stands in for
``torchrun --standalone --nproc-per-node=N -m grpo_hpc.train RUN``: an agent process is
forked from the server, hosts the rendezvous store and forks the ranks from itself, each
with the environment torchrun gives a worker (:func:`rank_env`). Like torchrun's agent it
watches the ranks every 0.1 s; once one has failed (or the agent is sent SIGTERM, SIGINT,
SIGHUP or SIGQUIT) it sends the others SIGTERM (or that signal), SIGKILL after 30 s, and
exits 1 (0 when every rank ended with 0). tests/e2e/test_ddp_compile.py forks its own
worker's ranks the same way (``entry``). What differs from torchrun, and why the tests
that use it do not care:

- the imports were done before the fork. The entry module itself is imported in each
  rank, so its early signal handlers are installed there as in production;
- the processes are the fork server's descendants, not the test's: ``pid`` is the agent's
  (one-process runs: the trainer's), and :func:`tests.e2e.helpers.signal_job` reaches
  every process below it, as it reaches torchrun's workers;
- the agent neither prints torchrun's failure report nor writes its error files; the
  tests take the run's exit code and reason from progress.json, as the launcher does;
- no restarts, no elastic membership, no per-rank log files: the tests use none.

What the launch path itself does stays under test through the real torchrun:
:func:`tests.e2e.helpers.start` (signals sent as Slurm sends them, kills at random
moments), test_signals_early (a signal during the imports),
test_two_processes_train_and_checkpoint[ddp-hf] (an ordinary two-process run, from
start to end), tests/e2e/test_submit_local.py and the real-Slurm tests.
"""

from __future__ import annotations

import importlib
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import time
from typing import IO, NoReturn

PRELOAD = [
    "tests.e2e.collector_off",  # first: no automatic collection during the imports below
    "grpo_hpc.train.trainer",
    "math_verify",
    "transformers.models.llama.modeling_llama",
    "transformers.models.qwen2.modeling_qwen2",
    "tests.e2e.warm_verifier",
    "tests.e2e.warm_transformers",
    "tests.e2e.freeze_preloaded",  # last: freezes what the imports above left alive
]
"""What the server imports once: torch, transformers, the trainer (not its entry module),
the math-verify package its reward worker imports, the tiny models' architectures (the
built-in ``tiny`` is a Llama; the tests' other small model a Qwen2), math-verify
warmed up as each trainer warms it (tests/e2e/warm_verifier.py), what a trainer would
import and build later in its run (tests/e2e/warm_transformers.py), all of it imported
with the collector off (tests/e2e/collector_off.py) and then frozen out of its walks
(tests/e2e/freeze_preloaded.py)."""

MONITOR_S = 0.1
"""How often the agent looks at its ranks (torchrun's ``--monitor-interval`` default)."""

SHUTDOWN_GRACE_S = 30.0
"""From SIGTERM to SIGKILL for the ranks left when one failed (torchrun's shutdown timeout)."""

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)
"""Signals torchrun's agent turns into a shutdown of its workers with the same signal."""

_context: mp.context.ForkServerContext | None = None


def _server() -> mp.context.ForkServerContext:
    global _context
    if _context is None:
        _context = mp.get_context("forkserver")
        _context.set_forkserver_preload(PRELOAD)
    return _context


def rank_env(rank: int, nproc: int, port: int) -> dict[str, str]:
    """What torchrun's agent adds to a worker's environment on a single node (the names of
    torch/distributed/elastic/agent/server/local_elastic_agent.py): the trainer reads RANK,
    LOCAL_RANK, WORLD_SIZE and LOCAL_WORLD_SIZE; torch's env:// rendezvous reads
    MASTER_ADDR/PORT and joins the store the agent hosts (TORCHELASTIC_USE_AGENT_STORE)."""
    return {
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        "GROUP_RANK": "0",
        "ROLE_RANK": str(rank),
        "ROLE_NAME": "default",
        "WORLD_SIZE": str(nproc),
        "LOCAL_WORLD_SIZE": str(nproc),
        "GROUP_WORLD_SIZE": "1",
        "ROLE_WORLD_SIZE": str(nproc),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "TORCHELASTIC_RESTART_COUNT": "0",
        "TORCHELASTIC_MAX_RESTARTS": "0",
        "TORCHELASTIC_RUN_ID": "forked",
        "TORCHELASTIC_USE_AGENT_STORE": "True",
    }


def group_exit_code(codes: list[int], signalled: bool) -> int:
    """The agent's exit code, as torchrun's: 0 when every rank ended with 0 and nobody
    stopped the group, otherwise 1 (the reason is in progress.json)."""
    return 0 if not signalled and all(c == 0 for c in codes) else 1


def _into_files(env: dict[str, str], out_path: str, err_path: str) -> None:
    """Its own session (a test kills it with its descendants), the run's environment,
    stdout/stderr appended to the given files."""
    os.setsid()
    os.environ.clear()
    os.environ.update(env)
    for fd, path in ((1, out_path), (2, err_path)):
        target = os.open(path, os.O_WRONLY | os.O_APPEND)
        os.dup2(target, fd)
        os.close(target)
    sys.stdout = open(1, "w", buffering=1, closefd=False, errors="backslashreplace")  # noqa: SIM115
    sys.stderr = open(2, "w", buffering=1, closefd=False, errors="backslashreplace")  # noqa: SIM115


TRAINER = "grpo_hpc.train.__main__:main"
"""The trainer's entry point: ``main(argv) -> exit code``."""


def _enter(entry: str, argv: list[str]) -> NoReturn:
    """Call ``entry`` (``module:function``, imported here) with ``argv``. SystemExit
    carries its code out through the forked process's multiprocessing bootstrap, whose
    exit then stops the trainer's daemon helpers (the math-verify worker) as Python's
    would; an exception is printed there and ends the process with 1."""
    module, function = entry.split(":")
    raise SystemExit(getattr(importlib.import_module(module), function)(argv))


def _child(entry: str, argv: list[str], env: dict[str, str], out_path: str, err_path: str) -> None:
    """A one-process run: the forked process is the trainer."""
    _into_files(env, out_path, err_path)
    _enter(entry, argv)


def _agent(
    entry: str, argv: list[str], env: dict[str, str], out_path: str, err_path: str, nproc: int
) -> None:
    """A run of ``nproc`` ranks: fork them (before this process starts any thread), host
    the rendezvous store, hand its port to the ranks through pipes (the port is only known
    once the store listens: no free-port guess that another test could take meanwhile),
    then watch them."""
    _into_files(env, out_path, err_path)
    ranks: dict[int, int] = {}
    pipes: list[int] = []
    for rank in range(nproc):
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:
            for fd in (write_end, *pipes):
                os.close(fd)
            port = int(os.read(read_end, 16) or b"0")
            os.close(read_end)
            os.setsid()  # torchrun starts each worker in its own session
            os.environ.update(rank_env(rank, nproc, port))
            _enter(entry, argv)
        os.close(read_end)
        pipes.append(write_end)
        ranks[pid] = rank
    from torch.distributed import TCPStore

    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    for fd in pipes:
        os.write(fd, str(store.port).encode())
        os.close(fd)
    raise SystemExit(group_exit_code(*supervise(list(ranks))))


def supervise(pids: list[int]) -> tuple[list[int], bool]:
    """torchrun's watch over its workers (children of this process): every
    :data:`MONITOR_S`, reap the ones that ended; once one failed or this process was sent
    one of :data:`FORWARDED`, stop the others (that signal or SIGTERM, SIGKILL after
    :data:`SHUTDOWN_GRACE_S`). Returns each one's exit code (-N: killed by signal N) and
    whether this process was signalled."""
    received: list[int] = []
    for sig in FORWARDED:
        signal.signal(sig, lambda signum, _frame: received.append(signum))
    signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARDED)  # one that came early is handled now
    codes: dict[int, int] = {}
    kill_at: float | None = None
    while len(codes) < len(pids):
        for pid in pids:
            if pid not in codes:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    codes[pid] = os.waitstatus_to_exitcode(status)
        left = [p for p in pids if p not in codes]
        failed = received or any(c != 0 for c in codes.values())
        if failed and kill_at is None:
            _signal(left, received[0] if received else signal.SIGTERM)
            kill_at = time.monotonic() + SHUTDOWN_GRACE_S
        elif kill_at is not None and time.monotonic() > kill_at:
            _signal(left, signal.SIGKILL)
        if left:
            time.sleep(MONITOR_S)
    return [codes[p] for p in pids], bool(received)


def _signal(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


class ForkedRun:
    """A forked run of ``entry(argv)`` (by default the trainer's: ``argv`` is the run
    directory), one process or an agent and its ``nproc`` ranks, with the part of
    ``subprocess.Popen``'s interface the tests use. ``out``/``err`` are named files."""

    def __init__(
        self,
        argv: list[str],
        env: dict[str, str],
        out: IO[str],
        err: IO[str],
        nproc: int = 1,
        entry: str = TRAINER,
    ) -> None:
        if nproc == 1:
            self.args = [f"<fork of {entry}>", *argv]
            target, args = _child, (entry, argv, env, out.name, err.name)
        else:
            self.args = [f"<fork of torchrun --nproc-per-node={nproc} {entry}>", *argv]
            target, args = _agent, (entry, argv, env, out.name, err.name, nproc)
        self._proc = _server().Process(target=target, args=args, name=entry)
        self._proc.start()
        self.pid: int = self._proc.pid

    @property
    def returncode(self) -> int | None:
        return self._proc.exitcode

    def poll(self) -> int | None:
        return self._proc.exitcode

    def wait(self, timeout: float | None = None) -> int:
        self._proc.join(timeout)
        if self._proc.exitcode is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        return self._proc.exitcode
