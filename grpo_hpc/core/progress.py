"""The progress file: written by the trainer, read by the monitor and grpo-status.

This module owns the schema. Nobody else parses ``progress.json`` by hand.
Writes are atomic (temp file + rename), so a reader never sees half a record.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grpo_hpc.core.fsutil import append_text, atomic_write_json

SCHEMA_VERSION = 1


class TrainState(str, enum.Enum):
    """What the trainer is doing right now (or how it ended)."""

    LOADING = "loading"
    GENERATING = "generating"
    SCORING = "scoring"
    TRAINING = "training"
    CHECKPOINTING = "checkpointing"
    EVALUATING = "evaluating"
    FINISHED = "finished"
    """All steps done; terminal."""
    INTERRUPTED = "interrupted"
    """Stopped on a signal (preemption, time limit) after saving: resubmit me."""
    FAILED = "failed"
    """Ended with an error; ``exit_code`` and ``reason`` say which kind."""

    @property
    def terminal(self) -> bool:
        return self in (TrainState.FINISHED, TrainState.INTERRUPTED, TrainState.FAILED)


@dataclass
class ProgressRecord:
    """One snapshot of a run's training progress (schema version 1)."""

    run: str
    """Run name (the run directory's name)."""
    attempt: int = 0
    """Attempt number: 0 for the first submission, +1 per resubmission/requeue."""
    job_id: str | None = None
    """Slurm (or local) job id of the attempt that wrote this record."""
    state: TrainState = TrainState.LOADING
    """Current phase, or the terminal state."""
    step: int = 0
    """Optimizer steps completed so far."""
    start_step: int = 0
    """Step this attempt started from (its checkpoint's step; 0 for a fresh run)."""
    epoch: int = 0
    """Passes over the training prompts completed."""
    max_steps: int = 0
    """Total steps the run is configured for."""
    heartbeat: float = field(default_factory=time.time)
    """Unix time of the last sign of life (refreshed inside long phases too)."""
    started_at: float = field(default_factory=time.time)
    """Unix time this attempt started."""
    reward_mean: float | None = None
    """Mean total reward of the last step."""
    kl: float | None = None
    """Mean KL to the reference policy of the last step."""
    tokens_per_s: float | None = None
    """Generated tokens per second in the last step."""
    entropy: float | None = None
    """Mean entropy (nats/token) of the policy's next-token distribution over the last
    step's completion tokens: a collapse to a few fixed answers shows as a fall, noise as
    a rise."""
    engine_kl: float | None = None
    """Mean per-token KL (k3) between the rollout engine's sampling distribution and the
    trainer's, on the last step's tokens: the engine and the update disagreeing about the
    policy (bf16 kernels, a stale weight) shows here before it shows in the reward."""
    clip_frac: float | None = None
    """Share of the last step's completion tokens whose PPO ratio was clipped."""
    staleness: int | None = None
    """Updates between the weights that generated the last step's batch and the weights
    it trained (asynchronous runs, ``algo.max_staleness``; None: a synchronous run); with
    partial rollouts, of its oldest group."""
    continued: int | None = None
    """Partial rollouts (``rollout.partial_pool``): rows of the last step's batch whose answer
    came from more than one round, over every rank (None: no partial rollouts)."""
    last_checkpoint: int | None = None
    """Step of the newest COMPLETE checkpoint."""
    restarts: int = 0
    """How many times this run resumed from a checkpoint."""
    exit_code: int | None = None
    """Set when the attempt ends: an ``ExitCode`` value."""
    reason: str | None = None
    """Human-readable reason for a FAILED/INTERRUPTED state."""
    peak_gpu_gib: float | None = None
    """Peak GPU memory allocated by this attempt (set when it ran out of memory)."""
    schema_version: int = SCHEMA_VERSION

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["state"] = self.state.value
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ProgressRecord:
        version = d.get("schema_version", SCHEMA_VERSION)
        if version > SCHEMA_VERSION:
            raise ValueError(
                f"progress file has schema_version {version}, this grpo_hpc reads "
                f"up to {SCHEMA_VERSION}: upgrade grpo_hpc"
            )
        names = {f.name for f in dataclasses.fields(cls)}
        kwargs = {k: v for k, v in d.items() if k in names}
        kwargs["state"] = TrainState(kwargs.get("state", TrainState.LOADING.value))
        return cls(**kwargs)

    def heartbeat_age(self, now: float) -> float:
        return max(0.0, now - self.heartbeat)


def write_progress(path: Path, record: ProgressRecord) -> None:
    """Atomically replace the progress file. Only a terminal record is synced to the disk:
    the others are a heartbeat rewritten twice a step, which a power cut may set back a
    few updates at no cost (the durable record of what was trained is a checkpoint's
    COMPLETE marker), and whose fsync can stall a step (fsutil)."""
    atomic_write_json(path, record.to_dict(), sync=record.state.terminal)


class ProgressWriter:
    """Writes what rank 0 reports (the progress file, metrics and samples lines, console
    lines) from a thread of its own, so that the training loop never waits for the
    filesystem: a rename or an append in a directory whose filesystem is committing its
    journal (a checkpoint just written, an old one deleted) can block for hundreds of
    milliseconds (0.23-0.39 s measured on this project's CI disk by
    ``bench/probes/write_stall.py``; the real 2-GPU runs lost 0.5-0.8 s on rank 0,
    the rank that writes, in the steps right after a checkpoint).

    Only the newest progress record matters, so a record put while another waits replaces
    it. Lines are kept, in order, and written before the record taken with them. A terminal
    record (:attr:`TrainState.terminal`) is waited for: when ``put`` returns, it and every
    line before it are on the disk, the record synced, and no older record can land after
    it. A write that failed (a full disk) is raised by the next call, in the caller's
    thread."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._cv = threading.Condition()
        self._pending: ProgressRecord | None = None
        self._lines: list[tuple[Path | None, str]] = []
        self._busy = False
        self._error: BaseException | None = None
        threading.Thread(target=self._run, name="grpo-progress", daemon=True).start()

    def put(self, record: ProgressRecord) -> None:
        """Queue a copy of ``record``; for a terminal one, return once it is written."""
        with self._cv:
            self._raise_error()
            self._pending = dataclasses.replace(record)
            self._cv.notify_all()
            if record.state.terminal:
                self._cv.wait_for(self._idle)
                self._raise_error()

    def append(self, path: Path | None, text: str) -> None:
        """Queue ``text`` for the end of the file ``path`` (None: this process's stdout)."""
        with self._cv:
            self._raise_error()
            self._lines.append((path, text))
            self._cv.notify_all()

    def flush(self) -> None:
        """Wait until every record and line queued so far is written."""
        with self._cv:
            self._cv.wait_for(self._idle)
            self._raise_error()

    def _idle(self) -> bool:
        return self._pending is None and not self._lines and not self._busy

    def _raise_error(self) -> None:
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def _run(self) -> None:
        while True:
            with self._cv:
                self._cv.wait_for(lambda: self._pending is not None or bool(self._lines))
                record, self._pending, self._busy = self._pending, None, True
                lines, self._lines = self._lines, []
            try:
                _write_lines(lines)
                if record is not None:
                    write_progress(self.path, record)
            except BaseException as e:  # noqa: BLE001 - handed to the caller's thread
                with self._cv:
                    self._error = e
            finally:
                with self._cv:
                    self._busy = False
                    self._cv.notify_all()


def _write_lines(lines: list[tuple[Path | None, str]]) -> None:
    """Each file's queued text in one append, in the order queued (stdout: ``None``)."""
    by_file: dict[Path | None, list[str]] = {}
    for path, text in lines:
        by_file.setdefault(path, []).append(text)
    for path, texts in by_file.items():
        if path is None:
            sys.stdout.write("".join(texts))
            sys.stdout.flush()
        else:
            append_text(path, "".join(texts))


def read_progress(path: Path) -> ProgressRecord | None:
    """The current record, or None if the run has not written one yet.

    An unreadable file (should not happen with atomic writes, but disks fill up and
    people edit files) reads as None rather than crashing a dashboard of 100 runs, with
    one warning line on stderr per file and process.
    """
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        if not isinstance(data, dict):
            raise ValueError(f"a JSON {type(data).__name__}, not an object")
        return ProgressRecord.from_dict(data)
    except FileNotFoundError:
        return None
    except (OSError, TypeError, ValueError) as e:  # JSONDecodeError, UnicodeError: ValueError
        _warn_once(path, e)
        return None


_WARNED: set[str] = set()


def _warn_once(path: Path, err: Exception) -> None:
    if str(path) not in _WARNED:
        _WARNED.add(str(path))
        why = " ".join(str(err).split())[:200]
        print(f"warning: {path} is unreadable ({why}); read as no progress", file=sys.stderr)
