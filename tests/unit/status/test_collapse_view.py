"""What grpo-status shows of a collapse (events.jsonl, phase collapse): the FLAG column's
COLLAPSE entry and a red line on the plot, from the trainer's events (pure parts; the real
trainer writes them in tests/e2e/test_collapse_run.py)."""

from __future__ import annotations

from grpo_hpc.status.plot import build_figure, plot_data
from grpo_hpc.status.view import RunRow, collapse_flag, row_flags

NOW = 1_000_000.0


def _event(action: str, step: int, rollbacks: int = 0) -> dict:
    return {"phase": "collapse", "action": action, "signal": "no_signal", "step": step,
            "rollbacks": rollbacks, "reason": "collapse (no_signal) ..."}  # fmt: skip


def test_the_flag_names_the_newest_collapse_and_what_was_done() -> None:
    events = [{"phase": "decision", "action": "NONE"}, _event("ROLLBACK", 10, 1)]
    assert collapse_flag(events) == "no_signal@10 rollback 1"
    assert collapse_flag([*events, _event("FLAG", 22)]) == "no_signal@22 flag"
    assert collapse_flag(events[:1]) is None
    row = RunRow(run="r", train_state="training", collapse="no_signal@10 rollback 1")
    assert row_flags(row, NOW) == ["COLLAPSE no_signal@10 rollback 1"]
    # a run the monitor stopped for collapse says so once ("stopped: collapsed")
    stopped = RunRow(run="r", train_state="failed", collapse="no_signal@10 stop",
                     monitor_action="STOP", monitor_class="collapsed")  # fmt: skip
    assert row_flags(stopped, NOW) == ["stopped: collapsed"]


def test_the_plot_draws_a_red_line_at_each_collapse() -> None:
    metrics = [{"time": float(s), "step": s, "reward/mean": 0.1} for s in range(1, 13)]
    data = plot_data(metrics, [], events=[_event("ROLLBACK", 10, 1)])
    assert data.collapses == [(10, "no_signal: rollback")]
    fig = build_figure(data, "r")
    try:
        first = fig.get_axes()[0]
        red = [ln for ln in first.get_lines() if ln.get_color() == "red"]
        assert [ln.get_xdata()[0] for ln in red] == [10]
        assert any("collapse (no_signal: rollback)" in t.get_text() for t in first.texts)
    finally:
        import matplotlib.pyplot as plt

        plt.close(fig)
