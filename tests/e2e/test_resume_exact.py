"""Exactness: SIGKILL at a random moment + resume == never interrupted, bit for bit."""

from __future__ import annotations

import os
import random
import signal
import time
from pathlib import Path

import pytest
import torch

from grpo_hpc.core.errors import ExitCode
from grpo_hpc.core.paths import RunPaths
from grpo_hpc.core.progress import TrainState, read_progress
from grpo_hpc.train.state import state_digest

from ..slowdown import guard
from .helpers import (
    assert_same,
    descendants,
    make_run,
    signal_job,
    start,
    start_forked,
    train,
    training,
)

# The kill lands after a random step past the first checkpoint (KILL_AFTER) and a random
# fraction of a second more (KILL_WITHIN_S): in a later step or inside a save. Enough steps
# that it lands mid-run even on a fast, idle machine (a tiny step takes ~0.05-0.1 s: the
# last kill point, step 8 + 0.25 s, is step 13 at most), few enough that the three runs
# (reference, killed, resumed) are short (it was 40 steps and a kill within 1.5 s of the
# first checkpoint: on a loaded machine, kill points in the same few steps as now).
MAX_STEPS = 16
KILL_AFTER = (4, 8)
KILL_WITHIN_S = 0.25
STEPS = [f"training.max_steps={MAX_STEPS}", "training.save_every_steps=4", "training.keep_last=1"]


def _final_state(paths, step: int) -> tuple[dict, dict]:
    ckpt = paths.checkpoint(step)
    return (
        torch.load(ckpt / "model.pt", weights_only=False),
        torch.load(ckpt / "optim.pt", weights_only=False),
    )


def _kill_after_first_checkpoint(paths, nproc: int, rng: random.Random) -> None:
    # two processes: under the real torchrun, as Slurm's kill meets it; one process: forked
    # (the trainer's state is what is under test; ~7 s of CPU less, see start_forked)
    proc = start(paths, nproc) if nproc > 1 else start_forked(paths)
    after = rng.randint(*KILL_AFTER)
    deadline = time.time() + 240

    def reached() -> bool:
        rec = read_progress(paths.progress)
        return paths.latest_checkpoint() is not None and rec is not None and rec.step >= after

    while not reached() and time.time() < deadline:
        assert proc.poll() is None, f"trainer exited before step {after}"
        time.sleep(0.02)
    assert reached(), f"no checkpoint and step {after} within the deadline"
    time.sleep(rng.uniform(0.0, KILL_WITHIN_S))  # somewhere in a later step, or inside a save
    signal_job(proc.pid, signal.SIGKILL)
    proc.wait()


def _kill_and_resume(run, nproc: int, rng: random.Random, seed: int) -> None:
    _kill_after_first_checkpoint(run, nproc, rng)
    killed_at = read_progress(run.progress)
    assert killed_at is not None and killed_at.state != TrainState.FINISHED, (
        f"seed {seed}: the run finished before the kill; the test proved nothing"
    )
    result = train(run, nproc)
    assert result.returncode == 0, result.stderr[-2000:]


def check_kill_and_resume(tmp_path: Path, steps: list[str], nproc: int) -> RunPaths:
    """A run of ``steps`` SIGKILLed at a random moment after its first checkpoint (the seed
    from GRPO_HPC_TEST_SEED, else the clock, said on failure) and resumed ends with the
    weights and optimizer of an uninterrupted run of the same seed, bit for bit, and every
    rank's state digest equals its checkpoint's; returns the killed run."""
    seed = int(os.environ.get("GRPO_HPC_TEST_SEED", time.time_ns() % 10_000))
    rng = random.Random(seed)
    ref = make_run(tmp_path, "uninterrupted", *steps, nproc=nproc)
    # the killed run also writes state digests (bench/faults/gpu_run.py judges GPU resumes by
    # them): here they must agree with the bit-exact comparison below, and change nothing
    digests = ["faults.enabled=true", "faults.state_digest=true"]
    run = make_run(tmp_path, "killed", *steps, *digests, nproc=nproc)
    if nproc > 1:  # two runs of two processes on two cores: one after the other is quicker
        assert train(ref, nproc).returncode == 0
        _kill_and_resume(run, nproc, rng, seed)
    else:  # the reference runs beside the killed and resumed runs (it shares nothing)
        with training(ref) as ref_result:
            _kill_and_resume(run, nproc, rng, seed)
            assert ref_result().returncode == 0
    rec = read_progress(run.progress)
    assert rec.state == TrainState.FINISHED and rec.restarts == 1 and rec.step == MAX_STEPS
    assert_same(_final_state(ref, MAX_STEPS), _final_state(run, MAX_STEPS))
    resumed, differ = state_digest.compare_folder(run.state_digest)
    assert resumed == nproc and differ == [], differ  # every rank resumed what was saved
    return run


@pytest.mark.slow
@pytest.mark.parametrize(("nproc", "engine"), [(1, "hf"), (1, "native"), (2, "native")])
def test_kill_and_resume_is_bit_exact(tmp_path: Path, nproc: int, engine: str) -> None:
    check_kill_and_resume(tmp_path, [*STEPS, f"rollout.engine={engine}"], nproc)


@pytest.mark.slow
def test_restart_from_step0_same_state(tmp_path: Path) -> None:
    """An attempt killed inside its first checkpoint save leaves no checkpoint: the next one
    starts again from step 0, and must be in the same state as the first one was. The first
    attempt builds the random ``tiny`` model (drawing from the seeded generator), a later one
    loads it from the run directory and draws nothing: without a reseed after the model is
    built or loaded, step 1 already sampled different completions."""
    steps = ["training.max_steps=4", "training.save_every_steps=2", "training.keep_last=1"]
    slow = ["faults.enabled=true", "faults.slow_save=3"]  # a save that can be killed inside
    ref = make_run(tmp_path, "uninterrupted", *steps, *slow)
    run = make_run(tmp_path, "killed", *steps, *slow)
    with training(ref) as ref_result:  # beside the killed and resumed runs: shares nothing
        proc = start_forked(run)
        inside = run.checkpoint_tmp(2) / "trainer.pt"  # written just before the slow part
        deadline = time.time() + 240
        while not inside.exists() and time.time() < deadline:
            assert proc.poll() is None, "trainer exited before its first checkpoint"
            time.sleep(0.05)
        assert inside.exists(), "the first save never began within the deadline"
        signal_job(proc.pid, signal.SIGKILL)
        proc.wait()
        assert run.latest_checkpoint() is None, "the kill missed the first save"
        result = train(run)
        assert result.returncode == 0, result.stderr[-2000:]
        assert ref_result().returncode == 0
    rec = read_progress(run.progress)
    assert rec.state == TrainState.FINISHED and rec.attempt == 1 and rec.step == 4
    assert_same(_final_state(ref, 4), _final_state(run, 4))


@pytest.mark.slow
def test_stop_before_step1_saves_nothing_and_resumes_exact(tmp_path: Path) -> None:
    """A stop that lands after start-up but before step 1 (here inside a hung first
    generation, as when the monitor cancels a stalled or hung-rank job) used to save a
    step-0 checkpoint. Saving calls torch's get_state_dict, which fills the still-empty
    AdamW state with a zero-gradient step: the resumed run was one Adam step ahead and its
    weights differed from step 2 on (campaign trials 16 and 56, hang_rank on two nodes)."""
    steps = ["training.max_steps=3", "training.save_every_steps=1", "training.keep_last=1"]
    ref = make_run(tmp_path, "uninterrupted", *steps)
    run = make_run(tmp_path, "stopped", *steps, "faults.enabled=true", "faults.hang_at_step=0")
    with training(ref) as ref_result:  # beside the stopped and resumed runs: shares nothing
        proc = start_forked(run)
        deadline = time.time() + 240
        while time.time() < deadline:
            rec = read_progress(run.progress)
            if rec is not None and rec.state == TrainState.GENERATING and rec.step == 0:
                break
            assert proc.poll() is None, "trainer exited before its first generation"
            time.sleep(0.05)
        else:
            raise AssertionError("the first generation never began within the deadline")
        time.sleep(0.5)  # inside the hang (it never ends by itself: no race)
        signal_job(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=guard(120)) is not None
        rec = read_progress(run.progress)
        assert rec is not None and rec.exit_code == int(ExitCode.CHECKPOINTED), rec
        assert run.latest_checkpoint() is None, "a step-0 checkpoint was saved"
        text = run.config.read_text()
        run.config.write_text(text.replace("hang_at_step: 0", "hang_at_step: -1"))
        result = train(run)
        assert result.returncode == 0, result.stderr[-2000:]
        assert ref_result().returncode == 0
    assert_same(_final_state(ref, 3), _final_state(run, 3))


def _rank0_worker(torchrun_pid: int) -> int:
    """The pid of the RANK=0 trainer (a direct child of torchrun; its forked helpers share
    its command line and environment but not its parent)."""
    for pid in descendants(torchrun_pid):
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if b"RANK=0" in env and int(stat[1]) == torchrun_pid:
            return pid
    raise AssertionError("no rank-0 trainer under torchrun")


@pytest.mark.slow
def test_stop_reaching_one_rank_mid_generation_is_agreed(tmp_path: Path) -> None:
    """A signal that reaches one rank while it generates (the other finishes its rollout
    unaware) must stop both at the same point: ranks agree on the abort at the collective
    after generation. Rank 0 used to abandon the step and start saving while rank 1 went on
    into the step's next collective; the resumed run must equal the uninterrupted one."""
    # step 2's stop saves step 1; the resumed run trains steps 2 and 3 (the step the ranks
    # abandoned, and one more past the saved optimizer state). 96 new tokens (the tiny
    # model rarely ends early; it was 192): still a generation of ~0.6 s on a fast, idle
    # machine, against the 0.01 s poll that sends the signal once it has begun
    steps = ["training.max_steps=3", "training.save_every_steps=2", "rollout.max_new_tokens=96"]
    ref = make_run(tmp_path, "ref", *steps, nproc=2)
    assert train(ref, 2).returncode == 0
    run = make_run(tmp_path, "one-rank", *steps, nproc=2)
    proc = start(run, 2)
    deadline = time.time() + 240
    while time.time() < deadline:
        rec = read_progress(run.progress)
        if rec is not None and rec.state == TrainState.GENERATING and rec.step == 1:
            break  # step 2 is generating; its stop must save (no checkpoint of step 1)
        assert proc.poll() is None, "the run ended before step 2's generation"
        time.sleep(0.01)
    else:
        raise AssertionError("step 2's generation never began within the deadline")
    os.kill(_rank0_worker(proc.pid), signal.SIGTERM)  # rank 1 is not told
    proc.wait(timeout=guard(180))
    rec = read_progress(run.progress)
    assert rec is not None and rec.exit_code == int(ExitCode.CHECKPOINTED), rec
    assert rec.state == TrainState.INTERRUPTED and rec.step == 1
    result = train(run, 2)
    assert result.returncode == 0, result.stderr[-2000:]
    assert_same(_final_state(ref, 3), _final_state(run, 3))
