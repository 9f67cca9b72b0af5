"""events.jsonl's owner (core/events.py): the record written is the record read, an intent's
closing keeps the intent's keys, and a torn last line (a writer killed mid-line) is skipped
so the intents before it still count."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from grpo_hpc.core import events
from grpo_hpc.core.events import Event, Phase
from grpo_hpc.monitor.decision import pending_intent


def test_a_record_reads_back_as_written(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    ev = Event(10.0, "7", Phase.COLLAPSE, "STOP", "collapsed", "no_signal@4", extra={"step": 4})
    row = events.append(path, ev)
    (read,) = events.read(path)
    assert read == row == json.loads(path.read_text())
    assert read["phase"] == "collapse" and read["class"] == "collapsed" and read["step"] == 4
    assert Event.parse(read) == ev


def test_closing_an_intent_keeps_its_keys_and_closes_it(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    intent = events.append(
        path, Event(1.0, "7", Phase.INTENT, "RESUBMIT", "timeout", "out of time", "TIMEOUT",
                    {"cancel": True})
    )  # fmt: skip
    assert pending_intent(events.read(path), "7") == intent
    done = events.append(path, Event.parse(intent).closing(Phase.DONE, 2.0, new_job_id="8"))
    assert done == {**intent, "time": 2.0, "phase": "done", "new_job_id": "8"}
    assert pending_intent(events.read(path), "7") is None


def test_a_torn_last_line_is_skipped(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    intent = events.append(path, Event(1.0, "7", Phase.INTENT, "RESUBMIT", "crash"))
    with open(path, "a", encoding="utf-8") as f:
        f.write('{"time": 2.0, "job_id": "7", "phase": "do')  # killed mid-write
    assert events.read(path) == [intent]
    assert pending_intent(events.read(path), "7") == intent
    assert events.read(tmp_path / "absent.jsonl") == []


def test_only_intents_are_closed() -> None:
    with pytest.raises(ValueError, match="done or error"):
        Event(1.0, "7", Phase.INTENT).closing(Phase.DECISION, 2.0)
