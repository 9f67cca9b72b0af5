"""Which process died first (grpo_hpc.node.root_cause), from a real torchrun's report: two
workers, one SIGKILLs itself; the record then names it instead of "job FAILED exit 1"."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from grpo_hpc.core.errors import ExitCode
from grpo_hpc.core.progress import ProgressRecord, TrainState
from grpo_hpc.node import root_cause
from grpo_hpc.train.supervision.signals import STOP_SIGNALS

WORKER = """
import os, signal, time
if os.environ["RANK"] == "1":
    os.kill(os.getpid(), signal.SIGKILL)
time.sleep(600)  # rank 0 never ends by itself: torchrun ends it once rank 1 has died
"""


@pytest.fixture(scope="module")
def torchrun_report(tmp_path_factory: pytest.TempPathFactory) -> str:
    script = tmp_path_factory.mktemp("tr") / "worker.py"
    script.write_text(WORKER)
    out = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2", "--standalone",
         str(script)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert out.returncode != 0
    return out.stdout + out.stderr


def test_the_first_death_is_read_from_torchruns_report(torchrun_report: str) -> None:
    cause = root_cause.parse(torchrun_report)
    assert cause is not None, torchrun_report[-2000:]
    assert (cause.rank, cause.exitcode, cause.signal_name) == (1, -9, "SIGKILL")
    assert cause.pid is not None and cause.host
    line = root_cause.death_line(cause, 4)
    assert line.startswith(f"rank 1 (pid {cause.pid} on {cause.host}) was killed by SIGKILL")
    assert "at step 4" in line and "out-of-memory killer" in line
    assert root_cause.parse("no report here") is None


def _rec(state: TrainState, code: int | None = None, reason: str | None = None) -> ProgressRecord:
    return ProgressRecord(run="r", state=state, step=4, exit_code=code, reason=reason,
                          heartbeat=time.time())  # fmt: skip


def test_what_the_record_becomes() -> None:
    cause = root_cause.RootCause(rank=1, host="n1", exitcode=-9, pid=77)
    started = time.time() - 10
    # nobody recorded anything (NCCL: the peer sat in a collective until torchrun killed it)
    silent = root_cause.explained(_rec(TrainState.TRAINING), cause, started)
    assert silent.state is TrainState.FAILED and silent.exit_code == ExitCode.CRASH
    assert silent.reason.startswith("rank 1 (pid 77 on n1) was killed by SIGKILL at step 4")
    # rank 0 recorded the broken collective it saw (gloo): the death goes first
    crash = _rec(TrainState.FAILED, int(ExitCode.CRASH), "RuntimeError: connection reset")
    got = root_cause.explained(crash, cause, started)
    assert got.reason.endswith("; then: RuntimeError: connection reset")
    # a failure the trainer classified itself keeps its reason (the pulse SIGKILLs a hung
    # rank: that kill is not the story), and so does a finished run
    stalled = _rec(TrainState.FAILED, int(ExitCode.STALLED), "rank 1 stopped answering")
    assert root_cause.explained(stalled, cause, started) is None
    assert root_cause.explained(_rec(TrainState.FINISHED, 0), cause, started) is None
    # ... unless it checkpointed on the SIGTERM torchrun sent after the death (a split run's
    # trainer saves alone when its generator is killed): a crash, not a preemption, and the
    # death is named; a process that ended on a stop signal itself was stopped, not killed,
    # and rank 0's own death came after the record it wrote
    saved = _rec(TrainState.INTERRUPTED, int(ExitCode.CHECKPOINTED), "stopped on SIGTERM")
    got = root_cause.explained(saved, cause, started, "generator")
    assert (got.state, got.exit_code) == (TrainState.FAILED, ExitCode.CRASH)
    assert got.reason.startswith("generator (rank 1, pid 77 on n1) was killed by SIGKILL")
    assert got.reason.endswith("; then: stopped on SIGTERM")
    own = root_cause.RootCause(rank=0, host="n1", exitcode=-9, pid=76)  # after its record
    assert root_cause.explained(saved, own, started, "trainer") is None
    for sig in STOP_SIGNALS:
        stopped = root_cause.RootCause(rank=1, host="n1", exitcode=-int(sig), pid=77)
        assert root_cause.explained(saved, stopped, started) is None, sig.name
    # a record of an earlier attempt, and an ordinary non-zero exit, are left alone
    old = _rec(TrainState.TRAINING)
    assert root_cause.explained(old, cause, time.time() + 10) is None
    exited = root_cause.RootCause(rank=1, host="n1", exitcode=1, pid=77)
    assert root_cause.explained(_rec(TrainState.TRAINING), exited, started) is None


@pytest.mark.parametrize(
    ("nproc", "generators", "rank", "said"),
    [(2, 1, 1, "generator (rank 1, "), (4, 2, 3, "generator 1 (rank 3, ")],
)
def test_a_killed_process_of_a_split_run_is_named_by_its_role(
    tmp_path: Path, nproc: int, generators: int, rank: int, said: str
) -> None:
    """rollout.placement=split: the launcher names what the killed rank did (the last
    ``rollout.generators`` ranks generate, the others train; which generator where there
    are several), read from the run's config."""
    from collections import deque

    from grpo_hpc.config.profiles import load_profile
    from grpo_hpc.core.paths import RunPaths
    from grpo_hpc.core.progress import read_progress, write_progress
    from grpo_hpc.node import launch
    from grpo_hpc.submit.job import create_run

    paths = RunPaths(tmp_path / "split")
    overrides = ["algo.max_staleness=1", f"rollout.generators={generators}"]
    create_run(paths, load_profile("local"), "tiny", overrides)
    text = paths.config.read_text().replace("nproc_per_node: 1", f"nproc_per_node: {nproc}")
    paths.config.write_text(text.replace("placement: thread", "placement: split"))
    started = time.time() - 10
    write_progress(paths.progress, _rec(TrainState.TRAINING))
    report = "Root Cause (first observed failure):\n[0]:\n  time : t\n  host : n1\n"
    report += f"  rank : {rank} (local_rank: {rank})\n  exitcode : -9 (pid: 77)\n"
    launch.record_root_cause(paths, deque([report.encode()]), started)
    reason = read_progress(paths.progress).reason
    assert reason.startswith(f"{said}pid 77 on n1) was killed by SIGKILL at step 4"), reason
    trainer = root_cause.death_line(root_cause.RootCause(0, "n1", -9, 76), 4, "trainer")
    assert trainer.startswith("trainer (rank 0, pid 76 on n1) was killed by SIGKILL")


def test_a_killed_trainer_of_a_split_run_across_nodes_is_named_by_its_global_rank(
    tmp_path: Path,
) -> None:
    """Two nodes of one process each (rollout.placement=split): torchrun reports the
    global rank, so rank 0 on the first node is the trainer and rank 1, the second node's
    process, the generator (the job's ranks, not one node's, decide)."""
    from collections import deque

    from grpo_hpc.config.profiles import load_profile
    from grpo_hpc.core.paths import RunPaths
    from grpo_hpc.core.progress import read_progress, write_progress
    from grpo_hpc.node import launch
    from grpo_hpc.submit.job import create_run

    paths = RunPaths(tmp_path / "split")
    create_run(paths, load_profile("local"), "tiny", ["algo.max_staleness=1"])
    paths.config.write_text(
        paths.config.read_text().replace("placement: thread", "placement: split")
    )
    started = time.time() - 10
    for rank, host, role in ((0, "n1", "trainer"), (1, "n2", "generator")):
        write_progress(paths.progress, _rec(TrainState.TRAINING))
        report = f"Root Cause (first observed failure):\n[0]:\n  time : t\n  host : {host}\n"
        report += f"  rank : {rank} (local_rank: 0)\n  exitcode : -9 (pid: 77)\n"
        launch.record_root_cause(paths, deque([report.encode()]), started, nnodes=2)
        reason = read_progress(paths.progress).reason
        assert reason.startswith(f"{role} (rank {rank}, pid 77 on {host}) was killed"), reason
