"""Scoring while the rollout is still decoding (``rollout.stream_scoring``).

A rollout's completions end at different times: on GSM8K most are done long before the
few that run to the length cap. The native engine hands each finished row over at its
host checks (``NativeEngine.generate(on_done=...)``); a thread here decodes it, runs the
pre-judge and sends what is left to the math-verify worker, and starts its code reward's
sandbox (code tasks), so that the scoring after generation finds most of the work done.
What it hides: math-verify's first parse of a new string (30-120 ms of one item on the
CPU test machine, 0.1-0.37 s in real 2-GPU runs, while the other ranks waited at the next
collective), and the code sandboxes' run time.

Rows that end with the rollout (the ones that run to the length cap, and the last to
finish) are never handed over finished, and in real runs they held the remaining slow
items. So the rows still decoding are read too (``on_running``): whenever one completes a
line, the answer its text names so far (up to that line) is judged ahead. A model that
rambles on after its ``Answer:`` line usually keeps it; if it writes another, that one is
judged too, and the verdict the final text needs is looked up like any other.

Results cannot differ from scoring after generation: each result is kept by exactly what
it was computed from (:class:`functions.Ahead`), so a row decoded here differently from
the batch's text is simply scored again. A failure in the thread stops the streaming and
nothing else.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from grpo_hpc.train.rewards.code import CodeJob, code_job, run_code_job
from grpo_hpc.train.rewards.functions import Ahead, Job, correctness_job
from grpo_hpc.train.rewards.verifier import VERIFIER

_END = None


def completion_text(tok: Any, tokens: Sequence[int]) -> str:
    """A finished row's text as ``to_batch`` decodes it: up to its first EOS, special
    tokens skipped."""
    ids = list(tokens)
    eos = tok.eos_token_id
    if eos in ids:
        ids = ids[: ids.index(eos) + 1]
    return tok.decode(ids, skip_special_tokens=True)


class StreamingJudge:
    """One rollout's rewards that depend on a completion alone, computed on a thread as
    its rows finish: math-verify verdicts and code rewards."""

    def __init__(
        self,
        samples: Sequence[dict],
        decode: Callable[[Sequence[int]], str],
        timeout_s: float,
        require_marker: bool = True,
        correctness: bool = True,
        code_workers: int = 0,
    ) -> None:
        """``samples[row]``: the problem of rollout row ``row`` (``gold``; ``tests`` and
        ``setup`` for code); ``decode``: a row's tokens to its text
        (:func:`completion_text`); ``correctness``: judge answers; ``code_workers``:
        sandboxes run at once for code rewards (0: none run here)."""
        self.samples, self.decode = list(samples), decode
        self.timeout_s, self.require_marker = timeout_s, require_marker
        self.correctness = correctness
        self.ahead = Ahead()
        self.rows = 0
        """Rows handed over while decoding."""
        self.guessed = 0
        """math-verify jobs sent for rows still decoding (some the final text never needs)."""
        self._so_far: dict[int, list[int]] = {}  # a running row's tokens, from on_running
        self._last_guess: dict[int, Job] = {}
        self.error: BaseException | None = None
        """What stopped the thread early, if anything (scoring then does the rest)."""
        self._code: dict[CodeJob, Future] = {}
        self._pool = ThreadPoolExecutor(code_workers, "grpo-stream-code") if code_workers else None
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._cancel = threading.Event()
        self._thread = threading.Thread(target=self._run, name="grpo-stream-judge", daemon=True)
        self._thread.start()

    def offer(self, rows: list[int], tokens: list[list[int]]) -> None:
        """Finished rows (rollout row indices) and their completion tokens; called by the
        engine on the main thread, returns at once."""
        self.rows += len(rows)
        self._queue.put((rows, tokens, True))

    def running(self, rows: list[int], tokens: list[list[int]]) -> None:
        """Rows still decoding (rollout row indices) and the tokens each produced since the
        last call; called by the engine on the main thread, returns at once."""
        if self.correctness:
            self._queue.put((rows, tokens, False))

    def finish(self) -> Ahead:
        """Wait for everything handed over to be scored; what was."""
        self._queue.put(_END)
        self._thread.join()
        for job, future in self._code.items():
            try:
                self.ahead.code[job] = future.result()
            except Exception:  # noqa: BLE001, S112 - scored again after generation
                continue
        if self._pool is not None:
            self._pool.shutdown()
        return self.ahead

    def close(self) -> None:
        """Stop without scoring what is still queued (the rollout was abandoned); waits at
        most for the items being scored."""
        self._cancel.set()
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)
        self._queue.put(_END)
        self._thread.join()

    def _run(self) -> None:
        try:
            while (item := self._queue.get()) is not _END:
                if self._cancel.is_set():
                    continue
                rows, tokens, finished = item
                if finished:
                    self._score(rows, tokens)
                else:
                    self._guess(rows, tokens)
        except BaseException as e:  # noqa: BLE001 - never more than a lost head start
            self.error = e
            self._cancel.set()
            while self._queue.get() is not _END:  # let finish() return
                pass

    def _score(self, rows: list[int], tokens: list[list[int]]) -> None:
        jobs: list[Job] = []
        for row, ids in zip(rows, tokens, strict=True):
            self._so_far.pop(row, None)
            # Let the main thread in between rows: while this thread runs Python, the
            # decode loop's next launches wait for the GIL, up to the 5 ms switch interval.
            time.sleep(0)
            text, sample = self.decode(ids), self.samples[row]
            if self._pool is not None and sample.get("tests"):
                job = code_job(text, sample)
                if job not in self._code:
                    self._code[job] = self._pool.submit(run_code_job, job)
            if self.correctness:
                gold = str(sample.get("gold") or "")
                score, verdict_job = correctness_job(text, gold, self.require_marker)
                self._want(score, verdict_job, jobs)
        self._judge(jobs)

    def _guess(self, rows: list[int], tokens: list[list[int]]) -> None:
        """Judge the answer each running row has written so far, if it completed a line
        since the last time. Only an answer convention counts (``Answer:``, ``####``, a
        box, "the answer is"), never the last-number fallback: a number mid-reasoning is no
        guess at the final answer."""
        jobs: list[Job] = []
        for row, new in zip(rows, tokens, strict=True):
            ids = self._so_far.setdefault(row, [])
            ids.extend(new)
            time.sleep(0)  # as in _score: the decode loop's launches need the GIL
            # a line completed: decode the whole row (chunks decoded alone can lose a
            # boundary's space or byte) and read it up to its last line break
            if "\n" not in self.decode(new):
                continue
            text = self.decode(ids)
            gold = str(self.samples[row].get("gold") or "")
            score, job = correctness_job(text[: text.rfind("\n")], gold, require_marker=True)
            if score is None and self._last_guess.get(row) != job:
                self._last_guess[row] = job
                self._want(score, job, jobs)
        self.guessed += len(jobs)
        self._judge(jobs)

    def _want(self, score: float | None, job: Job, jobs: list[Job]) -> None:
        """Add ``job`` to ``jobs`` when the pre-judge left it to math-verify and no verdict
        for it is known or coming."""
        if score is None and job not in self.ahead.verdicts and job not in jobs:
            jobs.append(job)

    def _judge(self, jobs: list[Job]) -> None:
        self.ahead.verdicts.update(
            zip(jobs, VERIFIER.judge_each(jobs, self.timeout_s), strict=True)
        )
