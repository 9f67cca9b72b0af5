"""The CUDA stream an asynchronous run's generator thread decodes on.

Why a stream of its own: CUDA's default stream is one queue shared by every host thread of
the process. A generator thread that launches its decode kernels there queues them behind
the update's (and the update's behind them), so the GPU runs the two one after the other
and the overlap buys only the host's launch time. On a stream of its own the decode (bound
by memory bandwidth) and the update (bound by compute) may run at once.

What that costs in care, each a rule below:
- ordering: the generator reads the shadow's weights, which the main thread copies on its
  own stream just before starting the thread: the side stream waits on an event recorded
  after the copy (:meth:`SideStream.ready`), not on whatever the main stream has queued by
  the time the thread starts (the update's first kernels, which would serialise again);
- the handover: the main stream waits for the side stream before it reads a batch the
  thread made (:meth:`SideStream.hand_over`), and every tensor of that batch is marked as
  used by the main stream (``record_stream``): the caching allocator would otherwise hand
  its memory back to the side stream as soon as Python drops it, while the update's kernels
  that read it may still be queued;
- the device: a new host thread starts on device 0; on rank r of a node the thread must
  select the rank's GPU before it allocates or seeds anything;
- the priority (``rollout.decode_priority``): on a stream of CUDA's highest priority the
  block scheduler gives the decode's blocks free multiprocessors before the update's
  waiting ones, so the decode, one small launch per token, is not held behind a large
  matrix product of the update (:func:`stream_priority`).

On a CPU every method does nothing: the thread runs as before.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

HIGHEST = -100
"""Below CUDA's priority range on any device (H100/H200: 0 to -5): torch maps a priority
past the range to the nearest it allows, the highest for a negative one."""


def stream_priority(setting: str) -> int:
    """The priority the decode's stream is asked for (pure): lower numbers are higher
    priorities; ``normal`` is 0, every stream's default."""
    levels = {"normal": 0, "high": HIGHEST}
    if setting not in levels:
        raise ValueError(f"decode priority {setting!r}: normal or high")
    return levels[setting]


class SideStream:
    """A generator thread's stream and the event it starts after (CUDA only)."""

    def __init__(self, device: torch.device, priority: str = "normal") -> None:
        self.device = device
        self.stream = None
        if device.type == "cuda":
            self.stream = torch.cuda.Stream(device, priority=stream_priority(priority))
        self._start: torch.cuda.Event | None = None

    def ready(self) -> None:
        """Called on the main thread once the shadow holds the new weights: the side
        stream's next work starts after everything queued so far (the copy), and nothing
        queued later (the update)."""
        if self.stream is None:
            return
        self._start = torch.cuda.Event()
        self._start.record(torch.cuda.current_stream(self.device))

    @contextmanager
    def inside(self) -> Iterator[None]:
        """Wrap the generator thread's work: the rank's device, the side stream, after the
        event of :meth:`ready`."""
        if self.stream is None:
            yield
            return
        torch.cuda.set_device(self.device)
        if self._start is not None:
            self.stream.wait_event(self._start)
        with torch.cuda.stream(self.stream):
            yield

    def hand_over(self, made: Any) -> None:
        """Called on the main thread after the generator thread joined, before anything
        reads ``made`` (batches, scores: any nesting of dataclasses, dicts, lists and
        tensors): the main stream waits for the side stream, and every CUDA tensor in
        ``made`` is recorded as used by the main stream."""
        if self.stream is None:
            return
        main = torch.cuda.current_stream(self.device)
        main.wait_stream(self.stream)
        for t in tensors_in(made):
            if t.is_cuda:
                t.record_stream(main)


def tensors_in(value: Any) -> Iterator[torch.Tensor]:
    """Every tensor reachable from ``value`` through dataclass fields, dicts, lists and
    tuples (pure)."""
    if isinstance(value, torch.Tensor):
        yield value
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            yield from tensors_in(getattr(value, f.name))
    elif isinstance(value, dict):
        for v in value.values():
            yield from tensors_in(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from tensors_in(v)
