"""Asynchronous GRPO with the generator in a process of its own (``rollout.placement=split``:
rank 0 trains, rank 1 generates, gloo on the CPU) on the real trainer: the run trains, bit
for bit, what the thread placement trains with the same seed (two DDP trainers and a
generator too, and two DDP trainers with two generators, each serving one, against two DDP
ranks; two FSDP2 trainers and a generator against two FSDP2 ranks); a SIGKILL of the
generator or of the trainer (or of the second of two generators), or a SIGTERM (save, exit
5), then a resume, ends equal to the uninterrupted split run; a stopped generator or
trainer is caught as a hung rank is, and named by its role; a generator alive but stuck
(its pulse runs on, its work does not) is caught by its progress, named, and the resume
ends equal to the uninterrupted run; a collapse rolled back samples, step for step, what
the thread placement's rollback samples. One uninterrupted split run of each shape (1 + 1,
2 + 2) serves the module."""

from __future__ import annotations

import json
import os
import random
import signal
import time
from pathlib import Path

import pytest

from grpo_hpc.core.errors import ExitCode
from grpo_hpc.core.events import read as read_events
from grpo_hpc.core.paths import RunPaths
from grpo_hpc.core.progress import TrainState, read_progress
from grpo_hpc.train.state.checkpoint import SHARDED, format_of
from grpo_hpc.train.supervision.liveness import HOST

from ..slowdown import guard
from .helpers import assert_same, full_state, make_run, signal_job, start, train, training
from .test_async_stuck import STUCK, STUCK_AT, check_stalled_then_resume, until_stalled
from .test_resume_exact import _final_state

pytestmark = pytest.mark.slow
MAX_STEPS = 8
STEPS = [
    f"training.max_steps={MAX_STEPS}",
    "training.save_every_steps=2",
    "training.keep_last=1",
    "algo.max_staleness=1",
]
SLOW = ["faults.enabled=true", "faults.step_sleep=0.3"]
"""For the runs a test interrupts: a step long enough to land a signal in (it sleeps, and
changes no number: the final state is compared with the reference's)."""
TWO_GENERATORS = ["rollout.generators=2"]
"""With ``nproc=4``: trainers 0 and 1, generators 2 and 3 (trainer r served by rank 2 + r)."""
HANG_S = 240
"""The deadline of a 4-process run: a mapping the two sides disagree on (a request no
generator takes, a generator waiting for a trainer that never writes) deadlocks, and the
run is caught here, not by the process group's 30 min."""


FORCED_KILL = "Unable to shutdown process"
"""What torchrun's agent logs when a survivor did not end within the 30 s it gives one
between SIGTERM (which the trainer takes as a stop) and SIGKILL
(torch.distributed.elastic.multiprocessing.api): a survivor blocked in a message or
collective that cannot complete. (Before, a 25 s deadline on the job's end stood for this;
CI missed it on 2026-12-06, on a machine three times slower than usual, where a slow end
and a blocked survivor looked the same.)"""


def split_run(root: Path, name: str, *overrides: str, nproc: int = 2) -> RunPaths:
    """A run of ``nproc`` processes, the last ``rollout.generators`` generating (one
    unless the overrides say), with this module's ``STEPS``."""
    return as_split(make_run(root, name, *STEPS, *overrides, nproc=nproc))


def as_split(paths: RunPaths) -> RunPaths:
    """``paths``'s run with its last process(es) generating. grpo-submit's local profile
    runs one process and refuses the split there, so the run is made threaded and turned
    into a split one, as make_run turns one process into several."""
    text = paths.config.read_text()
    assert "placement: thread" in text
    paths.config.write_text(text.replace("placement: thread", "placement: split"))
    return paths


def both_placements(root: Path, *overrides: str, ranks: int = 1) -> tuple[RunPaths, RunPaths]:
    """The same run trained to its end in the thread placement on ``ranks`` processes and in
    the split one on ``ranks`` trainers and one generator: (thread, split)."""
    thread = make_run(root, "thread", *overrides, nproc=ranks)
    split = as_split(make_run(root, "split", *overrides, nproc=ranks + 1))
    for run, nproc in ((thread, ranks), (split, ranks + 1)):
        result = train(run, nproc)
        assert result.returncode == 0, result.stderr[-3000:]
    return thread, split


def collapse_actions(run: RunPaths) -> list[tuple[str, int]]:
    """The run's collapse decisions (events.jsonl): each action and its step."""
    events = read_events(run.events)
    return [(e["action"], e["step"]) for e in events if e.get("phase") == "collapse"]


def _rows(run: RunPaths) -> list[dict]:
    lines = run.metrics.read_text().splitlines()
    return [r for r in map(json.loads, lines) if "reward/mean" in r]


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> RunPaths:
    """The uninterrupted split run (forked as torchrun would start its two processes)."""
    run = split_run(tmp_path_factory.mktemp("split"), "uninterrupted")
    result = train(run, 2)
    assert result.returncode == 0, result.stderr[-3000:]
    return run


@pytest.fixture(scope="module")
def two_by_two(tmp_path_factory: pytest.TempPathFactory) -> RunPaths:
    """The uninterrupted split run of two trainers and two generators (4 processes). Every
    process ends on its own: each generator was sent its stop (the run's exit code is
    trainer 0's record; a generator left waiting fails when the trainers leave)."""
    run = split_run(tmp_path_factory.mktemp("split22"), "uninterrupted", *TWO_GENERATORS, nproc=4)
    result = train(run, 4, timeout=HANG_S)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    return run


def _pulse(run: RunPaths, rank: int, deadline_s: float = 120) -> list[str]:
    """The rank's pulse file's fields (``<pid> <counter> <host> <role>``, then its index
    where the role has several processes; its first line: a generator's second line is its
    progress)."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        for f in run.alive_dir.glob(f"*/rank{rank}"):
            return f.read_text().split("\n")[0].split()
        time.sleep(0.05)
    raise AssertionError(f"rank {rank} never pulsed")


def _wait_for(run: RunPaths, step: int, proc, checkpoint: bool = True) -> None:  # noqa: ANN001
    deadline = time.time() + 240

    def reached() -> bool:
        rec = read_progress(run.progress)
        ckpt = run.latest_checkpoint() is not None or not checkpoint
        return ckpt and rec is not None and rec.step >= step

    while not reached():
        assert proc.poll() is None, f"the job exited before step {step}"
        assert time.time() < deadline, f"step {step} not reached within the deadline"
        time.sleep(0.02)


def test_split_trains_what_the_thread_placement_trains(tmp_path: Path, reference: RunPaths) -> None:
    """The same seed and bound in one process (a generator thread) and in two (a generator
    process): the same weights and optimizer at the end, bit for bit. The generator makes
    exactly the batches the schedule names, from the weights sent to it (version t), the
    trainer's prompts and the step's random stream; each step's staleness is min(step - 1,
    1), the weights' transfer is timed, and the pulses name the roles."""
    thread = make_run(tmp_path, "thread", *STEPS)
    result = train(thread)
    assert result.returncode == 0, result.stderr[-3000:]
    assert_same(_final_state(reference, MAX_STEPS), _final_state(thread, MAX_STEPS))
    rows = _rows(reference)
    assert [r["staleness/max"] for r in rows] == [0.0] + [1.0] * (MAX_STEPS - 1)
    # a transfer at each step that asked for a batch (none at the last: nothing is left)
    assert all(r["time/weight_sync"] > 0 for r in rows[:-1]) and rows[-1]["time/weight_sync"] == 0
    assert _pulse(reference, 0)[3:] == ["trainer"] and _pulse(reference, 1)[3:] == ["generator"]


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_two_trainers_train_what_two_ranks_train(tmp_path: Path, strategy: str) -> None:
    """Two trainers (DDP, or FSDP2 sharding over the trainers alone, in a group of their
    own) and one generator against two ranks of the same strategy each generating in a
    thread: the same final state, bit for bit. The generator makes each trainer's share
    from that trainer's random stream, as each rank's thread does; under FSDP2 the trainers
    gather each tensor and trainer 0 sends it, as each rank gathers its own copy. The DDP
    pair also trains its first 2 steps synchronously (``algo.synchronous_steps=2``), alike
    in both placements."""
    steps = ["training.max_steps=4", "algo.max_staleness=1", "rollout.prompts_per_step=4"]
    steps.append(f"dist.strategy={strategy}")
    warm = strategy == "ddp"
    steps += ["algo.synchronous_steps=2"] if warm else []
    thread, split = both_placements(tmp_path, *steps, ranks=2)
    assert_same(full_state(thread, 4), full_state(split, 4))
    sharded = strategy == "fsdp"
    assert (format_of(split.checkpoint(4)) == SHARDED) == sharded  # over the 2 trainers
    stale = [0.0, 0.0, 1.0, 1.0] if warm else [0.0, 1.0, 1.0, 1.0]
    assert [r["staleness/max"] for r in _rows(split)] == stale
    assert [r["staleness/max"] for r in _rows(thread)] == stale
    assert _pulse(split, 1)[3:] == ["trainer", "1"] and _pulse(split, 2)[3:] == ["generator"]


def test_two_generators_train_what_two_ddp_ranks_train(
    tmp_path: Path, two_by_two: RunPaths
) -> None:
    """Two trainers served by two generators (trainer r by generator r % 2) against two DDP
    ranks each generating in a thread: the same final state, bit for bit. Each generator
    gets trainer 0's hello and every step's weights in the one broadcast, takes its own
    trainer's requests and makes that trainer's share from its random stream; the pulses
    name which generator."""
    thread = make_run(tmp_path, "thread", *STEPS, nproc=2)
    result = train(thread, 2)
    assert result.returncode == 0, result.stderr[-3000:]
    assert_same(_final_state(thread, MAX_STEPS), _final_state(two_by_two, MAX_STEPS))
    rows = _rows(two_by_two)
    assert [r["staleness/max"] for r in rows] == [0.0] + [1.0] * (MAX_STEPS - 1)
    assert all(r["time/weight_sync"] > 0 for r in rows[:-1])
    labels = [_pulse(two_by_two, rank)[3:] for rank in range(4)]
    assert labels == [["trainer", "0"], ["trainer", "1"], ["generator", "0"], ["generator", "1"]]


def test_a_killed_second_generator_resumes_bit_exact(tmp_path: Path, two_by_two: RunPaths) -> None:
    """SIGKILL of generator 1 (rank 3, trainer 1's) after the first checkpoint, under the
    real torchrun: the job ends before torchrun would kill a survivor (trainer 0 sends no
    stop to generator 0 once the broadcast failed: it waits in that broadcast), and the
    resume (both generators rebuilt: hello and weights sent again) ends with the weights
    and optimizer of the uninterrupted 2 + 2 run."""
    seed = int(os.environ.get("GRPO_HPC_TEST_SEED", time.time_ns() % 10_000))
    rng = random.Random(seed)
    run = split_run(tmp_path, "killed-generator-1", *TWO_GENERATORS, *SLOW, nproc=4)
    log = tmp_path / "torchrun.log"
    proc = start(run, 4, log=log)
    try:
        pulse = _pulse(run, 3)
        assert pulse[3:] == ["generator", "1"], pulse
        _wait_for(run, rng.randint(2, 5), proc)
        time.sleep(rng.uniform(0.0, 0.3))
        os.kill(int(pulse[0]), signal.SIGKILL)
        t0 = time.monotonic()
        proc.wait(timeout=guard(120))  # the others fail on their own
        print(f"the job ended {time.monotonic() - t0:.1f} s after generator 1 was killed")
    finally:
        signal_job(proc.pid, signal.SIGKILL)
    assert FORCED_KILL not in log.read_text(), log.read_text()[-3000:]
    rec = read_progress(run.progress)
    assert rec is not None and rec.state != TrainState.FINISHED, (
        f"seed {seed}: the run finished before the kill; the test proved nothing"
    )
    result = train(run, 4, timeout=HANG_S)
    assert result.returncode == 0, result.stderr[-3000:]
    assert read_progress(run.progress).step == MAX_STEPS
    assert_same(_final_state(two_by_two, MAX_STEPS), _final_state(run, MAX_STEPS))


@pytest.mark.parametrize("victim", ["generator", "trainer"])
def test_a_killed_role_resumes_bit_exact(tmp_path: Path, reference: RunPaths, victim: str) -> None:
    """SIGKILL of one process (the generator: rank 1; the trainer: rank 0) after the first
    checkpoint, under the real torchrun; the job ends, the resume (the generator rebuilt
    from nothing: the weights are sent again, the batches generated ahead come from the
    trainer's checkpoint) ends with the weights and optimizer of the uninterrupted run."""
    seed = int(os.environ.get("GRPO_HPC_TEST_SEED", time.time_ns() % 10_000))
    rng = random.Random(seed)
    run = split_run(tmp_path, f"killed-{victim}", *SLOW)
    proc = start(run, 2)
    try:
        pid = int(_pulse(run, 1 if victim == "generator" else 0)[0])
        _wait_for(run, rng.randint(2, 5), proc)
        time.sleep(rng.uniform(0.0, 0.3))
        os.kill(pid, signal.SIGKILL)
        t0 = time.monotonic()
        proc.wait(timeout=guard(120))  # torchrun ends the other process
        print(f"the job ended {time.monotonic() - t0:.1f} s after the {victim} was killed")
    finally:
        signal_job(proc.pid, signal.SIGKILL)
    rec = read_progress(run.progress)
    assert rec is not None and rec.state != TrainState.FINISHED, (
        f"seed {seed}: the run finished before the kill; the test proved nothing"
    )
    result = train(run, 2)  # forked: the torchrun path is the killed run's
    assert result.returncode == 0, result.stderr[-3000:]
    assert read_progress(run.progress).step == MAX_STEPS
    assert_same(_final_state(reference, MAX_STEPS), _final_state(run, MAX_STEPS))


def test_a_stop_signal_saves_and_resumes_bit_exact(tmp_path: Path, reference: RunPaths) -> None:
    """SIGTERM to every process (Slurm's preemption): the generator finishes the batch in
    flight, the trainer saves the batches it received, exits 5 and stops the generator;
    resumed, the run ends equal to the uninterrupted one."""
    run = split_run(tmp_path, "stopped", *SLOW)
    proc = start(run, 2)
    try:
        _wait_for(run, 2, proc, checkpoint=False)
        signal_job(proc.pid, signal.SIGTERM)
        proc.wait(timeout=guard(120))
    finally:
        signal_job(proc.pid, signal.SIGKILL)
    rec = read_progress(run.progress)
    assert rec is not None and rec.exit_code == int(ExitCode.CHECKPOINTED), rec
    assert rec.step < MAX_STEPS, "the run finished before the stop; the test proved nothing"
    result = train(run, 2)
    assert result.returncode == 0, result.stderr[-3000:]
    assert_same(_final_state(reference, MAX_STEPS), _final_state(run, MAX_STEPS))


@pytest.mark.parametrize(("victim", "rank"), [("generator", 1), ("trainer", 0)])
def test_a_stopped_role_is_caught_and_named(tmp_path: Path, victim: str, rank: int) -> None:
    """SIGSTOP of the generator (a hung process; the trainer's watch catches it) or of the
    trainer (the generator's watch does): the job ends within dist.peer_timeout_s, exit 4,
    and progress.json names the role and the host. While the trainer waits on a stopped
    generator (its request, the weights' broadcast, a batch) it keeps its heartbeat: the
    monitor's heartbeat limit must not end the job first, unnamed."""
    timeout_s = 10
    run = split_run(tmp_path, f"hung-{victim}", *SLOW, f"dist.peer_timeout_s={timeout_s}")
    with training(run, nproc=2, timeout=240) as result:
        pid = int(_pulse(run, rank)[0])
        deadline = time.time() + 180
        while (rec := read_progress(run.progress)) is None or rec.step < 2:
            assert time.time() < deadline, "the run never reached step 2"
            time.sleep(0.05)
        os.kill(pid, signal.SIGSTOP)
        stopped, beats = time.time(), []
        try:  # trainer 0's heartbeats until the job's failure is recorded
            while (rec := read_progress(run.progress)).state != TrainState.FAILED:
                assert time.time() < stopped + 180, "the stopped role was never caught"
                beats.append(rec.heartbeat)
                time.sleep(0.2)
            done = result()
        finally:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert done.returncode == ExitCode.STALLED, done.stderr[-2000:]
    if victim == "generator":  # the trainer waits on it beating: its peers' watch names it
        assert max(beats) > stopped + timeout_s / 2, "no heartbeat while waiting on it"
    rec = read_progress(run.progress)
    assert rec.state == TrainState.FAILED and rec.step < MAX_STEPS
    said = (
        f"{victim} (rank {rank} on {HOST}) stopped answering (no pulse for {timeout_s} s) at step"
    )
    assert rec.reason.startswith(said), rec.reason


def test_a_stuck_generator_is_caught_by_its_progress_and_resumes_bit_exact(
    tmp_path: Path, reference: RunPaths
) -> None:
    """The generator's main thread stops working (``faults.stuck_generation_at_step``: it
    sleeps for ever as it starts a batch) while its pulse runs on, so the peers' watch sees
    nothing wrong and the trainer, waiting for the batch, beats its heartbeat: before
    ``rollout.progress_timeout_s`` nothing ended such a job. Now the trainer's watch sees
    the generator's progress still for the limit of its wait and ends the job, exit 4,
    progress.json naming the generator, its rank and host, how long, and what the trainer
    waited for; the resume from the last checkpoint (the fault off) ends with the weights
    and optimizer of the uninterrupted run."""
    run = split_run(tmp_path, "stuck-generator", *STUCK)
    with training(run, nproc=2, timeout=240) as result:
        done, ended = until_stalled(run, result)
    said = f"generator (rank 1 on {HOST}) made no progress for "
    waited = f"while trainer waited for step {STUCK_AT + 1}'s rollouts"
    check_stalled_then_resume(run, done, ended, said, waited, 2)
    assert_same(_final_state(reference, MAX_STEPS), _final_state(run, MAX_STEPS))


ROLLBACK = [
    "faults.enabled=true",
    "faults.zero_reward=true",  # flat groups: no signal, a collapse at step 2
    "training.collapse_window=2",
    "training.collapse_patience=2",
    "training.on_collapse=rollback",
    "training.max_steps=4",
]
"""test_async.py's rollback at step 2 (to the start)."""


def test_a_rollback_samples_what_the_thread_placements_rollback_samples(tmp_path: Path) -> None:
    """A collapse rolled back at step 2 in the split placement: the trainer drops the batch
    its generator made ahead from the abandoned weights and asks for step 3's from the
    restored ones (staleness 0), with the new seed, and from then on asks for each step's
    batch from the current weights (training.rollback_synchronous: staleness 0 at step 4
    too); every step samples what the thread placement's rollback of the same seed samples
    (its zero rewards train nothing, so the completions are the evidence), and the run
    ends as it ends."""
    thread, split = both_placements(tmp_path, *ROLLBACK, "algo.max_staleness=1")
    for run in (thread, split):
        assert collapse_actions(run)[:1] == [("ROLLBACK", 2)], collapse_actions(run)
        assert [r["staleness/max"] for r in _rows(run)] == [0, 1, 0, 0]
    assert _completions(split) == _completions(thread)
    assert_same(_final_state(split, 4), _final_state(thread, 4))


def _completions(run: RunPaths) -> list[tuple[int, str]]:
    """Each logged sample's step and completion (samples.jsonl)."""
    return [
        (r["step"], r["completion"]) for r in map(json.loads, run.samples.read_text().splitlines())
    ]
