"""events.jsonl: the one module that writes and reads a run's event log.

One JSON object per line, appended, never rewritten. Who appends what:

- the monitor (``monitor/loop.py``): a ``decision`` when its verdict on a job changes; before
  it cancels or resubmits, an ``intent``; after, ``done`` (or ``error``);
- whoever starts the next attempt (``monitor/attempts.py``, for the monitor and for
  ``grpo-submit --resume``): a person's ``intent`` (class ``manual``) and the ``done`` or
  ``error`` closing any intent;
- the trainer's rank 0 (``train/supervision/on_collapse.py``): ``collapse`` (action FLAG,
  STOP or ROLLBACK) and ``solved`` (FLAG or FINISH).

Every record has ``time``, ``job_id``, ``slurm_state``, ``phase``, ``action``, ``class`` and
``reason``; a phase adds its own keys (an intent's ``cancel``; a done's ``new_job_id`` and
``note``; an error's ``error``; a collapse's ``signal``, ``step``, ``rollbacks``, ``to_step``,
``seed``).

Crash safety, the monitor's: the intent is appended *before* the action and ``done`` after
it, so a monitor killed in between finds an intent no done/error closed
(``monitor.decision.pending_intent``) and finishes it instead of acting twice. Each record
is one ``write`` of one line on a file opened for appending: a crash leaves at most a torn
last line, which :func:`read` skips.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grpo_hpc.core.fsutil import append_jsonl, read_jsonl


class Phase(str, enum.Enum):
    """What a record is (its ``phase`` key)."""

    DECISION = "decision"
    """The monitor's verdict on a job (logged when it changes)."""
    INTENT = "intent"
    """About to cancel and/or resubmit (the monitor's, or a person's ``--resume``)."""
    DONE = "done"
    """An intent carried out (``new_job_id``; ``note``: superseded or adopted)."""
    ERROR = "error"
    """An intent that failed (``error``); the monitor may try again next pass."""
    COLLAPSE = "collapse"
    """The trainer saw the run stop learning (action FLAG, STOP or ROLLBACK)."""
    NODES = "nodes"
    """The monitor's node decision changed for a multi-node run (``move``: wait, shrink,
    grow; ``nodes``, ``up``, ``full``): grpo_hpc.monitor.node_loss."""
    SOLVED = "solved"
    """The trainer saw the task solved (action FLAG or FINISH); never a collapse."""


CLOSING = (Phase.DONE, Phase.ERROR)
"""The phases that close an intent."""
TRAINER = (Phase.COLLAPSE, Phase.SOLVED)
"""The phases the trainer writes (grpo-status's COLLAPSE/SOLVED flag reads them)."""


@dataclass(frozen=True)
class Event:
    """One line of events.jsonl."""

    time: float
    """Unix time it was written (a monitor pass's own clock for its records)."""
    job_id: str
    """The job it is about (``none`` for a person's intent on a run without jobs)."""
    phase: Phase
    """What the record is."""
    action: str | None = None
    """The action: the monitor's ActionKind value, or the trainer's FLAG/STOP/ROLLBACK/FINISH."""
    cls: str | None = None
    """``class`` on disk: the monitor's FailureClass value (``collapsed``, ``solved`` for the
    trainer's); None for a decision with no failure."""
    reason: str = ""
    """One line, for people."""
    slurm_state: str | None = None
    """The job's state as the monitor saw it (None where nobody asked Slurm)."""
    extra: dict[str, Any] = field(default_factory=dict)
    """The phase's own keys (module docstring)."""

    def row(self) -> dict[str, Any]:
        """The JSON object written for it."""
        base = {
            "time": self.time,
            "job_id": self.job_id,
            "slurm_state": self.slurm_state,
            "phase": self.phase.value,
            "action": self.action,
            "class": self.cls,
            "reason": self.reason,
        }
        return {**base, **self.extra}

    @classmethod
    def parse(cls, row: dict[str, Any]) -> Event:
        """A record read back (ValueError for a phase this module does not know)."""
        known = {"time", "job_id", "slurm_state", "phase", "action", "class", "reason"}
        return cls(
            time=float(row["time"]),
            job_id=str(row["job_id"]),
            phase=Phase(row["phase"]),
            action=row.get("action"),
            cls=row.get("class"),
            reason=str(row.get("reason") or ""),
            slurm_state=row.get("slurm_state"),
            extra={k: v for k, v in row.items() if k not in known},
        )

    def closing(self, phase: Phase, time: float, **extra: Any) -> Event:
        """The done/error record of this intent: its keys, a new phase and time, ``extra``."""
        if phase not in CLOSING:
            raise ValueError(f"an intent is closed by done or error, not {phase.value}")
        return dataclasses.replace(self, phase=phase, time=time, extra={**self.extra, **extra})


def append(path: Path, event: Event) -> dict[str, Any]:
    """Append ``event`` as one line (one write; module docstring); its row, as read back."""
    row = event.row()
    append_jsonl(path, row)
    return row


def read(path: Path) -> list[dict[str, Any]]:
    """Every record of a run's events.jsonl as written (a torn last line skipped; no file:
    none). Rows, not Events: the monitor's and grpo-status's pure functions read them as
    such, and a record of a newer phase must not stop an older reader."""
    return read_jsonl(path)
