"""Rollout engines: turn prompts into G sampled completions each.

The interface is small so another engine can sit behind it (the native one does). The HF
engine enforces a time budget per batch from *inside* ``generate`` (a stopping
criterion checked every token): a hung or pathologically slow generation ends
the step with StalledError instead of waiting forever, and the same hook
refreshes the heartbeat so the monitor can tell "slow" from "dead".
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from transformers import StoppingCriteria, StoppingCriteriaList

from grpo_hpc.config.rollout_engine import EngineChoice, choose, choose_for_config
from grpo_hpc.core.errors import StalledError
from grpo_hpc.train.distributed.dist import compute_device
from grpo_hpc.train.rollout.types import (  # noqa: F401 - re-exported for the trainer
    EngineOptions,
    GenerationAborted,
    OnRows,
    RolloutBatch,
    RolloutEngine,
    StopWhen,
    check_rows,
    left_padded,
    repeat_rows,
    rooms,
    to_batch,
)


class _Deadline(StoppingCriteria):
    """Stops generation at the deadline or on request; calls ``tick`` as it goes."""

    def __init__(self, deadline: float, tick: Callable[[], None], abort: Callable[[], bool]):
        self.deadline, self.tick, self.abort = deadline, tick, abort
        self.expired = self.aborted = False

    def __call__(self, input_ids: torch.Tensor, scores: Any, **kwargs: Any) -> torch.Tensor:
        self.tick()
        if time.monotonic() > self.deadline:
            self.expired = True
        elif self.abort():
            self.aborted = True
        done = self.expired or self.aborted
        return torch.full((input_ids.shape[0],), done, dtype=torch.bool, device=input_ids.device)


class _Room(StoppingCriteria):
    """Ends each row at its room (``generate_rows``'s ``answered``): per row, True once it
    has ``room`` new tokens. transformers ends the rows a criterion marks True and pads
    them after, as it does a row that wrote EOS."""

    def __init__(self, room: torch.Tensor, prompt_len: int):
        self.room, self.prompt_len = room, prompt_len

    def __call__(self, input_ids: torch.Tensor, scores: Any, **kwargs: Any) -> torch.Tensor:
        return (input_ids.shape[1] - self.prompt_len) >= self.room


class _StopWhen(StoppingCriteria):
    """Asks ``stop_when`` at every ``check_every``-th new token (below the cap, while some
    row still runs: the native engine's host checks) whether to stop the rollout there."""

    def __init__(
        self,
        stop_when: StopWhen,
        prompt_len: int,
        check_every: int,
        cap: int,
        eos: int,
        room: torch.Tensor,
    ):
        self.stop_when, self.prompt_len = stop_when, prompt_len
        self.check_every, self.cap, self.eos, self.room = check_every, cap, eos, room

    def __call__(self, input_ids: torch.Tensor, scores: Any, **kwargs: Any) -> torch.Tensor:
        t = input_ids.shape[1] - self.prompt_len  # completion columns written, every row
        stop = False
        if t % self.check_every == 0 and t < self.cap:
            # A row that wrote EOS is padded after it, so "has an EOS" is "has ended"; so
            # has a row with its room's tokens (``_Room`` ended it).
            wrote_eos = (input_ids[:, self.prompt_len :] == self.eos).any(1)
            ended = (wrote_eos | (t >= self.room)).tolist()
            stop = not all(ended) and bool(self.stop_when(ended, t))
        return torch.full((input_ids.shape[0],), stop, dtype=torch.bool, device=input_ids.device)


@dataclass
class HFEngine:
    """transformers ``generate`` on the policy model itself (no weight sync needed)."""

    model: torch.nn.Module
    tokenizer: Any
    max_new_tokens: int
    temperature: float
    top_p: float
    timeout_s: float
    synced: bool = False
    """True under FSDP with several ranks: every rank runs the same number of forwards."""
    tick: Callable[[], None] = lambda: None
    abort: Callable[[], bool] = lambda: False
    autocast: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext
    """Context for low-precision generation (bf16/fp16 autocast on GPU)."""
    fp32_head: bool = False
    """Logits in fp32 (``algo.fp32_lm_head``): the distribution the update scores."""
    check_every: int = 16
    """New tokens between the calls of ``generate_rows``'s ``stop_when`` (the native
    engine's host check interval, so both engines ask at the same columns)."""

    hands_over_rows = False
    """transformers' ``generate`` returns every row at the end: no streamed scoring."""
    decode_path = "HF generate"
    """How decoding runs, for the training log's [Kernels] line."""

    def generate(
        self,
        prompts: list[str],
        num_generations: int,
        *,
        greedy: bool = False,
        on_done: OnRows | None = None,
        on_running: OnRows | None = None,
    ) -> RolloutBatch:
        """``on_done`` and ``on_running`` are accepted for the interface and never called."""
        enc = self.tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        counts = [num_generations] * len(prompts)
        return self._rollout(enc.input_ids, enc.attention_mask, counts, greedy, None, None)

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
        ``RolloutEngine.generate_rows``); ``stop_when`` is asked every ``check_every`` new
        tokens; a row stops at its room (``answered``) through a per-row stopping
        criterion. ``sampled_logp`` stays None, as with ``generate``."""
        check_rows(prompt_ids, counts, answered, self.max_new_tokens)
        ids, mask = left_padded(prompt_ids, int(self.tokenizer.pad_token_id))
        return self._rollout(ids, mask, counts, greedy, stop_when, answered)

    def _rollout(
        self,
        ids: torch.Tensor,
        mask: torch.Tensor,
        counts: list[int],
        greedy: bool,
        stop_when: StopWhen | None,
        answered: list[int] | None,
    ) -> RolloutBatch:
        """The rows of the padded prompts ``ids`` [P, L] (``counts[i]`` of prompt i, the
        last ``answered[i]`` ids already its answer): what ``generate`` and
        ``generate_rows`` share."""
        tok = self.tokenizer
        device = compute_device(self.model)
        ids = repeat_rows(ids, counts).to(device)
        mask = repeat_rows(mask, counts).to(device)
        room = rooms(answered, counts, self.max_new_tokens).to(device)
        stop = _Deadline(time.monotonic() + self.timeout_s, self.tick, self.abort)
        criteria: list[StoppingCriteria] = [stop]
        if answered is not None and any(answered):
            # Only where some row has less than the cap: otherwise max_new_tokens is its
            # room and the call stays as it was.
            criteria.append(_Room(room, ids.shape[1]))
        if stop_when is not None:
            eos = int(tok.eos_token_id)
            criteria.append(
                _StopWhen(stop_when, ids.shape[1], self.check_every, self.max_new_tokens, eos, room)
            )
        sampling: dict[str, Any] = {"do_sample": False}
        if not greedy:
            sampling = {"do_sample": True, "temperature": self.temperature, "top_p": self.top_p}
            sampling["top_k"] = 0  # plain temperature sampling over the whole vocabulary
        with torch.no_grad(), self.autocast(), fp32_logits(self.model, self.fp32_head):
            out = self.model.generate(
                input_ids=ids,
                attention_mask=mask,
                max_new_tokens=self.max_new_tokens,
                stopping_criteria=StoppingCriteriaList(criteria),
                pad_token_id=tok.pad_token_id,
                eos_token_id=tok.eos_token_id,
                synced_gpus=self.synced,
                **sampling,
            )
        if stop.expired:
            raise StalledError(
                f"generation exceeded rollout.generation_timeout_s={self.timeout_s:.0f}s"
            )
        if stop.aborted:
            raise GenerationAborted()
        return to_batch(out, mask, ids.shape[1], tok, room)

    def release(self) -> None:
        """Nothing to free: generate's cache lives only while it generates."""

    def set_max_new_tokens(self, cap: int) -> None:
        self.max_new_tokens = cap


@contextlib.contextmanager
def capped(engine: RolloutEngine, cap: int):  # noqa: ANN201
    """While active, ``engine`` generates up to ``cap`` new tokens (then its cap again):
    evaluations keep the configured cap when a rollback raised the rollouts'."""
    before = engine.max_new_tokens
    engine.set_max_new_tokens(cap)
    try:
        yield engine
    finally:
        engine.set_max_new_tokens(before)


@contextlib.contextmanager
def fp32_logits(model: torch.nn.Module, on: bool = True):  # noqa: ANN201
    """While active (and ``on``), the model's LM head computes its logits in fp32, outside
    autocast: HF ``generate`` then samples from the logits the update scores with
    ``algo.fp32_lm_head``."""
    head = model.get_output_embeddings() if on else None
    if head is None:
        yield
        return

    def forward(hidden: torch.Tensor) -> torch.Tensor:
        with torch.autocast(hidden.device.type, enabled=False):
            bias = None if head.bias is None else head.bias.float()
            return torch.nn.functional.linear(hidden.float(), head.weight.float(), bias)

    head.forward = forward
    try:
        yield
    finally:
        del head.forward  # back to the class's forward


def lora_targets_of(model: torch.nn.Module) -> tuple[str, ...]:
    """The names of the modules a peft LoRA model adapts (empty: no LoRA), as
    ``model.lora_target_modules`` names them: what the decision reads on both sides."""
    names = {n.rsplit(".", 1)[-1] for n, m in model.named_modules() if hasattr(m, "lora_A")}
    return tuple(sorted(names))


def choose_engine(name: str, model: torch.nn.Module, tokens: int = 0) -> EngineChoice:
    """``rollout.engine`` decided for this model on its device, by the decision grpo-submit
    makes from config.json before queueing (grpo_hpc.config.rollout_engine.
    choose_for_config), from the same inputs: the model's config, ``tokens`` (the longest
    prompt + completion: Phi-3's longrope limit) and the modules LoRA adapts. ``auto`` ->
    ``native`` on CUDA where it can decode, else ``hf``. What only the loaded model shows
    (a LoRA variant or bias, an attention output bias) is added here. An explicit
    ``native`` that cannot run is a configuration error (said in one line)."""
    from grpo_hpc.core.errors import ConfigError
    from grpo_hpc.train.rollout.native.weights import UnsupportedModel, shape_of

    config = getattr(model, "config", None)
    cuda = compute_device(model).type == "cuda"
    choice = choose_for_config(name, config, cuda, tokens, lora_targets_of(model))
    if choice.engine == "native" and not choice.refusal:
        try:
            shape_of(model)
        except UnsupportedModel as e:
            choice = choose(name, getattr(config, "model_type", None), str(e), cuda)
    if choice.refusal:
        raise ConfigError(choice.refusal)
    return choice


def pick_engine(name: str, model: torch.nn.Module, opts: EngineOptions) -> str:
    """``native`` or ``hf``: :func:`choose_engine`'s engine."""
    return choose_engine(name, model, opts.max_prompt_tokens + opts.max_new_tokens).engine


def build_engine(
    name: str,
    model: torch.nn.Module,
    tokenizer: Any,
    opts: EngineOptions,
    *,
    tick: Callable[[], None],
    abort: Callable[[], bool],
    autocast: Callable[[], contextlib.AbstractContextManager],
) -> RolloutEngine:
    """The engine ``rollout.engine`` names (see :func:`choose_engine`); its ``choice``
    attribute says which and why (the training log's [Speed] line)."""
    common = (model, tokenizer, opts.max_new_tokens, opts.temperature, opts.top_p)
    hooks = {"tick": tick, "abort": abort}
    choice = choose_engine(name, model, opts.max_prompt_tokens + opts.max_new_tokens)
    if choice.engine == "hf":
        engine: RolloutEngine = HFEngine(
            *common,
            opts.timeout_s,
            synced=opts.synced,
            autocast=autocast,
            fp32_head=opts.fp32_lm_head,
            **hooks,
        )
    else:
        from grpo_hpc.train.rollout.native.engine import NativeEngine

        engine = NativeEngine(
            *common,
            opts.timeout_s,
            dtype=opts.dtype,
            max_prompt_tokens=opts.max_prompt_tokens,
            capture_ahead=opts.capture_ahead,
            logp_temperature=opts.logp_temperature,
            fp32_head=opts.fp32_lm_head,
            use_graphs=not opts.eager,
            compile=not opts.eager,
            **hooks,
        )
    engine.choice = choice  # type: ignore[attr-defined] - said in the [Speed] line
    return engine
