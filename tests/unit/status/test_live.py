"""grpo-submit's live progress: the fields (pure) and the bar, fed by a progress.json and a
metrics.jsonl that another thread writes the way the trainer does."""

from __future__ import annotations

import io
import threading
from pathlib import Path

from rich.console import Console

from grpo_hpc.core.fsutil import append_jsonl
from grpo_hpc.core.paths import RunPaths
from grpo_hpc.core.progress import ProgressRecord, TrainState, write_progress
from grpo_hpc.status.live import follow, line, snapshot


def _rec(step: int, state: TrainState = TrainState.TRAINING, **kw) -> ProgressRecord:
    return ProgressRecord(run="r", state=state, step=step, max_steps=10, **kw)


def test_snapshot_fields() -> None:
    assert snapshot(None, None).state == "waiting"  # no progress.json yet
    s = snapshot(_rec(4, reward_mean=0.4125, tokens_per_s=1234.5), sec_per_step=30.0)
    assert (s.step, s.max_steps, s.reward, s.tokens_per_s) == (4, 10, "0.412", "1,234")
    assert s.eta == "3m"  # 6 steps x 30 s
    assert snapshot(_rec(4), None).eta == "-"  # no step time measured yet
    assert snapshot(_rec(10, TrainState.FINISHED), 30.0).eta == "-"
    assert line(s) == "  [training] step 4/10 reward 0.412 tok/s 1,234 eta 3m"
    assert line(snapshot(None, None)) == "  [waiting] step 0/? reward - tok/s - eta -"


class _Polls:
    """The follower's ``done`` callable, counting its calls: it is called before every
    read, so two calls after a write mean the follower has read (and shown) that write."""

    def __init__(self) -> None:
        self.finished = threading.Event()
        self._n = 0
        self._cond = threading.Condition()

    def __call__(self) -> bool:
        with self._cond:
            self._n += 1
            self._cond.notify_all()
        return self.finished.is_set()

    def seen(self) -> None:
        """Block until the follower has read what was written before this call."""
        with self._cond:
            target = self._n + 2
            if not self._cond.wait_for(lambda: self._n >= target, timeout=60):
                self.finished.set()  # end the follower: the test then fails on what it shows


def _trainer(paths: RunPaths, steps: int, polls: _Polls) -> None:
    write_progress(paths.progress, _rec(0, TrainState.LOADING))
    polls.seen()
    for step in range(1, steps + 1):
        append_jsonl(paths.metrics, {"step": step, "time/step": 12.0, "reward/mean": 0.25 * step})
        rec = _rec(step, reward_mean=0.25 * step, tokens_per_s=900.0 + step)
        write_progress(paths.progress, rec)
        polls.seen()  # each state is shown before the next replaces it
    final = _rec(steps, TrainState.FINISHED, reward_mean=0.75, tokens_per_s=900.0 + steps)
    write_progress(paths.progress, final)
    polls.finished.set()


def _follow(tmp_path: Path, terminal: bool) -> str:
    paths = RunPaths(tmp_path / "r")
    paths.root.mkdir()
    polls = _Polls()
    writer = threading.Thread(target=_trainer, args=(paths, 3, polls))
    out = io.StringIO()
    console = Console(file=out, force_terminal=terminal, width=150, color_system=None)
    writer.start()
    last = follow(paths, polls, console, poll_s=0.05)
    writer.join()
    assert (last.state, last.step, last.reward) == ("finished", 3, "0.750")
    return out.getvalue()


def test_bar_on_a_terminal(tmp_path: Path) -> None:
    text = _follow(tmp_path, terminal=True)
    final = text.rsplit("\r", 1)[-1]  # the bar redraws in place; its last frame
    assert "finished" in final and "3/10" in final and "reward 0.750" in final
    assert "903 tok/s" in final and "ETA -" in final
    assert "ETA 84s" in text  # mid-run, after step 3 of 10: 7 steps x 12 s


def test_lines_when_not_a_terminal(tmp_path: Path) -> None:
    lines = _follow(tmp_path, terminal=False).splitlines()
    # one line per change, not per poll (the follower may first find no progress.json)
    shown = [ln.split(" reward")[0] for ln in lines if not ln.startswith("  [waiting]")]
    assert shown == [
        "  [loading] step 0/10",
        "  [training] step 1/10",
        "  [training] step 2/10",
        "  [training] step 3/10",
        "  [finished] step 3/10",
    ], lines
    assert lines[-1].startswith("  [finished] step 3/10 reward 0.750")
    assert len(lines) == len(set(lines))
