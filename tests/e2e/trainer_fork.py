"""One-process trainer runs forked from a server that has imported the trainer once.

Every trainer process spends ~4.5 s of CPU importing torch, transformers and the trainer
before it trains a tiny model for ~1 s: on the 2-core test machine the suite's one-process
runs spent minutes importing the same modules again. Here a multiprocessing fork server
(one per pytest worker, started at the first run) imports ``grpo_hpc.train.trainer``
once; each run is a fresh process forked from it that runs the trainer's own entry point,
``grpo_hpc.train.__main__.main``, with the run's environment and its output in files.

What differs from ``python -m grpo_hpc.train RUN``: the trainer's imports were done before
the fork (the entry module itself is imported in the child, so its early signal handlers
are installed there as in production), and the process is a child of the fork server, not
of the test. What the launch path adds stays under test elsewhere: torchrun in every
multi-process run, :func:`tests.e2e.helpers.start` (signals sent as Slurm sends them) and
test_signals_early (a signal during the imports), tests/e2e/test_submit_local.py and the
real-Slurm tests.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import subprocess
import sys
from typing import IO

PRELOAD = [
    "grpo_hpc.train.trainer",
    "math_verify",
    "transformers.models.llama.modeling_llama",
    "transformers.models.qwen2.modeling_qwen2",
]
"""What the server imports once: torch, transformers, the trainer (not its entry module),
the math-verify package its reward worker imports, the tiny models' architectures (the
built-in ``tiny`` is a Llama; the tests' other small model a Qwen2)."""

_context: mp.context.ForkServerContext | None = None


def _server() -> mp.context.ForkServerContext:
    global _context
    if _context is None:
        _context = mp.get_context("forkserver")
        _context.set_forkserver_preload(PRELOAD)
    return _context


def _child(run_dir: str, env: dict[str, str], out_fd_path: str, err_fd_path: str) -> None:
    """The forked process: its own session (a test kills it with its descendants), the
    run's environment, stdout/stderr into the given files, then the trainer's entry point.
    SystemExit carries the trainer's code out as the exit code; multiprocessing's exit
    then stops the trainer's daemon helpers (the math-verify worker) as Python's would."""
    os.setsid()
    os.environ.clear()
    os.environ.update(env)
    for fd, path in ((1, out_fd_path), (2, err_fd_path)):
        target = os.open(path, os.O_WRONLY | os.O_APPEND)
        os.dup2(target, fd)
        os.close(target)
    sys.stdout = open(1, "w", buffering=1, closefd=False, errors="backslashreplace")  # noqa: SIM115
    sys.stderr = open(2, "w", buffering=1, closefd=False, errors="backslashreplace")  # noqa: SIM115
    from grpo_hpc.train.__main__ import main

    raise SystemExit(main([run_dir]))


class ForkedRun:
    """A forked trainer with the part of ``subprocess.Popen``'s interface the tests use."""

    def __init__(self, run_dir: str, env: dict[str, str], out: IO[str], err: IO[str]) -> None:
        self.args = ["<fork of grpo_hpc.train>", run_dir]
        self._proc = _server().Process(
            target=_child, args=(run_dir, env, out.name, err.name), name="grpo_hpc.train"
        )
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
