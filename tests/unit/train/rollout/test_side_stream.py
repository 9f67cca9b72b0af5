"""The generator thread's CUDA stream (train/rollout/side_stream.py): every tensor of a
handed-over batch is found (so every one is recorded as used by the main stream), a CPU
run is untouched, and on a GPU the thread's kernels go to a stream of their own on the
rank's device."""

from __future__ import annotations

import threading

import pytest
import torch

from grpo_hpc.train.algo.batching import Scored
from grpo_hpc.train.rollout.collect import Collected
from grpo_hpc.train.rollout.side_stream import SideStream, tensors_in
from grpo_hpc.train.rollout.types import RolloutBatch


def _collected(device: str = "cpu") -> Collected:
    def t(*shape: int) -> torch.Tensor:
        return torch.ones(*shape, device=device)

    def scored() -> Scored:
        batch = RolloutBatch(
            input_ids=t(4, 6).long(),
            attention_mask=t(4, 6).long(),
            completion_mask=t(4, 3),
            prompt_len=3,
            texts=["a"] * 4,
            finished=t(4).bool(),
            sampled_logp=t(4, 3),
        )
        return Scored(batch=batch, rewards=t(1, 4), components={"correctness": [1.0] * 4})

    return Collected([scored(), scored()], 0.0, 0.0)  # two rounds (dynamic sampling)


def test_every_tensor_of_a_collected_batch_is_found() -> None:
    """Five tensors in the batch (ids, attention, completion mask, finished, log-probs) and
    the rewards, in each of the two scored rounds; floats, strings and lists of floats are
    not tensors."""
    made = _collected()
    found = {id(t) for t in tensors_in(made)}
    want = {id(s.rewards) for s in made.scored} | {
        id(getattr(s.batch, f))
        for s in made.scored
        for f in ("input_ids", "attention_mask", "completion_mask", "finished", "sampled_logp")
    }
    assert len(want) == 12 and found == want
    assert list(tensors_in({"x": [(1.0, "a")], "y": None})) == []


def test_on_a_cpu_the_side_stream_changes_nothing() -> None:
    side = SideStream(torch.device("cpu"))
    assert side.stream is None
    side.ready()
    out: list[torch.Tensor] = []

    def work() -> None:
        with side.inside():
            out.append(torch.arange(3) * 2)

    th = threading.Thread(target=work)
    th.start()
    th.join()
    side.hand_over(out)
    assert out[0].tolist() == [0, 2, 4]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_a_gpu_the_thread_decodes_on_its_own_stream_of_the_ranks_device() -> None:
    """The thread's current stream is the side stream, on the device given (the last GPU,
    so that a thread left on device 0 would show), and a batch it made reads back equal on
    the main stream after the handover."""
    device = torch.device("cuda", torch.cuda.device_count() - 1)
    torch.cuda.set_device(device)
    weights = torch.randn(256, 256, device=device)
    side = SideStream(device)
    side.ready()
    seen: dict[str, object] = {}

    def work() -> None:
        with side.inside():
            seen["stream"] = torch.cuda.current_stream()
            seen["device"] = torch.cuda.current_device()
            seen["made"] = _collected(str(device))
            seen["product"] = weights @ weights

    th = threading.Thread(target=work)
    th.start()
    th.join()
    side.hand_over(seen["made"])
    side.hand_over(seen["product"])
    assert seen["stream"] == side.stream and seen["stream"] != torch.cuda.default_stream(device)
    assert seen["device"] == device.index
    torch.testing.assert_close(seen["product"], weights @ weights)
    assert all(t.is_cuda for t in tensors_in(seen["made"]))
