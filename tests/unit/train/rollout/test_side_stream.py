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
from grpo_hpc.train.rollout.side_stream import SideStream, stream_priority, tensors_in
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


def test_the_decode_priority_asks_for_the_highest_or_the_default() -> None:
    """``normal`` is every stream's default (0); ``high`` asks below any device's range
    (torch maps it to the highest), and an unknown setting is refused."""
    assert stream_priority("normal") == 0
    assert stream_priority("high") < -5  # past CUDA's (0, -5) on Hopper
    with pytest.raises(ValueError, match="normal or high"):
        stream_priority("urgent")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_high_decode_priority_is_the_devices_highest() -> None:
    """The stream torch gives for ``high`` has a higher priority (a lower number) than the
    default stream and than a ``normal`` side stream, and is what the thread runs on."""
    device = torch.device("cuda", 0)
    normal, high = SideStream(device, "normal"), SideStream(device, "high")
    assert normal.stream is not None and high.stream is not None
    assert normal.stream.priority == torch.cuda.default_stream(device).priority == 0
    assert high.stream.priority < 0
    seen: list[torch.cuda.Stream] = []

    def work() -> None:
        with high.inside():
            seen.append(torch.cuda.current_stream())

    th = threading.Thread(target=work)
    th.start()
    th.join()
    assert seen == [high.stream]


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
