"""grpo-status: rows from synthetic run directories, rendered into a StringIO console."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import re
import sys
import time
from pathlib import Path

import pytest
from rich.console import Console

from grpo_hpc.cli import status
from grpo_hpc.core.fsutil import append_jsonl, tail_jsonl
from grpo_hpc.core.paths import RunPaths
from grpo_hpc.core.progress import ProgressRecord, TrainState, write_progress
from grpo_hpc.core.runs import SlurmView
from grpo_hpc.core.slurm import JobRecord
from grpo_hpc.status import view as status_view
from grpo_hpc.status.report import collect_detail, collect_rows
from grpo_hpc.status.termviz import fmt_age, sparkline, step_bar, text_plot
from grpo_hpc.status.view import RunRow, _eta, build_details, build_table, row_flags
from tests.conftest import REPO, make_checkpoint

NOW = 1_700_000_000.0


def render(renderable: object) -> str:
    console = Console(file=io.StringIO(), width=160, color_system=None)
    console.print(renderable)
    return console.file.getvalue()


def make_run(
    root: Path,
    name: str,
    job_id: str,
    executor: str = "slurm",
    progress: dict | None = None,
    rewards: list[float] | None = None,
    events: list[dict] | None = None,
) -> RunPaths:
    paths = RunPaths(root / name)
    paths.root.mkdir(parents=True)
    append_jsonl(
        paths.jobs,
        {
            "job_id": job_id,
            "attempt": 0,
            "submitted_at": NOW - 7200,
            "reason": "initial submission",
            "profile": "h100x2",
            "executor": executor,
        },
    )
    if progress is not None:
        base = dict(
            run=name,
            job_id=job_id,
            state=TrainState.TRAINING,
            step=40,
            max_steps=100,
            heartbeat=NOW - 5,
            started_at=NOW - 600,
            reward_mean=0.5,
            kl=0.0123,
            tokens_per_s=1234.0,
        )
        write_progress(paths.progress, ProgressRecord(**{**base, **progress}))
    for i, r in enumerate(rewards or []):
        append_jsonl(
            paths.metrics,
            {
                "step": i + 1,
                "reward/mean": r,
                "reward/correctness": r,
                "kl": 0.01,
                "loss": 0.1,
                "tokens_per_s": 1000.0,
                "time/step": 2.0,
            },
        )
    for ev in events or []:
        append_jsonl(paths.events, {"time": NOW - 60, "job_id": job_id, "phase": "decision", **ev})
    return paths


SLURM = {
    "101": "RUNNING",
    "102": "RUNNING",
    "103": "RUNNING",
    "104": "COMPLETED",
    "105": "FAILED",
    "106": "FAILED",
    "107": "PENDING",
}


def fake_query(ids: list[str]) -> SlurmView:
    assert sorted(ids) == sorted(SLURM)  # one call for all runs
    nodes = {"101": "grpo-n[1-2]", "104": "localhost"}
    return SlurmView({j: JobRecord(j, SLURM[j], nodes=nodes.get(j)) for j in ids}, set())


@pytest.fixture
def logs(tmp_path: Path) -> Path:
    up = [0.1, 0.2, 0.3, 0.4, 0.5]
    make_run(tmp_path, "a-running", "101", progress={}, rewards=up)
    make_run(tmp_path, "b-stalled", "102", progress={"heartbeat": NOW - 3600}, rewards=up)
    make_run(tmp_path, "c-zero", "103", progress={"reward_mean": 0.0}, rewards=[0.0] * 6)
    done = {"state": TrainState.FINISHED, "step": 100, "exit_code": 0, "last_checkpoint": 100}
    make_run(tmp_path, "d-finished", "104", progress=done, rewards=up)
    cb = {"state": TrainState.FAILED, "exit_code": 3, "reason": "zero reward for 20 steps"}
    stop = {"action": "STOP", "class": "circuit_breaker", "reason": "circuit_breaker at step 40"}
    make_run(tmp_path, "e-breaker", "105", progress=cb, events=[stop])
    crash = {"state": TrainState.FAILED, "exit_code": 1}
    spent = {"action": "STOP", "class": "budget_exhausted", "reason": "retry budget exhausted"}
    make_run(tmp_path, "f-budget", "106", progress=crash, events=[spent])
    make_run(tmp_path, "g-new", "107")
    return tmp_path


def line_of(text: str, run: str) -> str:
    return next(line for line in text.splitlines() if line.strip().startswith(run))


def test_table_shows_each_state(logs: Path) -> None:
    rows = collect_rows(logs, query=fake_query)
    assert [r.run for r in rows] == sorted(r.run for r in rows) and len(rows) == 7
    text = render(build_table(rows, NOW))
    assert "grpo runs: 7" in text
    for col in ("RUN", "SLURM", "NODES", "TRAIN", "STEP", "REWARD", "TOK/S", "HB", "ETA", "FLAG"):
        assert col in text
    ok = line_of(text, "a-running")
    assert "RUNNING" in ok and "training" in ok and "40/100 ███░░░░░" in ok
    assert re.search(r"RUNNING +grpo-n\[1-2\] +training", ok)
    assert re.search(r"COMPLETED +localhost +finished", line_of(text, "d-finished"))
    assert re.search(r"PENDING +- +no progress", line_of(text, "g-new"))
    assert "0.500 ▁▂▄▆█" in ok and "0.0123" in ok and "1234" in ok and "h100x2" in ok
    assert "5s" in ok and "2m" in ok  # heartbeat age; ETA = 60 steps * 2 s
    assert "stalled 60m" in line_of(text, "b-stalled")
    assert "zero reward" in line_of(text, "c-zero")
    fin = line_of(text, "d-finished")
    assert "COMPLETED" in fin and "finished" in fin and "100/100 ████████" in fin
    assert "stopped: circuit_breaker" in line_of(text, "e-breaker")
    assert "budget exhausted" in line_of(text, "f-budget")
    new = line_of(text, "g-new")
    assert "PENDING" in new and "no progress" in new
    styles = {r.run: status_view._style(row_flags(r, NOW), r) for r in rows}
    assert styles == {
        "a-running": "",
        "b-stalled": "red",
        "c-zero": "yellow",
        "d-finished": "green",
        "e-breaker": "red",
        "f-budget": "red",
        "g-new": "",
    }


def test_row_flags_rules() -> None:
    base = dict(run="r", slurm_state="RUNNING", train_state="generating", heartbeat=NOW - 700)
    assert row_flags(RunRow(**base), NOW) == ["stalled 12m"]
    assert row_flags(RunRow(**base), NOW, heartbeat_timeout_s=900) == []
    pending = {**base, "slurm_state": "PENDING"}  # an old heartbeat of a queued job is fine
    assert row_flags(RunRow(**pending), NOW) == []
    assert row_flags(RunRow(**{**base, "heartbeat": NOW, "reward_trend": [0, 0]}), NOW) == []
    wait = RunRow(run="r", train_state="failed", monitor_action="WAIT", monitor_class="crash")
    assert row_flags(wait, NOW) == ["backoff: crash", "failed"]
    # a wait for lost nodes (monitor/node_loss.py) is no backoff: the node note says it
    nodes = {**base, "monitor_action": "WAIT", "monitor_class": "node_fail", "heartbeat": NOW}
    note = "waiting for nodes (2/4 up)"
    assert row_flags(RunRow(**nodes, node_note=note), NOW) == [note]
    assert row_flags(RunRow(**nodes), NOW) == ["backoff: node_fail"]


def test_no_eta_once_the_run_has_ended() -> None:
    live = RunRow(run="r", train_state="training", step=2, max_steps=10, sec_per_step=3.0)
    assert _eta(live) == "24s"
    for ended in ({"train_state": "failed"}, {"monitor_action": "STOP"}, {"train_state": None}):
        assert _eta(dataclasses.replace(live, **ended)) == "-", ended


def test_json_output_for_local_runs(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    me = str(os.getpid())
    live = {"job_id": me, "heartbeat": time.time()}
    make_run(tmp_path, "loc", me, executor="local", progress=live, rewards=[0, 0, 0])
    assert status.main(["--logs", str(tmp_path), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows[0]["run"] == "loc" and rows[0]["slurm_state"] == "LOCAL_RUNNING"
    assert rows[0]["reward_trend"] == [0.0, 0.0, 0.0] and rows[0]["flags"] == ["zero reward"]
    assert set(rows[0]) == {f.name for f in dataclasses.fields(RunRow)} | {"flags"}


def test_details_view(logs: Path) -> None:
    paths = RunPaths(logs / "a-running")
    for step in (10, 20):
        make_checkpoint(paths, step)
    detail = collect_detail(
        paths, query=lambda ids: SlurmView({"101": JobRecord("101", "RUNNING")})
    )
    assert detail.rewards == [(1, 0.1), (2, 0.2), (3, 0.3), (4, 0.4), (5, 0.5)]
    text = render(build_details(detail, NOW))
    assert "a-running" in text and "initial submission" in text and "h100x2" in text
    assert "complete checkpoints: 10, 20" in text and "reward/mean per step" in text
    assert "last sample: none yet" in text
    sample = {"step": 5, "question": "2+2?", "completion": "Four.\nAnswer: 4", "reward": 1.2}
    paths.samples.write_text(json.dumps({**sample, "tokens": 7}) + "\n")
    text = render(build_details(collect_detail(paths, fake_all), NOW))
    assert "last sample (step 5, reward 1.20, 7 tokens): Four. Answer: 4" in text
    assert "•" in text and "0.500 ┤" in text and "0.100 ┤" in text
    stop = render(build_details(collect_detail(RunPaths(logs / "e-breaker"), fake_all), NOW))
    assert "circuit_breaker at step 40" in stop and "(no metrics yet)" in stop


def fake_all(ids: list[str]) -> SlurmView:
    nodes = {"101": "grpo-n[1-2]", "104": "localhost"}
    return SlurmView({j: JobRecord(j, SLURM[j], nodes=nodes.get(j)) for j in ids}, set())


def test_single_run_cli_and_plot_without_matplotlib(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_run(tmp_path, "loc", "999999999", executor="local", progress={}, rewards=[0.1, 0.3])
    monkeypatch.setenv("COLUMNS", "200")
    assert status.main(["loc", "--logs", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "LOCAL_EXITED" in out and "reward/mean per step" in out
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # a damaged environment
    assert status.main(["loc", "--logs", str(tmp_path), "--plot", str(tmp_path / "r.png")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pip install matplotlib" in err
    assert status.main(["--logs", str(tmp_path), "--plot", "x.png"]) == 2
    assert status.main(["nope", "--logs", str(tmp_path)]) == 2


def test_watch_stops_cleanly_on_ctrl_c(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    make_run(tmp_path, "loc", "999999999", executor="local")

    def interrupt(_: float) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(status.time, "sleep", interrupt)
    assert status.main(["--logs", str(tmp_path), "--watch", "1"]) == 0


def test_hundred_runs_render(tmp_path: Path) -> None:
    ids = {}
    for i in range(100):
        ids[str(1000 + i)] = "RUNNING"
        make_run(tmp_path, f"run-{i:03d}", str(1000 + i), progress={"step": i}, rewards=[0.1] * 20)
    calls = []

    def query(job_ids: list[str]) -> SlurmView:
        calls.append(job_ids)
        return SlurmView({j: JobRecord(j, ids[j]) for j in job_ids}, set())

    rows = collect_rows(tmp_path, query=query)
    text = render(build_table(rows, NOW))
    assert len(calls) == 1 and len(calls[0]) == 100
    assert all(f"run-{i:03d}" in text for i in range(100))


def test_tail_jsonl_reads_only_the_end(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    for i in range(3000):
        append_jsonl(path, {"step": i, "reward/mean": 0.5})
    with open(path, "a") as f:
        f.write('{"step": 30')  # torn last line
    tail = tail_jsonl(path, max_bytes=4096)
    assert tail[-1]["step"] == 2999 and 50 < len(tail) < 200
    assert all(set(t) == {"step", "reward/mean"} for t in tail)
    assert tail_jsonl(tmp_path / "missing.jsonl") == []


def test_small_visuals() -> None:
    assert (fmt_age(None), fmt_age(5), fmt_age(600), fmt_age(3 * 3600), fmt_age(3 * 86400)) == (
        "-",
        "5s",
        "10m",
        "3.0h",
        "3.0d",
    )
    assert sparkline([0, 1]) == "▁█" and sparkline([2, 2]) == "▁▁" and sparkline([]) == ""
    assert step_bar(5, 10, width=4) == "5/10 ██░░" and step_bar(None, 10) == "-"
    assert step_bar(3, 0) == "3"
    lines = text_plot([(1, 0.0), (2, 0.5), (3, 1.0)], width=3, height=3)
    assert lines[0].endswith("┤  •") and lines[2].endswith("┤•  ") and "step 1" in lines[-1]
    assert text_plot([]) == ["(no metrics yet)"]
    assert len(text_plot([(5, 1.0)])) == 12


def test_narrow_terminals_drop_optional_columns_first() -> None:
    from grpo_hpc.status.view import COLUMNS, columns_for_width

    assert columns_for_width(None) == COLUMNS == columns_for_width(200)
    mid = columns_for_width(120)
    assert "PROFILE" not in mid and "KL" not in mid and "ETA" in mid
    narrow = columns_for_width(80)
    assert narrow == ["RUN", "JOB", "SLURM", "TRAIN", "STEP", "REWARD", "HB", "FLAG"]


def test_sample_line_is_one_line_and_bounded() -> None:
    from grpo_hpc.status.view import sample_line

    row = {"step": 3, "completion": "a\n\nb " + "x" * 500, "reward": -0.5, "tokens": 48}
    line = sample_line(row, limit=40)
    assert "\n" not in line and line.endswith("...")
    assert line.startswith("last sample (step 3, reward -0.50, 48 tokens): a b xxx")
    assert len(line.split(": ", 1)[1]) == 40


def test_one_run_view_shows_the_last_steps_health(logs: Path) -> None:
    """entropy, engine-vs-trainer KL and the clipped share travel from progress.json to the
    ``grpo-status RUN`` view (a run before any step shows dashes)."""
    from grpo_hpc.status.view import RunRow, health_line

    assert health_line(RunRow(run="r")) == (
        "last step: entropy - nats/token, engine-trainer KL -, clipped -"
    )
    row = RunRow(run="r", entropy=0.4213, engine_kl=0.00123, clip_frac=0.05)
    assert health_line(row) == (
        "last step: entropy 0.421 nats/token, engine-trainer KL 1.23e-03, clipped 5.0%"
    )
    row.staleness = 1  # an asynchronous run (algo.max_staleness)
    assert health_line(row).endswith("clipped 5.0%, batch 1 update(s) stale")
    row.staleness, row.continued = 2, 12  # partial rollouts: each group of its own age
    assert health_line(row).endswith(
        "clipped 5.0%, groups at most 2 update(s) stale, 12 rows continued"
    )


def test_health_line_shows_the_last_measured_entropy_and_its_step() -> None:
    """A last step whose groups all had equal rewards measures no entropy (the update skips
    the forward pass): the line shows the newest measured value with its step, not "-"."""
    from grpo_hpc.status.view import RunRow, health_line, last_measured

    row = RunRow(run="r", step=30, entropy=0.2468, entropy_step=29, clip_frac=0.0)
    assert health_line(row) == (
        "last step: entropy 0.247 nats/token (step 29), engine-trainer KL -, clipped 0.0%"
    )
    metrics = [
        {"step": 11, "entropy": 0.5},
        {"step": 12, "entropy": 0.41},
        {"step": 0, "eval/accuracy": 0.2},  # an evaluation line
        {"step": 13, "entropy": None},  # flat steps log null
        {"step": 14, "entropy": None},
    ]
    assert last_measured(metrics, "entropy") == (12, 0.41)
    # A line an earlier attempt logged past the step the run resumed from is not history.
    assert last_measured([*metrics, {"step": 40, "entropy": 0.9}], "entropy", 14) == (12, 0.41)
    assert last_measured([{"step": 3, "entropy": None}], "entropy") is None


def test_one_run_view_of_a_run_whose_last_step_was_flat(tmp_path: Path) -> None:
    """The demo run (a real CPU run, bench/results/demo_cpu_2026-11-25_metrics.jsonl) ended on a
    step
    with no reward variance: progress.json has no entropy for step 30, metrics.jsonl a
    null. grpo-status RUN shows step 29's entropy with its step, as do --json and a run
    whose metrics tail holds no measurement at all."""
    DEMO_METRICS = REPO / "bench" / "results" / "demo_cpu_2026-11-25_metrics.jsonl"
    paths = make_run(tmp_path, "demo", "999999999", executor="local")
    done = {"state": TrainState.FINISHED, "step": 30, "max_steps": 30, "entropy": None}
    write_progress(paths.progress, ProgressRecord(**{**_progress("demo"), **done}))
    paths.metrics.write_text(DEMO_METRICS.read_text())
    lines = [json.loads(line) for line in DEMO_METRICS.read_text().splitlines()]
    last = [m for m in lines if "reward/mean" in m][-1]
    assert last["step"] == 30 and last["entropy"] is None and last["grad_norm"] == 0.0

    text = render(build_details(collect_detail(paths), NOW))
    assert "last step: entropy 0.247 nats/token (step 29), engine-trainer KL -" in text
    rows = collect_rows(tmp_path, ["demo"])
    assert (rows[0].entropy_step, round(rows[0].entropy, 4)) == (29, 0.2468)

    # Thirty flat steps after the last measurement: past the 32 kB tail the row reads.
    flat = [{"time": NOW, "step": s, "entropy": None, "pad": "x" * 2000} for s in range(31, 61)]
    for m in flat:
        append_jsonl(paths.metrics, m)
    write_progress(paths.progress, ProgressRecord(**{**_progress("demo"), **done, "step": 60}))
    assert collect_rows(tmp_path, ["demo"])[0].entropy is None  # not in the tail
    text = render(build_details(collect_detail(paths), NOW))
    assert "entropy 0.247 nats/token (step 29)" in text


def _progress(run: str) -> dict:
    return dict(run=run, job_id="999999999", state=TrainState.TRAINING, heartbeat=NOW - 5)


def test_a_run_carried_on_with_the_nodes_left_says_so(tmp_path: Path) -> None:
    """The monitor's node decision (grpo_hpc/monitor/node_loss.py) as grpo-status shows it:
    a flag while it waits for a lost node, another while the run trains on fewer nodes,
    the jobs' node counts and the node events in the one-run view."""
    waiting = "2 of the 4 nodes up: waiting 10 min more"
    nodes_ev = {"time": NOW - 700, "job_id": "101", "phase": "nodes", "move": "wait",
                "nodes": 4, "up": 2, "full": 4, "reason": waiting}  # fmt: skip
    paths = make_run(tmp_path, "multi", "101", events=[nodes_ev])
    running = lambda ids: SlurmView({j: JobRecord(j, "RUNNING") for j in ids}, set(ids))  # noqa: E731
    (row,) = collect_rows(tmp_path, ["multi"], query=running)
    assert row.node_note == "waiting for nodes (2/4 up)"
    assert "waiting for nodes (2/4 up)" in row_flags(row, NOW)
    why = "2 of the 4 nodes up for 10 min >= nodes_wait_s 10 min: on 2 node(s)"
    shrink = {**nodes_ev, "time": NOW - 60, "move": "shrink", "nodes": 2, "reason": why}
    append_jsonl(paths.events, shrink)
    append_jsonl(paths.jobs, {"job_id": "102", "attempt": 1, "submitted_at": NOW - 50,
                              "reason": "monitor: node_fail (on 2 node(s))", "profile": "h100x2",
                              "executor": "slurm", "nodes": 2, "short_of": 4})  # fmt: skip
    (row,) = collect_rows(tmp_path, ["multi"], query=running)
    assert row.node_note == "on 2/4 nodes" and "on 2/4 nodes" in row_flags(row, NOW)
    text = render(build_details(collect_detail(paths, running), NOW))
    assert re.search(r"1\s+102\s+.*\s2 of 4\s+monitor: node_fail \(on 2 node\(s\)\)", text), text
    assert re.search(r"101\s+nodes\s+SHRINK\s+-\s+2 of the 4 nodes up for 10 min", text), text
    assert re.search(r"nodes: \d\d:\d\d wait \(2/4 up\), \d\d:\d\d shrink to 2\n", text), text
