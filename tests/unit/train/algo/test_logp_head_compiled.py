"""The fused head's per-chunk arithmetic: written without a scatter it is the same as the
scatter-add form bit for bit, and compiled (``logp_head.compile_chunks``, what
``dist.compile`` turns on; CPU inductor here) it gives the eager log-probs and fp32
gradients, for chunks of two lengths (one recompilation, then dynamic)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from torch._dynamo.utils import counters

from grpo_hpc.train.algo import logp_head
from grpo_hpc.train.algo.logp_head import chunk_grad, chunk_grad_fusable, chunk_stats, linear_logp


def _inputs(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(10, 16, generator=g)
    w = torch.randn(50, 16, generator=g) * 0.5
    ids = torch.randint(0, 50, (10,), generator=g)
    return h, w, ids


def test_fusable_chunk_gradient_equals_the_scatter_add_form_bit_for_bit() -> None:
    h, w, ids = _inputs()
    logits = h @ w.T
    inv_t = 1 / 0.7
    lse, _, _ = chunk_stats(logits, ids, inv_t, torch.float32)
    g = torch.randn(10, generator=torch.Generator().manual_seed(1))
    want = chunk_grad(logits, lse, ids, g, inv_t, torch.float32, torch.float32)
    got = chunk_grad_fusable(logits, lse, ids, g, inv_t, torch.float32, torch.float32)
    assert torch.equal(got, want)
    # and the scatter form is d log_softmax(z / T)_y / d logits, times g
    z = logits.detach().clone().requires_grad_(True)
    torch.log_softmax(z * inv_t, -1).gather(-1, ids[:, None])[:, 0].mul(g).sum().backward()
    assert z.grad is not None
    torch.testing.assert_close(want, z.grad)


def test_chunk_stats_are_the_log_softmax_and_its_entropy() -> None:
    h, w, ids = _inputs()
    z = (h @ w.T).double() / 0.7
    lse, chosen, entropy = chunk_stats((h @ w.T).double(), ids, 1 / 0.7, torch.float64)
    logp = torch.log_softmax(z, -1)
    torch.testing.assert_close(chosen - lse, logp.gather(-1, ids[:, None])[:, 0])
    torch.testing.assert_close(entropy, -(logp.exp() * logp).sum(-1))


@pytest.fixture
def compiled_chunks() -> Iterator[None]:
    saved = (logp_head._CHUNK.stats, logp_head._CHUNK.grad)
    logp_head.compile_chunks()
    yield
    logp_head._CHUNK.stats, logp_head._CHUNK.grad = saved


def _logp_and_grads(chunk: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    h, w, ids = _inputs()
    h.requires_grad_(True)
    w.requires_grad_(True)
    logp, entropy = linear_logp(h, w, ids, chunk=chunk)
    (logp * torch.linspace(-1, 1, 10)).sum().backward()
    assert h.grad is not None and w.grad is not None
    return logp.detach(), entropy, h.grad, w.grad


@pytest.mark.slow
@pytest.mark.usefixtures("compiled_chunks")
def test_compiled_chunks_give_the_eager_logp_and_gradients() -> None:
    saved = (logp_head._CHUNK.stats, logp_head._CHUNK.grad)
    logp_head._CHUNK.stats, logp_head._CHUNK.grad = chunk_stats, chunk_grad
    want = _logp_and_grads(chunk=4)  # eager: chunks of 4, 4 and 2 tokens
    logp_head._CHUNK.stats, logp_head._CHUNK.grad = saved
    counters.clear()
    got = _logp_and_grads(chunk=4)
    for name, a, b in zip(("logp", "entropy", "grad h", "grad W"), got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)
    assert counters["stats"]["unique_graphs"] > 0  # compiled code is what ran


def test_a_one_token_tail_joins_the_chunk_before_it() -> None:
    def lengths(n: int, chunk: int) -> list[int]:
        return [sl.stop - sl.start for sl in logp_head.chunk_slices(n, chunk)]

    assert lengths(10, 4) == [4, 4, 2]
    assert lengths(9, 4) == [4, 5]  # not [4, 4, 1]
    assert lengths(5, 4) == [5]
    assert lengths(1, 4) == [1]
    assert lengths(4, 4) == [4]
    assert lengths(0, 4) == []


@pytest.mark.slow
@pytest.mark.usefixtures("compiled_chunks")
def test_no_token_count_compiles_again_once_chunks_are_dynamic() -> None:
    """The mid-run recompilations: every chunk of the first micro-batches had one size
    (rows x the longest completion, 8 x 256 = 2 chunks of 1024), Dynamo compiled that size
    as a constant and compiled again at the first other one, deep into a real run; and a
    1-row chunk specialises (0/1). After micro-batches of whole chunks only, other sizes,
    1-token tails and a single token reuse the graphs the first micro-batch built."""
    from grpo_hpc.train.measure.tracking import compiled_graphs

    def step(n: int) -> None:
        g = torch.Generator().manual_seed(n)
        h = torch.randn(n, 16, generator=g, requires_grad=True)
        w = torch.randn(50, 16, generator=g, requires_grad=True)
        logp, _ = linear_logp(h, w, torch.randint(0, 50, (n,), generator=g), chunk=4)
        logp.sum().backward()

    step(8)  # two chunks of 4: the only size seen so far
    step(12)
    before = compiled_graphs()
    for n in (7, 9, 13, 1, 6):  # another size, tails of 1 token, a single token
        step(n)
    assert compiled_graphs() == before
