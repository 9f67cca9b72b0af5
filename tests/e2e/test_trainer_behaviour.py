"""The real trainer (forked, or under torchrun): DDP/FSDP2, signals, breaker, stalls, bad input."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from grpo_hpc.core.errors import ExitCode
from grpo_hpc.core.paths import RunPaths
from grpo_hpc.core.progress import ProgressRecord, TrainState, read_progress

from ..slowdown import guard
from .helpers import make_run, signal_job, start, start_forked, train, train_side_by_side


def _metrics(paths) -> list[dict]:
    return [json.loads(line) for line in paths.metrics.read_text().splitlines()]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("strategy", "engine"), [("ddp", "hf"), ("fsdp", "hf"), ("fsdp", "native")]
)
def test_two_processes_train_and_checkpoint(tmp_path: Path, strategy: str, engine: str) -> None:
    # the DDP run also profiles its step 2 on both ranks (training.profile_steps)
    profile = ["training.profile_steps=1", "training.profile_from=2"] if strategy == "ddp" else []
    # the native FSDP run samples its slow phases' stacks (training.stall_sample_ms); its
    # step 4's update is made a second slower than the three before it (faults.stall_at_step)
    stalls = ["training.stall_sample_ms=5", "faults.enabled=true", "faults.stall_at_step=3"]
    stalls = stalls if engine == "native" else []
    # the other FSDP run binds each rank to its own CPUs (dist.bind_cpus)
    bind = ["dist.bind_cpus=true"] if (strategy, engine) == ("fsdp", "hf") else []
    paths = make_run(
        tmp_path,
        strategy,
        f"dist.strategy={strategy}",
        f"rollout.engine={engine}",
        "training.eval_every=2",
        *profile,
        *stalls,
        *bind,
        nproc=2,
    )
    # the DDP run goes through the real torchrun (the others are forked: trainer_fork.py)
    result = train(paths, nproc=2, torchrun=strategy == "ddp")
    assert result.returncode == 0, result.stderr[-3000:]
    bound = re.findall(r"\[Dist\] local rank (\d) of 2 bound to CPUs (\S+)", result.stdout)
    if bind:  # one line per rank, and (on 2 or more CPUs) shares apart
        assert sorted(r for r, _ in bound) == ["0", "1"], result.stdout[-2000:]
        assert len(os.sched_getaffinity(0)) < 2 or bound[0][1] != bound[1][1]
    else:
        assert not bound
    rec = read_progress(paths.progress)
    assert rec.state == TrainState.FINISHED and rec.step == rec.max_steps == 4
    assert paths.latest_checkpoint() == 4
    steps = [m for m in _metrics(paths) if "loss" in m]
    assert [m["step"] for m in steps] == [1, 2, 3, 4]
    assert all(m["completions"] == 8 for m in steps)  # 2 prompts x G=4, across both ranks
    assert any(m["grad_norm"] > 0 for m in steps)  # real gradients, not a no-op
    # each step's size and torch.compile's graph count (eager on a CPU: none built)
    trained = [m for m in steps if m["grad_norm"] > 0]
    assert all(0 < m["train/tokens"] and m["train/sequences"] <= 8 for m in trained)
    assert all(m["compile/graphs"] == 0 for m in steps)
    assert all(m["engine/captures"] == 0 for m in steps)  # no CUDA graphs on a CPU
    # every step starts with the scheduled young collection, timed
    # (train/supervision/gc_schedule.py)
    assert all(0 < m["time/gc"] < m["time/step"] for m in steps)
    # the update's wall in its parts: the host's CPU seconds and (no GPU) no sync waited for
    for m in trained:
        assert 0 < m["time/train_cpu_main"] <= m["time/train_cpu"] + 0.01
        assert m["time/train_sync"] == 0.0 and m["time/train"] > 0
        # a count of switches (test_profiling.py shows it counts them)
        assert m["train/descheduled"] == int(m["train/descheduled"]) >= 0
        # ... and by thread (Linux's schedstat): the groups add up to the process's seconds
        groups = m["time/train_cpu_main"] + sum(
            m[f"time/train_cpu_{g}"] for g in ("autograd", "python", "native")
        )
        assert abs(groups - m["time/train_cpu"]) < 0.05 + 0.1 * m["time/train_cpu"]
        assert m["time/train_waited"] >= m["time/train_waited_main"] >= 0
    assert any("eval/accuracy" in m for m in _metrics(paths))
    assert rec.clip_frac is not None  # progress.json carries the step's health too
    if profile:
        traces = sorted(p.name for p in paths.torch_profile.iterdir())
        assert traces == [f"rank{r}-steps2-2.{x}" for r in (0, 1) for x in ("json", "txt")]
        trace = json.loads((paths.torch_profile / "rank1-steps2-2.json").read_text())
        assert any(e.get("name") == "aten::mm" for e in trace["traceEvents"])  # the update
        table = (paths.torch_profile / "rank0-steps2-2.txt").read_text()
        assert "Self CPU time total" in table
        # the step in the trainer's own parts, each rank's (profiling.phase), listed first
        phases = table.split("\n\n")[0]
        for part in ("generate", "score", "vote", "update", "report"):
            assert re.search(rf"grpo/{part} +1 calls +[0-9.]+ ms", phases), phases
        assert any(e.get("name") == "grpo/vote" for e in trace["traceEvents"])
    # time/score_max: the slowest rank's scoring, at least rank 0's own; what math-verify
    # judged (the pre-judge settles plain numbers) and its slowest item
    assert all(m["time/score_max"] >= m["time/score"] > 0 for m in steps)
    # (a count, and a slowest item's time exactly where some item was judged)
    for m in steps:
        assert m["reward/verify_items"] == int(m["reward/verify_items"]) >= 0, m
        assert (m["reward/verify_items"] == 0) == (m["time/verify_slowest"] == 0), m
    assert all(m["time/verify_slowest"] <= m["time/score_max"] for m in steps)
    if stalls:  # step 4's update, a second past its median: each rank's stacks, this format
        found = sorted(p.name for p in paths.torch_profile.glob("stalls-rank*.txt"))
        assert found == ["stalls-rank0.txt", "stalls-rank1.txt"], found
        for r in (0, 1):
            text = (paths.torch_profile / f"stalls-rank{r}.txt").read_text()
            assert re.search(rf"^step 4 rank {r} grpo/update: [0-9.]+ s", text, re.M), text
            assert "in_update" in text  # the sampled stack: the fault's sleep, by name
    # Rank 0 writes the first completion of each of its groups (1 of 2 here) per step.
    samples = [json.loads(line) for line in paths.samples.read_text().splitlines()]
    assert [s["step"] for s in samples] == [1, 2, 3, 4]
    assert all(s["tokens"] > 0 and isinstance(s["completion"], str) for s in samples)
    if engine == "native":  # the engine reports log-probs: in fp32 it agrees with the trainer
        kls = [m["rollout/engine_kl"] for m in steps if "rollout/engine_kl" in m]
        assert kls and 0 <= max(kls) < 1e-3


def test_signal_checkpoints_and_exits_resubmit_me(tmp_path: Path) -> None:
    paths = make_run(tmp_path, "sig", "training.max_steps=1000", "training.save_every_steps=0")
    proc = start(paths)
    deadline = time.time() + 120
    while time.time() < deadline:
        rec = read_progress(paths.progress)
        if rec is not None and rec.step >= 2:
            break
        time.sleep(0.1)
    # Slurm's --signal=USR1@N reaches every process of the job step.
    signal_job(proc.pid, signal.SIGUSR1)
    proc.wait(timeout=guard(120))
    rec = read_progress(paths.progress)
    assert rec.state == TrainState.INTERRUPTED and rec.exit_code == ExitCode.CHECKPOINTED
    assert rec.last_checkpoint == paths.latest_checkpoint() == rec.step >= 2
    assert "SIGUSR1" in rec.reason


def test_zero_reward_trips_circuit_breaker(tmp_path: Path) -> None:
    paths = make_run(
        tmp_path,
        "zero",
        "faults.enabled=true",
        "faults.zero_reward=true",
        "training.zero_reward_patience=2",
        "training.max_steps=10",
    )
    result = train(paths)
    assert result.returncode == ExitCode.CIRCUIT_BREAKER
    rec = read_progress(paths.progress)
    assert rec.state == TrainState.FAILED and rec.exit_code == ExitCode.CIRCUIT_BREAKER
    assert rec.step == 2 and "mean reward was 0 for 2 consecutive steps" in rec.reason
    assert paths.latest_checkpoint() == 2  # saved before stopping


def test_generation_time_budget_fails_as_stalled(tmp_path: Path) -> None:
    paths = make_run(tmp_path, "slow", "rollout.generation_timeout_s=0.0")
    result = train(paths)
    assert result.returncode == ExitCode.STALLED
    rec = read_progress(paths.progress)
    assert rec.exit_code == ExitCode.STALLED and "generation_timeout_s" in rec.reason


def test_crash_is_recorded(tmp_path: Path) -> None:
    paths = make_run(tmp_path, "crash", "faults.enabled=true", "faults.crash_at_step=1")
    result = train(paths)
    assert result.returncode != 0
    rec = read_progress(paths.progress)
    assert rec.state == TrainState.FAILED and rec.exit_code == ExitCode.CRASH
    assert "crash at step 1" in rec.reason


def test_bad_dataset_is_a_config_error(tmp_path: Path) -> None:
    # Each kind of bad file and its line: tests/unit/tasks/test_dataset_errors.py (the
    # loader the trainer calls); here, what the trainer makes of one.
    source = _write(tmp_path / "bad.jsonl", '{"question": "q", "answer": "#### 1"}\n{oops\n')
    paths = make_run(tmp_path, "data", f"data.source={source}")
    result = train(paths)
    assert result.returncode == ExitCode.CONFIG_ERROR
    assert "bad.jsonl:2: not valid JSON" in read_progress(paths.progress).reason
    assert "grpo_hpc.train: error: " in result.stderr  # one line from the trainer...
    assert "ConfigError" not in result.stderr  # ...and no traceback of it (torchrun adds its own)


def test_missing_model_path_is_a_config_error(tmp_path: Path) -> None:
    paths = make_run(tmp_path, "model", f"model.name_or_path={tmp_path}/nope/model")
    result = train(paths)
    assert result.returncode == ExitCode.CONFIG_ERROR
    assert "cannot load model" in read_progress(paths.progress).reason


def test_reward_function_that_always_raises_is_a_config_error(tmp_path: Path) -> None:
    paths = make_run(tmp_path, "rfn", "reward.custom={'json:loads': 1.0}")
    result = train(paths)
    assert result.returncode == ExitCode.CONFIG_ERROR
    assert "json:loads" in read_progress(paths.progress).reason


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


ALGORITHM_OPTIONS = {
    # LoRA through peft (only the adapter is trained and checkpointed) + recomputation
    "lora-gradckpt": ("model.lora_rank=4", "model.gradient_checkpointing=true"),
    # KL to a frozen reference (k3) and two updates per batch from stored old log-probs
    "kl-multi-update": ("algo.beta=0.05", "algo.updates_per_batch=2", "algo.aggregation=sequence"),
    # DAPO dynamic sampling, Dr. GRPO advantages and normaliser
    "dynamic-drgrpo": (
        "rollout.dynamic_sampling=true",
        "algo.advantage=mean_only",
        "algo.aggregation=constant",
    ),
    # Packed micro-batches (a budget of a few rows each) through LoRA, the frozen
    # reference and the recompute
    "packing": (
        "algo.packing=true",
        "algo.micro_batch_tokens=700",
        "model.lora_rank=4",
        "algo.beta=0.05",
        "model.gradient_checkpointing=true",
    ),
}


def _selected(request: pytest.FixtureRequest, test: str, param: str) -> list:
    """The values of ``param`` of the session's selected items of ``test``, in order."""
    items = (i for i in request.session.items if getattr(i, "originalname", "") == test)
    return list(dict.fromkeys(i.callspec.params[param] for i in items))


@dataclass
class TrainAndResume:
    """A 2-step run, what it logged, then the same run resumed to step 3."""

    paths: RunPaths
    first: subprocess.CompletedProcess
    first_metrics: list[dict]
    again: subprocess.CompletedProcess | None = None


def _train_and_resume(paths: RunPaths) -> TrainAndResume:
    first = train(paths)
    runs = TrainAndResume(paths, first, _metrics(paths) if paths.metrics.exists() else [])
    if first.returncode == 0:
        text = paths.config.read_text().replace("max_steps: 2", "max_steps: 3")
        paths.config.write_text(text)
        runs.again = train(paths)
    return runs


@pytest.fixture(scope="module")
def algorithm_option_runs(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Future[TrainAndResume]]]:
    """Every selected option's train-and-resume, two at a time (one process each, two
    cores; the runs share nothing): each test then checks its own."""
    wanted = _selected(request, "test_algorithm_options_train_and_resume", "option")
    root = tmp_path_factory.mktemp("options")
    with ThreadPoolExecutor(max_workers=2) as pool:
        yield {
            name: pool.submit(
                _train_and_resume,
                make_run(
                    root / name,
                    "opt",
                    *ALGORITHM_OPTIONS[name],
                    "training.max_steps=2",
                    "training.save_every_steps=1",
                ),
            )
            for name in wanted
        }


@pytest.mark.slow
@pytest.mark.parametrize("option", list(ALGORITHM_OPTIONS))
def test_algorithm_options_train_and_resume(
    algorithm_option_runs: dict[str, Future[TrainAndResume]], option: str
) -> None:
    overrides = ALGORITHM_OPTIONS[option]
    runs = algorithm_option_runs[option].result()
    assert runs.first.returncode == 0, runs.first.stderr[-3000:]
    steps = [m for m in runs.first_metrics if "loss" in m]
    assert [m["step"] for m in steps] == [1, 2] and all(m["grad_norm"] > 0 for m in steps)
    if "algo.beta=0.05" in overrides:
        assert steps[1]["kl"] > 0  # the policy moved away from the reference after step 1
    # Resume continues from the last complete checkpoint with these options too.
    assert runs.again is not None and runs.again.returncode == 0, runs.again.stderr[-3000:]
    rec = read_progress(runs.paths.progress)
    assert (rec.step, rec.restarts, rec.start_step) == (3, 1, 2)


@pytest.mark.slow
def test_masked_truncated_completions_train_only_finished_ones(tmp_path: Path) -> None:
    """DAPO overlong filtering through the real trainer: the tiny model seldom ends within
    its 8 tokens: a step whose completions were all cut off takes a zero-gradient optimizer
    step and the run goes on (tests/e2e/test_trl_parity.py checks the gradient of a
    partly masked batch against TRL's)."""
    paths = make_run(tmp_path, "mask", "algo.mask_truncated=true", "training.max_steps=2")
    result = train(paths)
    assert result.returncode == 0, result.stderr[-3000:]
    steps = [m for m in _metrics(paths) if "loss" in m]
    assert [m["step"] for m in steps] == [1, 2]
    assert all(0 <= m["rollout/truncated"] <= 1 for m in steps)
    cut = [m for m in steps if m["rollout/truncated"] == 1]
    assert cut, steps  # the case under test happened (step 1, with the tests' seed)
    assert all(m["grad_norm"] == 0 and m["loss"] == 0 for m in cut), cut


def test_steps_that_train_nothing_trip_the_cut_off_breaker(tmp_path: Path) -> None:
    """With algo.mask_truncated, a run whose completions all run to the cap trains nothing;
    after training.cut_off_patience such steps in a row it stops (exit 3, checkpoint saved;
    ``on_collapse=stop``, the default rollback's last resort) and names the fix. The tiny
    model seldom ends within its 8 tokens."""
    paths = make_run(
        tmp_path,
        "cut",
        "algo.mask_truncated=true",
        "training.cut_off_patience=2",
        "training.on_collapse=stop",
        "training.max_steps=12",
    )
    result = train(paths)
    assert result.returncode == ExitCode.CIRCUIT_BREAKER, result.stderr[-3000:]
    cut = [m["rollout/truncated"] for m in _metrics(paths) if "loss" in m]
    # it stopped at the first step that ended two fully cut steps in a row
    first = next(i for i in range(1, len(cut)) if cut[i - 1] == cut[i] == 1.0)
    assert len(cut) == first + 1
    rec = read_progress(paths.progress)
    assert rec.state == TrainState.FAILED and rec.exit_code == ExitCode.CIRCUIT_BREAKER
    assert "for 2 consecutive steps" in rec.reason and "raise rollout.max_new_tokens" in rec.reason
    assert paths.latest_checkpoint() == rec.step == len(cut)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a process that sees no GPU")
def test_low_precision_without_a_gpu_exits_2(tmp_path: Path) -> None:
    """A bf16 run whose process sees no GPU stops at start-up (exit 2, one line), instead
    of training on the CPU in fp32 while the config says bf16."""
    paths = make_run(tmp_path, "nogpu", "training.max_steps=1")
    paths.config.write_text(paths.config.read_text().replace("precision: fp32", "precision: bf16"))
    result = train(paths)
    assert result.returncode == int(ExitCode.CONFIG_ERROR), result.stderr[-2000:]
    assert "sees no GPU" in result.stderr
    assert paths.latest_checkpoint() is None


@pytest.mark.slow
def test_selective_checkpointing_takes_the_same_first_step(tmp_path: Path) -> None:
    """Checkpointing one layer in two recomputes what it dropped: the first step (same
    state, same samples) has the loss and gradient norm of a run without checkpointing.
    (Later steps drift apart in the last bits: the backward sums gradients in another
    order, and one flipped sign of a near-zero gradient moves an Adam step by lr.)"""
    steps = ("training.max_steps=2", "model.tiny_layers=4")
    plain = make_run(tmp_path, "plain", *steps)
    half = make_run(
        tmp_path, "half", *steps, "model.gradient_checkpointing=true", "model.checkpoint_every=2"
    )
    train_side_by_side(plain, half)
    a, b = ([m for m in _metrics(p) if "loss" in m] for p in (plain, half))
    assert [m["step"] for m in b] == [1, 2]
    for key in ("loss", "grad_norm", "reward/mean"):
        assert b[0][key] == pytest.approx(a[0][key], rel=1e-5, abs=1e-7), key


def test_releasing_the_engine_before_each_update_changes_nothing(tmp_path: Path) -> None:
    """rollout.release_engine_memory frees the native engine's weights and caches before
    every update and rebuilds them at the next rollout (and evaluation): the run is the
    same, step for step."""
    steps = ("training.max_steps=3", "rollout.engine=native", "training.eval_every=2")
    kept = make_run(tmp_path, "kept", *steps)
    released = make_run(tmp_path, "released", *steps, "rollout.release_engine_memory=true")
    train_side_by_side(kept, released)
    a, b = ([m for m in _metrics(p) if "loss" in m] for p in (kept, released))
    assert [m["step"] for m in b] == [1, 2, 3]
    for key in ("loss", "grad_norm", "reward/mean", "rollout/logp_diff"):
        assert [m[key] for m in b] == [m[key] for m in a], key
    # Kept: one cache for the whole run. Released: rebuilt after every update, by the next
    # generation: step 2's rollout, then the evaluation after step 2 (whose cache step 3's
    # rollout uses; step 1's rollout uses the one of the evaluation at step 0).
    assert [m["engine/caches"] for m in a] == [1, 1, 1]
    assert [m["engine/caches"] for m in b] == [1, 2, 3]
    ev = [
        [m["eval/accuracy"] for m in _metrics(p) if "eval/accuracy" in m] for p in (kept, released)
    ]
    assert ev[0] and ev[0] == ev[1]


def _signal_while_evaluating(paths, step: int) -> None:  # noqa: ANN001
    # forked: the trainer's answer to a stop inside its evaluation is under test, not the
    # launch path (test_signal_checkpoints_and_exits_resubmit_me signals torchrun's worker)
    proc = start_forked(paths)
    deadline = time.time() + 240
    while time.time() < deadline:
        rec = read_progress(paths.progress)
        if rec is not None and rec.state == TrainState.EVALUATING and rec.step == step:
            break
        assert proc.poll() is None, "the trainer ended before that evaluation"
        time.sleep(0.02)
    else:
        raise AssertionError(f"no evaluation at step {step} within the deadline")
    signal_job(proc.pid, signal.SIGTERM)
    proc.wait(timeout=guard(120))


@dataclass
class StopAndResume:
    """A run stopped inside its evaluation at ``step``, what it left, then the next attempt."""

    paths: RunPaths
    stopped: ProgressRecord | None
    checkpoint: int | None
    logged: list[dict]
    again: subprocess.CompletedProcess


STOPPED_EVAL = 1500
"""Test problems the stopped attempt evaluates: enough chunks (8 prompts each) that the
signal lands inside the evaluation even on a fast machine; it stops at the next chunk."""
AGAIN_EVAL = 16
"""... and the next attempt: two chunks. It only has to finish the run (its evaluations at
steps 0 and 2 when nothing was saved); 1,500 problems there took two full evaluations."""


def _stop_in_evaluation_and_resume(paths: RunPaths, step: int) -> StopAndResume:
    _signal_while_evaluating(paths, step)
    stopped, checkpoint = read_progress(paths.progress), paths.latest_checkpoint()
    logged = _metrics(paths) if paths.metrics.exists() else []
    text = paths.config.read_text()
    assert f"num_eval: {STOPPED_EVAL}\n" in text
    paths.config.write_text(
        text.replace(f"num_eval: {STOPPED_EVAL}\n", f"num_eval: {AGAIN_EVAL}\n")
    )
    return StopAndResume(paths, stopped, checkpoint, logged, train(paths))


@pytest.fixture(scope="module")
def stopped_in_evaluation(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[int, Future[StopAndResume]]]:
    """Both stop-in-evaluation scenarios side by side (one process each, two cores; they
    share nothing): each test then checks its own."""
    wanted = _selected(
        request, "test_stop_during_evaluation_checkpoints_and_exits_resubmit_me", "step"
    )
    root = tmp_path_factory.mktemp("eval-stop")
    with ThreadPoolExecutor(max_workers=2) as pool:
        yield {
            step: pool.submit(
                _stop_in_evaluation_and_resume,
                make_run(
                    root,
                    f"eval{step}",
                    "training.max_steps=3",
                    "training.eval_every=2",
                    f"data.num_eval={STOPPED_EVAL}",
                    "data.num_val=0",  # the evaluation scores the test problems
                    "training.save_every_steps=5",
                ),
                step,
            )
            for step in wanted
        }


@pytest.mark.slow
@pytest.mark.parametrize("step", [0, 2])
def test_stop_during_evaluation_checkpoints_and_exits_resubmit_me(
    stopped_in_evaluation: dict[int, Future[StopAndResume]], step: int
) -> None:
    """A stop that lands in a long held-out evaluation drops the evaluation (the ranks
    agree between chunks) and is answered like any other: the step's checkpoint, exit 5;
    before step 1 there is nothing to save. It used to surface as a crash (exit 1)."""
    runs = stopped_in_evaluation[step].result()
    rec = runs.stopped
    assert rec is not None and rec.exit_code == int(ExitCode.CHECKPOINTED), rec
    assert rec.state == TrainState.INTERRUPTED
    assert runs.checkpoint == (step or None)
    evals = [m for m in runs.logged if "eval/accuracy" in m]
    assert all(m["step"] != step for m in evals)  # the cut evaluation logged nothing
    result = runs.again  # the next attempt finishes the run
    assert result.returncode == 0, result.stderr[-2000:]
    # ... evaluating where it had to: from step 0 at steps 0 and 2, from step 2's checkpoint
    # at none (step 3 is not evaluated); the cut one is in neither attempt's log
    evals = [m["step"] for m in _metrics(runs.paths) if "eval/accuracy" in m]
    assert evals == {0: [0, 2], 2: [0]}[step], evals
    rec = read_progress(runs.paths.progress)
    assert rec.state == TrainState.FINISHED and rec.step == 3, rec
