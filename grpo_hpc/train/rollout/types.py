"""What every rollout engine shares: the batch it returns, its interface, its options, the
stop exception, and the conversion of generated ids into a batch.

Both engines (rollout.HFEngine and native.engine.NativeEngine) and the trainer import
this module; it imports no engine, so the dependency runs one way:
rollout -> native.engine -> rollout_types.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import torch

if TYPE_CHECKING:
    from grpo_hpc.config.schema import Config


@dataclass
class RolloutBatch:
    """Token-level view of one batch of completions (rows = prompts x G, grouped)."""

    input_ids: torch.Tensor
    """[N, P+C] left-padded prompt followed by the completion (right-padded)."""
    attention_mask: torch.Tensor
    """[N, P+C] 1 on real prompt tokens and completion tokens up to and including EOS."""
    completion_mask: torch.Tensor
    """[N, C] 1 on completion tokens that count in the loss."""
    prompt_len: int
    """P: padded prompt length (completion starts here)."""
    texts: list[str]
    """Decoded completions, for scoring."""
    pad_token_id: int = 0
    """Token id used for padding."""
    finished: torch.Tensor | None = None
    """[N] bool: True where the completion ended with EOS, False where the length cap cut
    it off."""
    sampled_logp: torch.Tensor | None = None
    """[N, C] log-probability of each completion token under the policy as the engine
    computed it while sampling (native engine only; 0 on masked positions)."""

    @property
    def num_tokens(self) -> int:
        return int(self.completion_mask.sum())


OnRows = Callable[[list[int], list[list[int]]], None]
"""Hears of rollout rows during generation: their row indices and completion tokens
(``on_done``: finished rows, all their tokens; ``on_running``: rows still decoding, the
tokens since the last call)."""

StopWhen = Callable[[list[bool], int], bool]
"""Asked at each host check of :meth:`RolloutEngine.generate_rows` whether to stop the
rollout there: ``stop_when(ended, t)``, ``ended`` one bool per output row (True where the
row has written EOS or reached its room, see ``generate_rows``'s ``answered``), ``t`` the
completion columns every row has so far (a positive multiple of the engine's
``check_every``, below its cap; not asked once every row has ended, the rollout ends there
anyway). True: the rollout returns its ``t`` columns at once; rows that had not ended come
back unfinished (``finished`` False, every column in the completion mask), to be continued
later (partial rollouts). A hook that never says True leaves the rollout exactly as
without it."""


class RolloutEngine(Protocol):
    hands_over_rows: bool
    """``generate`` calls ``on_done`` with rows as they finish and ``on_running`` with the new
    tokens of rows still decoding (native); False: never (hf)."""
    decode_path: str
    """How decoding runs, in words (the training log's [Kernels] line)."""

    def generate(
        self,
        prompts: list[str],
        num_generations: int,
        *,
        greedy: bool = False,
        on_done: OnRows | None = None,
        on_running: OnRows | None = None,
    ) -> RolloutBatch: ...

    def generate_rows(
        self,
        prompt_ids: list[list[int]],
        counts: list[int],
        *,
        greedy: bool = False,
        stop_when: StopWhen | None = None,
        answered: list[int] | None = None,
    ) -> RolloutBatch:
        """``counts[i]`` completions of the token ids ``prompt_ids[i]`` (not padded, no
        special tokens added), rows of prompt i consecutive and in prompt order: the
        prompts are left-padded to the longest and the batch is built as ``generate``'s
        (``generate(prompts, G)`` is this with each prompt's ids and ``[G] * P``). A prompt
        may be a prompt followed by the start of its answer (an unfinished row continued).
        ``stop_when`` (see :data:`StopWhen`) may end the rollout at a host check.
        ``answered[i]``: how many trailing ids of prompt i are already its answer (None:
        all 0). The cap is on the whole answer, so prompt i's rows get at most its *room*,
        ``max_new_tokens - answered[i]`` (>= 1) new tokens: a row that reaches its room
        ends there as a row at the cap does (``finished`` False, no EOS, masked after)."""
        ...

    max_new_tokens: int
    """The cap of the next ``generate``: set through :meth:`set_max_new_tokens`."""

    def release(self) -> None:
        """Free device memory the engine keeps between rollouts (before an update)."""

    def set_max_new_tokens(self, cap: int) -> None:
        """Generate up to ``cap`` new tokens from now on (a rollback's larger cap; an
        evaluation's configured one)."""


class GenerationAborted(Exception):
    """Generation stopped because a stop was requested (signal): the step is abandoned."""


def check_rows(
    prompt_ids: list[list[int]],
    counts: list[int],
    answered: list[int] | None = None,
    cap: int | None = None,
) -> None:
    """Raise ValueError unless ``generate_rows`` can take these: one count (>= 1) per
    prompt, at least one prompt, no empty prompt (its row would start from padding), and
    (where given) one ``answered`` per prompt, each shorter than its prompt (an answer
    follows a prompt) and leaving room for at least one new token under ``cap``."""
    if not prompt_ids:
        raise ValueError("generate_rows: no prompts")
    if len(counts) != len(prompt_ids):
        raise ValueError(f"generate_rows: {len(prompt_ids)} prompts but {len(counts)} counts")
    if min(counts) < 1:
        raise ValueError(f"generate_rows: every count must be >= 1, got {counts}")
    if min(len(p) for p in prompt_ids) == 0:
        raise ValueError("generate_rows: an empty prompt")
    if answered is None:
        return
    if len(answered) != len(prompt_ids):
        raise ValueError(f"generate_rows: {len(prompt_ids)} prompts but {len(answered)} answered")
    for p, a in zip(prompt_ids, answered, strict=True):
        if not 0 <= a < len(p):
            raise ValueError(f"generate_rows: answered {a} of a prompt of {len(p)} ids")
        if cap is not None and cap - a < 1:
            raise ValueError(f"generate_rows: answered {a} leaves no room under the cap {cap}")


def rooms(answered: list[int] | None, counts: list[int], cap: int) -> torch.Tensor:
    """Each output row's room (pure): the new tokens it may have, ``cap - answered[i]`` for
    the ``counts[i]`` rows of prompt i ([N] long; None: every row the cap)."""
    per_prompt = [cap - a for a in answered] if answered is not None else [cap] * len(counts)
    return repeat_rows(torch.tensor(per_prompt, dtype=torch.long), counts)


def left_padded(prompt_ids: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``prompt_ids`` as one [P, L] batch left-padded with ``pad`` to the longest, and its
    attention mask (0 on the padding): what the tokenizer's left padding gives ``generate``."""
    width = max(len(p) for p in prompt_ids)
    ids = torch.full((len(prompt_ids), width), pad, dtype=torch.long)
    mask = torch.zeros((len(prompt_ids), width), dtype=torch.long)
    for i, p in enumerate(prompt_ids):
        ids[i, width - len(p) :] = torch.tensor(p, dtype=torch.long)
        mask[i, width - len(p) :] = 1
    return ids, mask


def repeat_rows(x: torch.Tensor, counts: list[int]) -> torch.Tensor:
    """Row ``i`` of ``x`` repeated ``counts[i]`` times, in order (dim 0). Equal counts take
    the integer path ``generate`` always took; unequal ones a tensor of repeats, with the
    output size given so that a CUDA tensor needs no device sync to size the result."""
    if len(set(counts)) == 1:
        return x.repeat_interleave(counts[0], 0)
    reps = torch.tensor(counts, device=x.device)
    return x.repeat_interleave(reps, 0, output_size=sum(counts))


def row_range(batch: RolloutBatch, lo: int, hi: int) -> RolloutBatch:
    """Rows ``[lo, hi)`` of ``batch`` as a batch of their own (one step's share of a rollout
    that generated several steps' rows), its completion columns cut to its longest."""
    width = int(batch.completion_mask[lo:hi].sum(1).max()) if hi > lo else 0
    end = batch.prompt_len + width

    def rows(x: torch.Tensor | None, cols: int | None) -> torch.Tensor | None:
        return None if x is None else x[lo:hi, :cols] if cols is not None else x[lo:hi]

    return RolloutBatch(
        input_ids=rows(batch.input_ids, end),
        attention_mask=rows(batch.attention_mask, end),
        completion_mask=rows(batch.completion_mask, width),
        prompt_len=batch.prompt_len,
        texts=batch.texts[lo:hi],
        pad_token_id=batch.pad_token_id,
        finished=rows(batch.finished, None),
        sampled_logp=rows(batch.sampled_logp, width),
    )  # type: ignore[arg-type]


def to_batch(
    out: torch.Tensor, prompt_mask: torch.Tensor, p: int, tok: Any, room: torch.Tensor | None = None
) -> RolloutBatch:
    """The batch of the generated ``out`` [N, p + C] (prompts left-padded to ``p``):
    each row's completion runs to its first EOS, included, and at most to its ``room``
    ([N], new tokens the row may have; None: every column): a row stopped by its room
    has no EOS, and the columns past it (padding) are masked out of the completion, the
    attention and the text. ``finished``: an EOS within the room."""
    completion = out[:, p:]
    is_eos = completion == tok.eos_token_id
    # Tokens after the first EOS are padding: mask = positions <= first EOS.
    first_eos = torch.where(
        is_eos.any(1),
        is_eos.int().argmax(1),
        torch.full_like(is_eos[:, 0], completion.shape[1], dtype=torch.long),
    )
    pos = torch.arange(completion.shape[1], device=out.device).unsqueeze(0)
    cmask = (pos <= first_eos.unsqueeze(1)).long()
    finished = is_eos.any(1)
    if room is not None:
        # A row stopped by its room wrote no EOS: its padding after the room would
        # otherwise count (and, where pad is EOS, read as an ending).
        room = room.to(out.device).unsqueeze(1)
        cmask = cmask * (pos < room).long()
        finished = (first_eos.unsqueeze(1) < room).squeeze(1) & finished
    texts = tok.batch_decode(
        completion * cmask + tok.pad_token_id * (1 - cmask), skip_special_tokens=True
    )
    return RolloutBatch(
        input_ids=out,
        attention_mask=torch.cat([prompt_mask, cmask], 1),
        completion_mask=cmask,
        prompt_len=p,
        texts=texts,
        pad_token_id=tok.pad_token_id,
        finished=finished,
    )


@dataclass
class EngineOptions:
    """What every engine needs besides the model (from ``rollout.*`` and the profile)."""

    max_new_tokens: int
    temperature: float
    top_p: float
    timeout_s: float
    dtype: torch.dtype = torch.float32
    """Compute dtype for generation (bf16/fp16 on GPU, fp32 on CPU)."""
    synced: bool = False
    """FSDP with several ranks (HF generate must then keep ranks in step)."""
    lora: bool = False
    """The policy is a peft LoRA model."""
    logp_temperature: float = 1.0
    """The temperature of the distribution the update scores tokens under (the sampling
    temperature with ``algo.tempered_logp``, else 1); the native engine reports its
    log-probs under the same one."""
    fp32_lm_head: bool = False
    """Logits in fp32 while sampling (``algo.fp32_lm_head``)."""
    eager: bool = False
    """Native engine: no CUDA graphs, no torch.compile (``rollout.enforce_eager``)."""
    max_prompt_tokens: int = 0
    """Longest prompt of the run's data in tokens (0: unknown); the native engine sizes its
    KV cache for it once instead of regrowing it."""
    capture_ahead: bool = True
    """Native engine: capture every decode graph of a batch shape at its first rollout
    (off when the engine is released before each update: its graphs would not last)."""

    @classmethod
    def for_run(
        cls, cfg: Config, dtype: torch.dtype, synced: bool, max_prompt_tokens: int
    ) -> EngineOptions:
        """The options a run's config gives (``rollout.*``, ``algo.*``, ``model.lora_rank``),
        with what the trainer knows: the compute ``dtype``, whether FSDP ranks generate in
        step (``synced``), and the longest prompt of its data."""
        return cls(
            cfg.rollout.max_new_tokens,
            cfg.rollout.temperature,
            cfg.rollout.top_p,
            cfg.rollout.generation_timeout_s,
            dtype=dtype,
            synced=synced,
            lora=bool(cfg.model.lora_rank),
            logp_temperature=cfg.logp_temperature,
            fp32_lm_head=cfg.algo.fp32_lm_head,
            eager=cfg.rollout.enforce_eager,
            max_prompt_tokens=max_prompt_tokens,
            capture_ahead=not cfg.rollout.release_engine_memory,
        )
