"""Run the real trainer (forked or under torchrun) on a run directory the submit code made."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import IO

from grpo_hpc.config.profiles import load_profile
from grpo_hpc.core.paths import RunPaths
from grpo_hpc.node.launch import exit_code_from_progress, ignore_preempt_signals
from grpo_hpc.submit.job import create_run

from ..slowdown import guard
from .trainer_fork import ForkedRun


def make_run(root: Path, name: str, *overrides: str, nproc: int = 1) -> RunPaths:
    paths = RunPaths(root / name)
    overrides = (*overrides, "training.num_threads=1")
    create_run(paths, load_profile("local"), "tiny", list(overrides))
    text = paths.config.read_text()
    if nproc != 1:  # the local profile runs one process; tests ask for more
        text = text.replace("nproc_per_node: 1", f"nproc_per_node: {nproc}")
    paths.config.write_text(text)
    return paths


def torchrun_cmd(paths: RunPaths, nproc: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc-per-node={nproc}",
        "--standalone",
        "--nnodes=1",
        "-m",
        "grpo_hpc.train",
        str(paths.root),
    ]


def launch(
    paths: RunPaths, nproc: int, out: IO[str], err: IO[str], torchrun: bool = False
) -> ForkedRun | subprocess.Popen:
    """Start training ``paths`` with stdout/stderr into ``out``/``err``: by default forked
    from a server that imported the trainer once (tests/e2e/trainer_fork.py: ~4.5 s of CPU
    saved per process, and torchrun's ~2.5 s), several processes under an agent that does
    for them what torchrun does on one node (their environment, the rendezvous store, the
    others stopped when one fails); under the real torchrun with ``torchrun=True``. The
    launch path stays under test: :func:`start`, tests/e2e/test_signals_early.py,
    test_two_processes_train_and_checkpoint[ddp-hf], tests/e2e/test_submit_local.py and
    the real-Slurm tests go through torchrun."""
    if not torchrun and not _gpu_machine():
        return ForkedRun([str(paths.root)], env(), out, err, nproc)
    return subprocess.Popen(
        torchrun_cmd(paths, nproc),
        stdout=out,
        stderr=err,
        text=True,
        env=env(),
        start_new_session=True,
    )


def _gpu_machine() -> bool:
    """On a machine with a CUDA GPU the runs go through the real torchrun: the fork
    server's preloaded trainer may have set CUDA up, and CUDA cannot be used again in a
    process forked after that ("Cannot re-initialize CUDA in forked subprocess")."""
    import torch

    return torch.cuda.is_available()


def env() -> dict[str, str]:
    return {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONUNBUFFERED": "1",
        "TRANSFORMERS_VERBOSITY": "error",
        "HF_HUB_OFFLINE": "1",
    }


def train(
    paths: RunPaths, nproc: int = 1, timeout: float = 300, torchrun: bool = False
) -> subprocess.CompletedProcess:
    """Train to the end (:func:`launch`). Like the launcher, take the exit code from
    progress.json: torchrun reports 1 for any failed worker, whatever the worker's own code
    was."""
    with training(paths, nproc, timeout, torchrun) as result:
        return result()


@contextmanager
def training(
    paths: RunPaths, nproc: int = 1, timeout: float = 300, torchrun: bool = False
) -> Iterator[Callable[[], subprocess.CompletedProcess]]:
    """``train`` in the background: yields a function that waits for the run's end and
    returns what ``train`` would have. The run is SIGKILLed if it is still going when the
    ``with`` block ends (a failed test, a timeout). For a reference run that has nothing to
    do with what the test does meanwhile: on two cores it runs beside the test's own run,
    not before it. Output goes to files, not pipes, so a run that prints much never blocks
    on a full pipe."""
    with (
        tempfile.NamedTemporaryFile("w+") as out,
        tempfile.NamedTemporaryFile("w+") as err,
    ):
        proc = launch(paths, nproc, out, err, torchrun)

        def result() -> subprocess.CompletedProcess:
            proc.wait(timeout=guard(timeout))  # stretched: tests/slowdown.py
            out.seek(0)
            err.seek(0)
            code = exit_code_from_progress(paths, proc.returncode)
            return subprocess.CompletedProcess(proc.args, code, out.read(), err.read())

        try:
            yield result
        finally:
            if proc.poll() is None:
                signal_job(proc.pid, signal.SIGKILL)
                proc.wait()


def train_side_by_side(*runs: RunPaths) -> None:
    """Train runs that share nothing at once (each beside the others, not after them: two
    cores), and assert that every one ended well."""
    first, *rest = runs
    with training(first) as first_result:
        for paths in rest:
            result = train(paths)
            assert result.returncode == 0, result.stderr[-3000:]
        result = first_result()
        assert result.returncode == 0, result.stderr[-3000:]


def start_forked(paths: RunPaths) -> ForkedRun:
    """A one-process run forked from the test's trainer server (tests/e2e/trainer_fork.py:
    no torchrun, no imports of its own; ~7 s of CPU less than :func:`start`), its output
    dropped; signal_job reaches it as it reaches torchrun's worker. For the tests whose
    property is the trainer's own answer to a signal or a kill, not the launch path."""
    with open(os.devnull, "w") as null:
        return launch(paths, 1, null, null)


def start(paths: RunPaths, nproc: int = 1, log: Path | None = None) -> subprocess.Popen:
    """Start training as the launcher does on a node: torchrun ignores the preemption
    signals, so a test can signal or SIGKILL every process like Slurm does. Its output
    goes to ``log`` where one is given (torchrun's own warnings included), else nowhere."""
    with open(log, "w") if log is not None else nullcontext(subprocess.DEVNULL) as out:
        return subprocess.Popen(
            torchrun_cmd(paths, nproc),
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env(),
            start_new_session=True,
            preexec_fn=ignore_preempt_signals,
        )


def descendants(pid: int) -> list[int]:
    """pid and all its descendants (from /proc), like Slurm's proctrack/linuxproc sees them."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def signal_job(pid: int, sig: int) -> None:
    """Signal every process of the 'job' (torchrun starts workers in their own sessions).
    A SIGKILL returns once every one of them is dead (gone or a zombie): a killed process
    holds its files, the run directory's lock among them, until the kernel has torn it
    down, and a test that trains the run again at once must find it free, as a job
    resubmitted after a kill does (minutes later on a cluster)."""
    pids = descendants(pid)
    for p in pids:
        try:
            os.kill(p, sig)
        except ProcessLookupError:
            pass
    if sig == signal.SIGKILL:
        deadline = time.monotonic() + guard(60)
        while any(_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.01)


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs still (not gone, not a zombie)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def assert_same(a: object, b: object) -> None:
    """Equal to the bit: tensors by torch.equal, containers element by element."""
    import torch

    if isinstance(a, torch.Tensor):
        assert torch.equal(a, b)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            assert_same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            assert_same(x, y)
    else:
        assert a == b


def full_state(paths: RunPaths, step: int) -> tuple[dict, dict]:
    """A checkpoint's (model, optimizer) state dicts, gathered (``model.pt``, ``optim.pt``)
    or sharded (FSDP2's DCP shards gathered here through a file beside the checkpoint)."""
    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    ckpt = paths.checkpoint(step)
    if not (ckpt / "dcp").is_dir():
        return (
            torch.load(ckpt / "model.pt", weights_only=False),
            torch.load(ckpt / "optim.pt", weights_only=False),
        )
    out = ckpt.parent / f".full-{ckpt.name}.pt"
    dcp_to_torch_save(ckpt / "dcp", out)
    try:
        state = torch.load(out, weights_only=False)
    finally:
        out.unlink()
    return state["model"], state["optim"]
