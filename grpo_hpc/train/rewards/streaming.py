"""Judging answers while the rollout is still decoding (``rollout.stream_scoring``).

A rollout's completions end at different times: on GSM8K most are done long before the
few that run to the length cap. The native engine hands each finished row over at its
host checks (``NativeEngine.generate(on_done=...)``); a thread here decodes it, runs the
pre-judge and sends what is left to the math-verify worker, so that the scoring after
generation finds most verdicts already made. What it hides is math-verify's first parse
of a new string, 30-120 ms of one item on the CPU test machine and 0.2-0.37 s in
real 2-GPU runs, during which the other ranks waited at the next collective (issue 38).

Results cannot differ from scoring after generation: the verdicts are keyed by the
math-verify job itself (:func:`functions.correctness_job` of the text), so a completion
decoded here differently from the batch's text is simply judged again. A failure in the
thread stops the streaming and nothing else.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from grpo_hpc.train.rewards.functions import Verdicts, correctness_job
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
    """One rollout's math-verify jobs, judged on a thread as rows finish."""

    def __init__(
        self,
        golds: Sequence[str],
        decode: Callable[[Sequence[int]], str],
        timeout_s: float,
        require_marker: bool = True,
    ) -> None:
        """``golds[row]``: the gold answer of rollout row ``row``; ``decode``: a row's
        tokens to its text (:func:`completion_text`)."""
        self.golds, self.decode = list(golds), decode
        self.timeout_s, self.require_marker = timeout_s, require_marker
        self.verdicts: Verdicts = {}
        self.rows = 0
        """Rows handed over while decoding."""
        self.error: BaseException | None = None
        """What stopped the thread early, if anything (scoring then judges the rest)."""
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._cancel = threading.Event()
        self._thread = threading.Thread(target=self._run, name="grpo-stream-judge", daemon=True)
        self._thread.start()

    def offer(self, rows: list[int], tokens: list[list[int]]) -> None:
        """Finished rows (rollout row indices) and their completion tokens; called by the
        engine on the main thread, returns at once."""
        self.rows += len(rows)
        self._queue.put((rows, tokens))

    def finish(self) -> Verdicts:
        """Wait for every row handed over to be judged; the verdicts."""
        self._queue.put(_END)
        self._thread.join()
        return self.verdicts

    def close(self) -> None:
        """Stop without judging what is still queued (the rollout was abandoned); waits at
        most for the item being judged."""
        self._cancel.set()
        self.finish()

    def _run(self) -> None:
        try:
            while (item := self._queue.get()) is not _END:
                if not self._cancel.is_set():
                    self._judge(*item)
        except BaseException as e:  # noqa: BLE001 - never more than a lost head start
            self.error = e
            self._cancel.set()
            while self._queue.get() is not _END:  # let finish() return
                pass

    def _judge(self, rows: list[int], tokens: list[list[int]]) -> None:
        jobs = []
        for row, ids in zip(rows, tokens, strict=True):
            # Let the main thread in between rows: while this thread runs Python, the
            # decode loop's next launches wait for the GIL, up to the 5 ms switch interval.
            time.sleep(0)
            text = self.decode(ids)
            score, job = correctness_job(text, self.golds[row], self.require_marker)
            if score is None and job not in self.verdicts and job not in jobs:
                jobs.append(job)
        self.verdicts.update(zip(jobs, VERIFIER.judge_each(jobs, self.timeout_s), strict=True))
