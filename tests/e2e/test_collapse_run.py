"""A real tiny run that stops learning, caught and acted on (training.on_collapse).

Under ``algo.mask_truncated`` the tiny model seldom ends within its 8 tokens, so nearly
every step trains nothing (zero gradient): the collapse detector's ``no_signal`` fires
once ``collapse_patience`` of the last ``collapse_window`` steps were such steps."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from grpo_hpc.core.best import BestRecord, write_best
from grpo_hpc.core.errors import ExitCode
from grpo_hpc.core.fsutil import read_jsonl
from grpo_hpc.core.paths import RunPaths
from grpo_hpc.core.progress import TrainState, read_progress
from grpo_hpc.core.runs import JobView
from grpo_hpc.monitor.decision import ActionKind, FailureClass, decide, history_from
from grpo_hpc.status.plot import plot_data
from grpo_hpc.status.view import collapse_flag

from .helpers import make_run, train

DEAD = ("algo.mask_truncated=true", "training.cut_off_patience=0", "training.collapse_window=2")


def _steps(paths: RunPaths) -> list[dict]:
    return [m for m in read_jsonl(paths.metrics) if "loss" in m]


def _collapses(paths: RunPaths) -> list[dict]:
    return [e for e in read_jsonl(paths.events) if e.get("phase") == "collapse"]


def _dead_from_the_start(paths: RunPaths, n: int) -> None:
    """The precondition: the first ``n`` steps trained nothing."""
    assert [m["grad_norm"] for m in _steps(paths)[:n]] == [0.0] * n, _steps(paths)


def test_a_flagged_collapse_is_an_event_a_status_flag_and_a_plot_line(tmp_path: Path) -> None:
    paths = make_run(tmp_path, "flag", *DEAD, "training.collapse_patience=2",
                     "training.on_collapse=flag", "training.max_steps=3")  # fmt: skip
    result = train(paths)
    assert result.returncode == 0, result.stderr[-3000:]
    _dead_from_the_start(paths, 2)
    (ev,) = _collapses(paths)  # reported once per attempt, though it holds on
    assert (ev["action"], ev["signal"], ev["step"]) == ("FLAG", "no_signal", 2)
    assert "2 of the last 2 steps trained nothing" in ev["reason"]
    assert "[Collapse] collapse (no_signal) at step 2" in result.stdout
    assert "runs like this often stall at the cap" in result.stdout  # said after step 1
    assert read_progress(paths.progress).state is TrainState.FINISHED
    assert collapse_flag(read_jsonl(paths.events)) == "no_signal@2 flag"
    assert plot_data(_steps(paths), [], events=read_jsonl(paths.events)).collapses == [
        (2, "no_signal: flag")
    ]


def test_a_stopped_collapse_ends_with_its_reason_and_is_never_resubmitted(tmp_path: Path) -> None:
    paths = make_run(
        tmp_path, "stop", *DEAD, "training.collapse_patience=2", "training.max_steps=6",
        "training.on_collapse=stop",
    )  # fmt: skip
    result = train(paths)
    assert result.returncode == ExitCode.CIRCUIT_BREAKER, result.stderr[-3000:]
    _dead_from_the_start(paths, 2)
    rec = read_progress(paths.progress)
    assert rec.state is TrainState.FAILED and rec.step == 2 and paths.latest_checkpoint() == 2
    assert rec.reason.startswith("collapse (no_signal) at step 2")
    assert "stopped (training.on_collapse=stop); checkpoint saved" in rec.reason
    assert "max_staleness" not in rec.reason  # synchronous: nothing to say of staleness
    assert f"the model to hand on in {paths.final}" in rec.reason  # no evaluation: the last
    assert (paths.final / "config.json").is_file()
    (ev,) = _collapses(paths)
    assert ev["action"] == "STOP" and ev["job_id"] == str(rec.job_id)
    job = JobView(job_id=str(rec.job_id), state="COMPLETED", submitted_at=rec.started_at)
    history = history_from(read_jsonl(paths.events), [{"job_id": str(rec.job_id)}])
    action = decide(rec, job, history, rec.heartbeat + 60)
    assert (action.kind, action.failure_class) == (ActionKind.STOP, FailureClass.COLLAPSED)


def test_an_asynchronous_stop_names_the_synchronous_step(tmp_path: Path) -> None:
    """The same stop in an asynchronous run (algo.max_staleness=1) says, in progress.json
    (what grpo-status and the monitor read) and in its event, that asynchronous runs stalled
    more often on the learning benchmark and that algo.max_staleness=0 may learn."""
    paths = make_run(
        tmp_path, "stop-async", *DEAD, "training.collapse_patience=2", "training.max_steps=6",
        "training.on_collapse=stop", "algo.max_staleness=1",
    )  # fmt: skip
    result = train(paths)
    assert result.returncode == ExitCode.CIRCUIT_BREAKER, result.stderr[-3000:]
    rec = read_progress(paths.progress)
    assert rec.state is TrainState.FAILED and rec.step == 2
    hint = "the run is asynchronous (algo.max_staleness=1)"
    assert hint in rec.reason and rec.reason.endswith("algo.max_staleness=0 may learn")
    (ev,) = _collapses(paths)
    assert ev["action"] == "STOP" and hint in ev["reason"]


def _adam_steps(paths: RunPaths, step: int) -> set[float]:
    optim = torch.load(paths.checkpoint(step) / "optim.pt", weights_only=False)
    return {float(st["step"]) for st in optim["state"].values()}


def test_rollback_goes_back_to_the_best_checkpoint_with_a_new_seed(tmp_path: Path) -> None:
    """The best checkpoint (step 2, named in best.json as keep-best writes it) is loaded at
    the step-4 collapse: its optimizer, 2 steps old, is 4 steps old at step 6, not 6. The
    rollback is an event, and the checkpoint of its step carries its count and seed, so a
    resumed run knows them. (With the retry spent, a next collapse stops: the action table
    in tests/unit/train/supervision/test_collapse.py.)"""
    paths = make_run(tmp_path, "rb", *DEAD, "training.collapse_window=4",
                     "training.collapse_patience=4", "training.on_collapse=rollback",
                     "training.collapse_retries=1", "training.max_steps=6",
                     "training.keep_last=5")  # fmt: skip
    write_best(paths.root, BestRecord(step=2, metric="accuracy", score=0.5, checkpoint="step-2"))
    result = train(paths)
    assert result.returncode == 0, result.stderr[-3000:]
    _dead_from_the_start(paths, 4)
    (rollback,) = _collapses(paths)
    assert (rollback["action"], rollback["step"], rollback["to_step"]) == ("ROLLBACK", 4, 2)
    assert rollback["seed"] == 1000
    assert "rollback 1/1 to step 2 (best checkpoint)" in rollback["reason"]
    assert "[Collapse] collapse (no_signal) at step 4" in result.stdout
    state = torch.load(paths.checkpoint(4) / "trainer.pt", weights_only=False)
    assert state["collapse"]["rollbacks"] == 1 and state["collapse"]["seed"] == 1000
    assert _adam_steps(paths, 2) == {2.0} and _adam_steps(paths, 6) == {4.0}
    assert "rollback 1/1" in (read_progress(paths.progress).reason or "")


@pytest.mark.parametrize(
    ("mode", "at"),
    [
        (["algo.max_staleness=0"], 2),
        (["algo.max_staleness=1"], 2),
        # partial rollouts end too; the pool's first step cuts fewer rows, so the
        # collapse comes a step later (saved there, as the others at 2)
        (["algo.max_staleness=2", "rollout.partial_pool=2", "training.save_every_steps=3"], 3),
    ],
    ids=["sync", "async", "partial"],
)
def test_a_run_resumed_after_a_rollback_goes_on_as_if_never_stopped(
    tmp_path: Path, mode: list[str], at: int
) -> None:
    """Rolled back to the start at step ``at`` (checkpointed with its count, seed and fresh
    optimizer), killed at the start of the next step, resumed: the two steps after and the
    final weights equal those of a run that was never stopped, to the bit. Asynchronous
    (staleness 1, or 2 with partial rollouts), the rollback also made the run synchronous
    (training.rollback_synchronous; partial rollouts dropped their pool): the checkpoint
    says so, and the resumed run goes on synchronously."""
    staleness, end = int(mode[0].rsplit("=", 1)[1]), at + 2
    args = (*DEAD, "training.collapse_patience=2", "training.on_collapse=rollback",
            f"training.max_steps={end}", "faults.enabled=true", *mode)  # fmt: skip
    whole = make_run(tmp_path, "whole", *args)
    cut = make_run(tmp_path, "cut", *args, f"faults.crash_at_step={at}")
    assert train(whole).returncode == 0
    assert train(cut).returncode != 0 and cut.latest_checkpoint() == at
    (ev,) = _collapses(cut)  # before the crash: no best.json, so back to the start
    assert (ev["action"], ev["step"], ev["to_step"], ev["seed"]) == ("ROLLBACK", at, 0, 1000)
    assert "to step 0 (the start)" in ev["reason"]
    assert _adam_steps(cut, at) == {0.0}  # the starting weights with a fresh optimizer
    state = torch.load(cut.checkpoint(at) / "trainer.pt", weights_only=False)
    assert state["collapse"]["synchronous"] == bool(staleness)
    crash = f"crash_at_step: {at}"
    cut.config.write_text(cut.config.read_text().replace(crash, "crash_at_step: -1"))
    result = train(cut)
    assert result.returncode == 0, result.stderr[-3000:]
    keys = ("reward/mean", "loss", "grad_norm", "rollout/truncated")
    tail = [[m.get(k) for k in keys] for m in _steps(cut) if m["step"] > at]
    assert tail == [[m.get(k) for k in keys] for m in _steps(whole) if m["step"] > at]
    if staleness:  # synchronous after the rollback, in the resumed run as in the whole one
        assert [m["staleness/max"] for m in _steps(cut) if m["step"] > at] == [0, 0]
        assert not any("partial/pool_groups" in m for m in _steps(cut) if m["step"] > at)
    assert [e["seed"] for e in _collapses(cut)] == [e["seed"] for e in _collapses(whole)]
    a = torch.load(whole.checkpoint(end) / "model.pt", weights_only=False)
    b = torch.load(cut.checkpoint(end) / "model.pt", weights_only=False)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_two_sharded_ranks_roll_back_together(tmp_path: Path) -> None:
    """FSDP2 over two processes: both ranks agree on the verdict (one all-reduce), load the
    starting weights into their shards and go on with the same new seed; one event, written
    by rank 0, and the run finishes its step budget."""
    paths = make_run(tmp_path, "rb2", *DEAD, "training.collapse_patience=2",
                     "training.on_collapse=rollback", "training.max_steps=3",
                     "dist.strategy=fsdp", nproc=2)  # fmt: skip
    result = train(paths, nproc=2)
    assert result.returncode == 0, result.stderr[-3000:]
    _dead_from_the_start(paths, 2)
    (ev,) = _collapses(paths)
    assert (ev["action"], ev["step"], ev["to_step"], ev["seed"]) == ("ROLLBACK", 2, 0, 1000)
    assert [m["step"] for m in _steps(paths)] == [1, 2, 3]
    assert read_progress(paths.progress).state is TrainState.FINISHED


SOLVED = (
    "reward.correctness=0.0",
    "reward.custom={'grpo_hpc.train.rewards.toy:digit_fraction': 0.0, "
    "'grpo_hpc.train.rewards.toy:always_right': 1.0}",
    "training.collapse_window=3",
    "training.collapse_patience=3",
    "training.max_steps=10",  # before: rolled back at steps 3 and 6, stopped at 9 (exit 3)
)


def test_a_solved_task_finishes_with_its_model_and_is_never_rolled_back(tmp_path: Path) -> None:
    """Every completion earns the full reward: every group is flat at the top, every
    gradient zero. With the default on_collapse=rollback this was read as no_signal, rolled
    back twice and ended FAILED (exit 3); a solved task ends FINISHED, its model handed over."""
    paths = make_run(tmp_path, "solved", *SOLVED)
    result = train(paths)
    assert result.returncode == 0, result.stderr[-3000:]
    steps = _steps(paths)
    assert [(m["rollout/solved"], m["grad_norm"]) for m in steps] == [(1.0, 0.0)] * 3
    rec = read_progress(paths.progress)
    assert rec.state is TrainState.FINISHED and rec.step == 3 and rec.exit_code == 0
    assert (rec.reason or "").startswith("task solved at step 3: 3 of the last 3 steps")
    events = read_jsonl(paths.events)
    assert _collapses(paths) == []  # no rollback, no collapse
    (ev,) = [e for e in events if e.get("phase") == "solved"]
    assert (ev["action"], ev["signal"], ev["step"]) == ("FINISH", "solved", 3)
    assert "[Solved] task solved at step 3" in result.stdout
    assert (paths.final / "config.json").is_file() and paths.latest_checkpoint() == 3
    assert collapse_flag(events) == "solved@3 finish"


def test_a_collapse_stop_on_two_ranks_keeps_its_slow_export(tmp_path: Path) -> None:
    """Two ranks under torchrun stop for a collapse; rank 0's export of final/ takes longer
    than torchrun's 30 s grace. Rank 1 used to exit at once (exit 3), and torchrun then
    killed rank 0 in the middle of the export: no final/. Every rank now waits for it."""
    paths = make_run(tmp_path, "stop2", *DEAD, "training.collapse_patience=2",
                     "training.max_steps=6", "training.on_collapse=stop",
                     "faults.enabled=true", "faults.slow_export=35", nproc=2)  # fmt: skip
    result = train(paths, nproc=2, torchrun=True)
    assert result.returncode == ExitCode.CIRCUIT_BREAKER, result.stderr[-3000:]
    rec = read_progress(paths.progress)
    assert rec.state is TrainState.FAILED and rec.exit_code == ExitCode.CIRCUIT_BREAKER
    assert (rec.reason or "").startswith("collapse (no_signal) at step 2")
    assert (paths.final / "config.json").is_file(), list(paths.root.iterdir())
    assert "[Export] final model:" in result.stdout


def test_without_a_validation_split_the_test_problems_steer_nothing(tmp_path: Path) -> None:
    """data.num_val=0: the evaluation scores the test problems. They used to feed the
    collapse watch (eval_drop, reward_hacking: the reported figure then selected rollbacks);
    now no decision reads them, and the run says so at its start."""
    paths = make_run(tmp_path, "noval", "data.num_val=0", "training.eval_every=1",
                     "training.max_steps=2")  # fmt: skip
    result = train(paths)
    assert result.returncode == 0, result.stderr[-3000:]
    evals = [m for m in read_jsonl(paths.metrics) if "eval/accuracy" in m]
    assert [m["step"] for m in evals] == [0, 1, 2]  # the test problems were scored
    state = torch.load(paths.checkpoint(2) / "trainer.pt", weights_only=False)
    assert not state["collapse"]["watch"]["evals"]  # and no decision saw them
    assert "[Eval] no validation split (data.num_val=0)" in result.stdout
    assert not paths.best.exists()


def test_a_rollback_for_a_collapse_at_the_cap_raises_the_rollouts_cap(tmp_path: Path) -> None:
    """Every completion ran to the tiny config's 8 tokens (``all_cut``): the rollback
    doubles the rollouts' cap (``training.rollback_cap_growth``), said in its event; the
    next rollouts run past 8 tokens, up to 16, and a resumed run keeps 16 (evaluations keep
    8: tests/unit/train/rollout/test_native_engine.py)."""
    args = ("algo.mask_truncated=true", "training.cut_off_patience=1",
            "training.collapse_patience=0", "training.collapse_window=2",
            "training.max_steps=4", "faults.enabled=true", "faults.crash_at_step=3")  # fmt: skip
    paths = make_run(tmp_path, "cap", *args)
    assert train(paths).returncode != 0 and paths.latest_checkpoint() == 2
    state = torch.load(paths.checkpoint(2) / "trainer.pt", weights_only=False)
    assert state["collapse"]["cap"] == 16
    (ev,) = _collapses(paths)
    assert (ev["signal"], ev["action"], ev["step"], ev["cap"]) == ("all_cut", "ROLLBACK", 1, 16)
    assert "rollouts' cap raised 8 -> 16 tokens" in ev["reason"]
    assert "evaluations keep 8" in ev["reason"]
    paths.config.write_text(
        paths.config.read_text().replace("crash_at_step: 3", "crash_at_step: -1")
    )
    result = train(paths)
    assert result.returncode == 0, result.stderr[-3000:]
    mean = {m["step"]: m["gen_len/mean"] for m in _steps(paths)}  # steps 3-4: resumed
    assert mean[1] <= 8 and all(8 < mean[s] <= 16 for s in (2, 3, 4)), mean
