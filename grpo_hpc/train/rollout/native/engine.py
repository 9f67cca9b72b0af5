"""The native rollout engine: static KV cache, shared prompt prefill, CUDA-graph decode.

One ``generate`` call:
1. refill the packed low-precision weights from the policy (once per rollout);
2. prefill each *prompt* once and copy its K/V into the cache rows of its G completions
   (no G-fold prefill; ``generate_rows``: each prompt its own count of rows), the prompts
   in chunks of at most ``prefill_tokens`` padded tokens;
3. decode one token per row per step. On CUDA each step is a captured graph, one per
   (row bucket, attention-span bucket), all captured at the first rollout of a batch
   shape (``capture_ahead``) and replayed for every later step and rollout; attention
   reads only the span bucket that holds the filled slots. Token choice, EOS tracking,
   each row's room (``generate_rows``'s ``answered``) and the output write happen inside
   the graph; the host looks at the device only every ``check_every`` tokens to refresh
   the heartbeat, enforce the time budget and stop once every row has ended (or when
   ``generate_rows``'s ``stop_when`` says so);
4. compact finished rows out (``compact``): at those same checks, once the rows still
   running fit a row bucket at most half the current one, they move (cache, state,
   output so far) into that smaller workspace, whose graphs then run the remaining steps.

Why compaction rather than refilling freed slots with new completions (continuous
batching): every row of a rollout shares one cache slot index, so a refilled row would
need its own positions and masks in every graph, and a rollout has no further prompts
to refill with unless steps overlap (off-policy). Compaction keeps the decode step as it
is and costs one gather of the live rows' cache per halving. With the real model on
GSM8K prompts, a few long completions hold the rollout for hundreds of steps at a
fraction of the batch (``bench/decode/run.py --model DIR --prompts gsm8k`` measures both).
Sampling stays exact: the race noise is drawn for the whole original batch and each
compacted row takes its own row of it (``sampling.choose``), so a row's tokens are those
it would have had without compaction.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from grpo_hpc.core.errors import StalledError
from grpo_hpc.train.distributed.dist import compute_device
from grpo_hpc.train.rollout.native import attention, forward, weights
from grpo_hpc.train.rollout.native.sampling import choose
from grpo_hpc.train.rollout.native.steps import DecodeSteps
from grpo_hpc.train.rollout.native.workspace import (
    HandOver,
    OnDone,
    OnRunning,
    Workspace,
    compact_rows,
    ended_rows,
    pad_rows,
    round_up,
)
from grpo_hpc.train.rollout.types import (
    GenerationAborted,
    RolloutBatch,
    StopWhen,
    check_rows,
    left_padded,
    repeat_rows,
    rooms,
    to_batch,
)


def decode_path(compiled: bool, graphed: bool, fused: bool) -> str:
    """How the engine's decode steps run, in words (pure): its layers compiled or eager,
    captured in CUDA graphs or not, attention as the Triton kernel or as matrix products."""
    layers = "compiled layers" if compiled else "eager layers"
    graphs = ", CUDA graphs" if graphed else ""
    attn = "Triton decode attention" if fused else "matrix-product attention"
    return f"native decode: {layers}{graphs}, {attn}"


@dataclass
class NativeEngine(DecodeSteps):
    """Rollouts from the policy's own weights with the decode loop of this package (its
    decode step and CUDA graphs: :class:`~grpo_hpc.train.rollout.native.steps.DecodeSteps`)."""

    model: torch.nn.Module
    tokenizer: Any
    max_new_tokens: int
    temperature: float
    top_p: float
    timeout_s: float
    dtype: torch.dtype = torch.float32
    """Compute dtype of weights, activations and cache (bf16/fp16 on GPU)."""
    use_graphs: bool = True
    """Capture decode steps in CUDA graphs (ignored on CPU)."""
    compile: bool = True
    """torch.compile the decode layers on CUDA (ignored on CPU; falls back to eager,
    with a warning, if compilation fails)."""
    tick: Callable[[], None] = lambda: None
    abort: Callable[[], bool] = lambda: False
    span_bucket: int = 64
    """Attention span granularity: one graph per multiple of this."""
    row_bucket: int = 8
    """Rows are padded up to a multiple of this (fewer distinct graphs)."""
    check_every: int = 16
    """Decode steps between host checks (heartbeat, deadline, all rows done, compaction)."""
    compact: bool = True
    """Move the rows still running into a smaller row bucket once they fit in half the
    current one (finished rows stop costing); False decodes every row to the end."""
    logp_temperature: float = 1.0
    """The reported log-probs are of ``softmax(logits / logp_temperature)``: the update's
    distribution (see ``sampling.choose``)."""
    fp32_head: bool = False
    """Logits in fp32 (an fp32 LM head; ``algo.fp32_lm_head``), as the update scores them."""
    capture_ahead: bool = True
    """With CUDA graphs: at the first rollout of a batch shape, capture every decode graph
    that rollouts of that shape can meet (each row bucket compaction can move to, times
    each span bucket up to the cache's capacity), not each one the first time a rollout
    meets it. A graph first met mid-run made that step slower on the rank that met it,
    and its peers waited at the next collective (0.15-0.7 s at 3 of 18 trained
    steps of a 2-GPU GSM8K run). Pointless when the engine is released before each
    update (its graphs do not outlive the step): ``release()`` turns it off."""
    max_prompt_tokens: int = 0
    """Longest prompt (tokens) the engine will be given, if known: every KV cache is sized
    for it from the start. A cache that has to grow drops its workspace's captured graphs
    (and, with new strides, recompiles the layers), which is what made a held-out
    evaluation over prompts of many lengths crawl. 0: grow by half again when needed."""

    prefill_tokens: int = 0
    """Padded tokens (``prompts x longest prompt``) prefilled at once; 0: every prompt in
    one batch (a synchronous step's few prompts, an evaluation: as every figure so far was
    measured). Partial rollouts (``rollout.partial_pool``) set ``PREFILL_TOKENS`` on the
    generator's engine: they hand it many continued answers, each a prompt of up to a
    cap's tokens (Qwen2.5-1.5B at 4,096: 128 rows x ~4,400 tokens), whose one-batch prefill
    would hold tens of GB of MLP products. A rollout's prompts then run in consecutive
    chunks of whole prompts within the budget (a longer prompt alone), each chunk padded to
    its own longest prompt and writing its rows of the cache; one that fits runs as one
    batch, as before. The memory estimate counts one chunk."""

    batch_rows: int = 0
    """Least rows ``generate_rows`` decodes in (the rest padding, done from the start); 0:
    its rows up to ``row_bucket``. Partial rollouts set the pool's rows: their rounds vary
    in rows, and each new row count was a KV cache of its own (30 GB at 128 rows of
    Qwen2.5-1.5B, 4,096 tokens) whose graphs were captured while the update ran. At the
    pool's rows every round decodes in one workspace, captured at the first round."""

    hands_over_rows = True
    """``generate``'s ``on_done`` hears of rows as they finish."""

    def __post_init__(self) -> None:
        self.device = compute_device(self.model)
        self.head_dtype = torch.float32 if self.fp32_head else self.dtype
        self.packed = weights.allocate(self.model, self.dtype, self.device, self.head_dtype)
        self.graphed = self.use_graphs and self.device.type == "cuda"
        self.pool = torch.cuda.graph_pool_handle() if self.graphed else None
        cuda = self.device.type == "cuda"
        fused = attention.fused_available(self.device, self.dtype, self.packed.shape.head_dim)
        compiled = self.compile and cuda
        self.fns = forward.DecodeFns.compiled(fused_attention=fused) if compiled else forward.EAGER
        if self.fns is not forward.EAGER:
            # Each decode batch size is one compilation of the layers (``dynamic=False``);
            # compaction's halving buckets plus a large evaluation batch exceed dynamo's
            # default limit of 8, past which a fullgraph compile raises (then: eager).
            import torch._dynamo.config as dynamo_config

            dynamo_config.recompile_limit = max(dynamo_config.recompile_limit, 64)
        self.decode_path = decode_path(compiled, self.graphed, compiled and fused)
        """How each decode step runs, for the training log's [Kernels] line."""
        self.spaces: dict[int, Workspace] = {}
        self.width = self.max_new_tokens
        """Completion columns of every workspace: the largest cap set so far, so a smaller
        one (an evaluation's) decodes in the same workspaces and graphs."""
        self.floor = self.max_prompt_tokens + self.max_new_tokens if self.max_prompt_tokens else 0
        """Least KV cache capacity of a new workspace (raised when a cache had to regrow)."""
        self.answers = 1
        """Caps a cache holds past the longest prompt: 1, or 2 once prompts may carry their
        answer so far (:meth:`carry_answers`)."""
        self.eos = int(self.tokenizer.eos_token_id)
        self.stats: dict[str, int] = {}
        """Of the last ``generate``: ``row_steps`` (rows decoded, summed over steps: the
        decode cost), ``compactions`` and ``prefill_chunks``."""
        self.totals = {"captures": 0, "caches": 0}
        """Since construction: CUDA graphs captured and KV caches allocated."""
        self.prepared: set[tuple[int, bool]] = set()
        """(rows, greedy) of the batch shapes whose graphs were all captured ahead."""
        self.pad = int(self.tokenizer.pad_token_id)
        self.prefill_shapes: list[tuple[int, int]] = []
        """(prompts, padded width) of each chunk the last rollout prefilled."""

    # ------------------------------------------------------------------ public
    def generate(
        self,
        prompts: list[str],
        num_generations: int,
        *,
        greedy: bool = False,
        on_done: OnDone | None = None,
        on_running: OnRunning | None = None,
    ) -> RolloutBatch:
        """G completions of each prompt (rows ``i * G .. i * G + G - 1`` are prompt i's).
        ``on_done(rows, tokens)``, if given, hears of rows as they finish, at the host
        checks while other rows still decode (their completion tokens so far, EOS
        included), so that their scoring can start (``rollout.stream_scoring``); rows that
        end with the rollout are not handed over. ``on_running(rows, tokens)``, at the same
        checks, hears the tokens the rows still decoding produced since the last check (for
        judging answers written before a row ends; needs ``on_done``)."""
        enc = self.tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        counts = [num_generations] * len(prompts)
        return self._rollout(
            enc.input_ids, enc.attention_mask, counts, greedy, on_done, on_running, None, None, 0
        )

    def generate_rows(
        self,
        prompt_ids: list[list[int]],
        counts: list[int],
        *,
        greedy: bool = False,
        stop_when: StopWhen | None = None,
        answered: list[int] | None = None,
    ) -> RolloutBatch:
        """``counts[i]`` completions of each prompt's token ids (see
        ``RolloutEngine.generate_rows``): one prefill per prompt, copied into the cache
        rows of its completions, and the decode loop of ``generate``. ``stop_when`` is asked
        at every host check (``check_every``) with the rows ended so far (rows compacted
        out ended). A row ends at its room (``answered``) inside the decode step, as at
        EOS (``Workspace.room``), and is compacted out like a finished row."""
        check_rows(prompt_ids, counts, answered, self.max_new_tokens)
        ids, pmask = left_padded(prompt_ids, self.pad)
        return self._rollout(
            ids, pmask, counts, greedy, None, None, stop_when, answered, self.batch_rows
        )

    def _rollout(
        self,
        ids: torch.Tensor,
        pmask: torch.Tensor,
        counts: list[int],
        greedy: bool,
        on_done: OnDone | None,
        on_running: OnRunning | None,
        stop_when: StopWhen | None,
        answered: list[int] | None,
        least_rows: int,
    ) -> RolloutBatch:
        """The rows of the padded prompts ``ids`` [P, L] (``counts[i]`` of prompt i, rows
        consecutive, the last ``answered[i]`` ids already its answer), decoded in a batch of
        at least ``least_rows`` rows: what ``generate`` and ``generate_rows`` share."""
        ids = ids.to(self.device)
        pmask = pmask.to(self.device)
        n_rows, length = sum(counts), ids.shape[1]
        room = rooms(answered, counts, self.max_new_tokens)
        deadline = time.monotonic() + self.timeout_s
        if self.packed is None:  # released before the last update
            self.packed = weights.allocate(self.model, self.dtype, self.device, self.head_dtype)
        self.packed.shape.check_length(length + self.max_new_tokens)  # longrope's limit
        weights.refill(self.packed, self.model)
        with torch.no_grad(), torch.autocast(self.device.type, enabled=False):
            rows = round_up(max(n_rows, least_rows), self.row_bucket)
            root = self._workspace(rows, length + self.max_new_tokens)
            self._capture_ahead(root, greedy)  # before the prefill: it writes the cache
            self._start(root, ids, pmask, counts, n_rows, greedy, room.to(self.device))
            ws, real = root, n_rows  # the batch being decoded and its non-padding rows
            cols = self.max_new_tokens
            self.stats = {
                "row_steps": 0,
                "compactions": 0,
                "prefill_chunks": len(self.prefill_shapes),
            }
            hand = HandOver(on_done, on_running) if on_done is not None else None
            for t in range(1, self.max_new_tokens):
                if t % self.check_every == 0:
                    self.tick()
                    if time.monotonic() > deadline:
                        raise StalledError(
                            "generation exceeded "
                            f"rollout.generation_timeout_s={self.timeout_s:.0f}s"
                        )
                    if self.abort():
                        raise GenerationAborted()
                    live = (~ws.done[:real]).nonzero().squeeze(1)
                    if live.numel() == 0:
                        cols = t
                        break
                    if hand is not None:
                        hand.check(ws, real, t)
                    if stop_when is not None and stop_when(ended_rows(ws, real, n_rows), t):
                        cols = t  # columns [0, t) are written: return them as they are
                        break
                    target = compact_rows(live.numel(), ws.rows, self.row_bucket)
                    if self.compact and target < ws.rows:
                        ws, real = self._compacted(root, ws, real, live, target, length + t - 1)
                        self.stats["compactions"] += 1
                self.stats["row_steps"] += ws.rows
                self._step(ws, round_up(length + t, self.span_bucket), greedy, root.rows)
            self._write_back(root, ws, real)
            completion = root.out[:n_rows, :cols].clone()
            logp = root.out_logp[:n_rows, :cols].clone()
        self.tick()
        full = torch.cat([repeat_rows(ids, counts), completion], 1)
        batch = to_batch(full, repeat_rows(pmask, counts), length, self.tokenizer, room)
        batch.sampled_logp = logp * batch.completion_mask
        return batch

    def release(self) -> None:
        """Free what the engine holds on the device between rollouts: the packed weights,
        every KV cache and workspace, and the captured graphs with their memory pool. The
        next ``generate`` allocates and captures again (caches at the size already learnt,
        ``floor``); compiled layers are kept. For an update that does not fit beside the
        engine (``rollout.release_engine_memory``)."""
        self._drop_all_graphs()
        self.capture_ahead = False  # the graphs would not outlive the next update
        self.packed = None
        if self.device.type == "cuda":
            torch.cuda.empty_cache()  # the graphs' private pool goes back with its blocks

    def set_max_new_tokens(self, cap: int) -> None:
        """Up to ``cap`` new tokens from the next ``generate``; a cap wider than every
        workspace drops them (and their graphs): the next rollout allocates wider ones."""
        if cap > self.width:
            self._drop_all_graphs()
            self.width = cap
            if self.max_prompt_tokens:
                self.floor = max(self.floor, self.max_prompt_tokens + cap * self.answers)
        self.max_new_tokens = cap

    def carry_answers(self) -> None:
        """Prompts may end with up to a cap's tokens of their answer (partial rollouts'
        continued rows): every KV cache is sized for the longest prompt, a cap of answer and
        a cap of new tokens from the start. Otherwise each longer continuation than any
        before would regrow the cache and capture every CUDA graph again."""
        self.answers = 2
        if self.max_prompt_tokens:
            self.floor = max(self.floor, self.max_prompt_tokens + 2 * self.max_new_tokens)

    # ------------------------------------------------------------------ internals
    def _workspace(self, rows: int, capacity: int) -> Workspace:
        ws = self.spaces.get(rows)
        if ws is not None and ws.cache.capacity >= capacity:
            return ws
        if ws is not None:  # a longer prompt than any before: regrow, by half at least
            self.floor = max(self.floor, ws.cache.capacity * 3 // 2)
            self._drop_all_graphs()
        capacity = round_up(max(capacity, self.floor), self.span_bucket)
        self.totals["caches"] += 1
        cache = forward.KVCache.empty(self.packed, rows, capacity, self.dtype)
        ws = self.spaces[rows] = self._new_workspace(cache)
        return ws

    def _new_workspace(self, cache: forward.KVCache) -> Workspace:
        rows, dev, m = cache.rows, self.device, self.width

        def zeros(*size: int, dt: torch.dtype = torch.long) -> torch.Tensor:
            return torch.zeros(*size, dtype=dt, device=dev)

        return Workspace(
            cache=cache,
            tokens=zeros(rows),
            pos=zeros(1),
            first_slot=zeros(1),
            left_pad=zeros(rows),
            done=zeros(rows, dt=torch.bool),
            out=zeros(rows, m),
            out_logp=zeros(rows, m, dt=torch.float32),
            rows_of=torch.arange(rows, device=dev),
            room=zeros(rows),
        )

    def _start(
        self,
        ws: Workspace,
        ids: torch.Tensor,
        pmask: torch.Tensor,
        counts: list[int],
        n_rows: int,
        greedy: bool,
        room: torch.Tensor,
    ) -> None:
        """Prefill, choose completion token 0 of every row, set the decode state (the
        ``counts[i]`` rows of prompt i, ``n_rows`` in all, start from its prefill; row
        ``r`` may have ``room[r]`` new tokens)."""
        rows = ws.tokens.shape[0]
        pad_p = (pmask.shape[1] - pmask.sum(1)).long()
        logits = self._prefill(ws.cache, ids, pad_p, counts)
        spread = pad_rows(repeat_rows(logits, counts), rows)
        # Eager token choice: once per rollout, and outside the capture that falls back to
        # eager decoding if compiling fails.
        token, logp = choose(
            spread, self.temperature, self.top_p, greedy, logp_temperature=self.logp_temperature
        )
        ws.left_pad.copy_(pad_rows(repeat_rows(pad_p, counts), rows))
        ws.tokens.copy_(token)
        ws.room.copy_(pad_rows(room, rows))
        # Column 0 is written: a row with room for one token ends here as at EOS.
        ws.done.copy_((token == self.eos) | (ws.room <= 1))
        ws.done[n_rows:] = True  # bucket padding rows never count as running
        ws.out.fill_(self.pad)
        ws.out_logp.zero_()
        ws.out[:, 0] = token
        ws.out_logp[:, 0] = logp
        ws.first_slot.fill_(ids.shape[1])
        ws.pos.fill_(ids.shape[1])
        ws.rows_of.copy_(torch.arange(rows, device=ws.rows_of.device))

    def _prefill(
        self, cache: forward.KVCache, ids: torch.Tensor, pad_p: torch.Tensor, counts: list[int]
    ) -> torch.Tensor:
        """Prefill the prompts ``ids`` [P, L] (left padding ``pad_p``) into the cache rows
        of their ``counts``, in chunks within ``prefill_tokens`` (``forward.prefill_chunks``);
        the last position's logits [P, V], the chunks' in order. Every chunk keeps the
        rollout's slot layout (a prompt's last token at slot L - 1, as one batch puts it):
        it drops only the leading columns that are padding in each of its prompts."""
        n, width = ids.shape
        if not self.prefill_tokens or n * width <= self.prefill_tokens:
            # One batch: today's call exactly (bit for bit), and no host look at lengths.
            self.prefill_shapes = [(n, width)]
            return forward.prefill(self.packed, ids, pad_p, cache, counts, self.dtype)
        lengths = (width - pad_p).tolist()  # once per rollout: the chunks are host decisions
        out, row, self.prefill_shapes = [], 0, []
        for a, b in forward.prefill_chunks(lengths, self.prefill_tokens):
            cut = min(width - max(lengths[a:b]), width - 1)  # a chunk runs >= 1 column
            chunk = ids[a:b, cut:]
            self.prefill_shapes.append((b - a, width - cut))
            out.append(
                forward.prefill(
                    self.packed,
                    chunk,
                    pad_p[a:b] - cut,
                    cache,
                    counts[a:b],
                    self.dtype,
                    first_row=row,
                    first_slot=cut,
                    pad_after=b == n,
                )
            )
            row += sum(counts[a:b])
        return torch.cat(out)

    def _compacted(
        self, root: Workspace, ws: Workspace, real: int, live: torch.Tensor, rows: int, filled: int
    ) -> tuple[Workspace, int]:
        """The ``live`` rows of ``ws`` moved into a workspace of ``rows`` rows (cache slots
        ``[0, filled)``, decode state, output so far); padding rows repeat the last live
        row and count as done. Rows of ``ws`` are written back to ``root`` first.
        The new cache is the first ``rows`` rows of ``root``'s: rows are gathered into a
        temporary one layer at a time, then written over the (earlier) rows they replace."""
        self._write_back(root, ws, real)
        new = self._compact_space(root, rows)
        idx = pad_rows(live, rows)
        for dst, src in ((new.cache.k, ws.cache.k), (new.cache.v, ws.cache.v)):
            for layer in range(dst.shape[0]):
                dst[layer, :, :, :filled] = src[layer, :, :, :filled].index_select(0, idx)
        for name in ("tokens", "left_pad", "done", "out", "out_logp", "rows_of", "room"):
            getattr(new, name).copy_(getattr(ws, name).index_select(0, idx))
        new.done[live.numel() :] = True
        new.pos.copy_(ws.pos)
        new.first_slot.copy_(ws.first_slot)
        return new, live.numel()

    def _compact_space(self, root: Workspace, rows: int) -> Workspace:
        """The workspace of ``rows`` rows that ``root``'s rollouts compact into (made once;
        its cache is a view of ``root``'s first rows)."""
        new = root.compacted.get(rows)
        if new is None:
            view = forward.KVCache(root.cache.k[:, :rows], root.cache.v[:, :rows])
            new = root.compacted[rows] = self._new_workspace(view)
        return new

    @staticmethod
    def _write_back(root: Workspace, ws: Workspace, real: int) -> None:
        """Copy the output of the ``real`` rows of a compacted ``ws`` into their rows of
        ``root`` (where the rollout's result is read from)."""
        if ws is root:
            return
        rows = ws.rows_of[:real]
        root.out.index_copy_(0, rows, ws.out[:real])
        root.out_logp.index_copy_(0, rows, ws.out_logp[:real])
