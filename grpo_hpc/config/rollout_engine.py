"""What ``rollout.engine`` resolves to, and why: one pure decision that ``grpo-submit``
(on the login node, from the model's ``config.json``) and the trainer (from the loaded
model's config) both make, so the line a submission prints is what the job will do.

- ``hf``: transformers ``generate``, always.
- ``native``: this package's decoder (grpo_hpc.train.rollout.native); refused in one line
  when the architecture is not one it implements (:func:`native_problem`).
- ``auto``: native on a CUDA GPU where the architecture is supported, else HF generate. On
  a CPU the native engine does not pay (59 tok/s against HF's 61 on SmolLM2-135M:
  bench/results/LOG.md, the CPU demo after the engine work), so ``auto`` keeps HF generate there.

Imports nothing but the standard library: the login node reads it (tests/unit/test_layering.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

SUPPORTED_TYPES = (
    "llama",
    "qwen2",
    "mistral",
    "qwen3",
    "olmo2",
    "smollm3",
    "ministral",
    "phi3",
    "gemma3_text",
)
"""HF ``model_type``s whose decoder layer the native engine implements: one layer written
once (grpo_hpc.train.rollout.native.forward) whose switches each family sets: q/k/v bias
(qwen2), q/k RMSNorm per head (qwen3, gemma3_text) or over the whole projection (olmo2),
norms before and/or after attention and MLP (olmo2: after only; gemma3_text: both, as
``1 + w``), sliding-window layers (mistral, ministral, gemma3_text, qwen2/qwen3 with
``use_sliding_window``), layers without rotary (smollm3), per-layer-type rotary tables
(gemma3_text), partial rotary and fused q/k/v and gate/up weights (phi3), scaled
embeddings and GELU-tanh MLP (gemma3_text)."""

ACTIVATIONS = ("silu", "gelu_pytorch_tanh")
"""MLP activations the native engine computes (``hidden_activation`` or ``hidden_act``)."""

HF_SLOWDOWN = "7-14x"
"""How much slower HF ``generate`` decodes than the native engine on a GPU, as measured at
64 rows x 256 new tokens in bf16 over the families the engine decodes: 7.2x (Ministral-8B)
to 14.3x (Gemma-3-1B), Qwen2.5-0.5B 13.5x (one H100 or H200, 2026-11-23 to 11-28:
docs/models.md, "On a GPU"; bench/results/decode_*.json). At 256 rows the gap narrows
(Qwen2.5-0.5B: 9.2x)."""

LORA_PROJECTIONS = (
    "q_proj",
    "k_proj",
    "v_proj",
    "qkv_proj",
    "o_proj",
    "gate_proj",
    "up_proj",
    "gate_up_proj",
    "down_proj",
)
"""The decoder-layer linears the native engine packs, and so the only ones whose LoRA it
folds (Phi-3 fuses q/k/v into ``qkv_proj`` and gate/up into ``gate_up_proj``)."""
LORA_ALL_LINEAR = "all-linear"
"""peft's shorthand for every linear but the output layer: the projections above."""


def _get(cfg: Mapping[str, Any] | Any, key: str, default: Any = None) -> Any:
    """``key`` of a config.json dict or of a transformers config object."""
    if isinstance(cfg, Mapping):
        return cfg.get(key, default)
    return getattr(cfg, key, default)


def _rope_types(cfg: Mapping[str, Any] | Any) -> list[str]:
    """Every rotary type a config names: ``rope_parameters`` (transformers 5; one dict, or
    one per layer type as Gemma 3's) or the older ``rope_scaling``."""
    rope = _get(cfg, "rope_parameters") or _get(cfg, "rope_scaling") or {}
    dicts = [v for v in rope.values() if isinstance(v, Mapping)] or [rope]
    return [str(d.get("rope_type", d.get("type", "default"))) for d in dicts]


def rope_limit(cfg: Mapping[str, Any] | Any) -> int:
    """Longest sequence the native engine's rotary tables hold for: longrope's
    ``original_max_position_embeddings`` (Phi-3/Phi-4-mini: HF switches to the long factors
    past it, which the native engine does not implement), else 0 (any length)."""
    rope = _get(cfg, "rope_parameters") or _get(cfg, "rope_scaling") or {}
    if not isinstance(rope, Mapping) or rope.get("rope_type", rope.get("type")) != "longrope":
        return 0
    limit = rope.get("original_max_position_embeddings")
    return int(limit or _get(cfg, "original_max_position_embeddings", 0) or 0)


def length_problem(cfg: Mapping[str, Any] | Any, tokens: int) -> str | None:
    """Why the native engine cannot decode sequences of ``tokens`` (prompt + completion)
    for this model (one phrase), or None: past :func:`rope_limit`."""
    limit = rope_limit(cfg)
    if limit and tokens > limit:
        return (
            f"sequences of {tokens} tokens (prompt + rollout.max_new_tokens) past longrope's "
            f"original_max_position_embeddings={limit} (its long factors are not native)"
        )
    return None


def needs_prompt_length(cfg: Mapping[str, Any] | Any) -> bool:
    """Whether the decision reads the run's longest prompt at all (a longrope limit):
    elsewhere grpo-submit need not load a tokenizer to measure it."""
    return rope_limit(cfg) > 0


def lora_problem(targets: tuple[str, ...] | list[str]) -> str | None:
    """Why the native engine cannot fold LoRA on ``targets`` (``model.lora_target_modules``
    of a LoRA run, or the adapted modules of a loaded peft model), or None: it folds LoRA
    on :data:`LORA_PROJECTIONS` only (``lm_head``, embeddings: HF generate decodes)."""
    for target in targets:
        name = str(target).rsplit(".", 1)[-1]  # peft matches a target as a name's suffix
        if target != LORA_ALL_LINEAR and name not in LORA_PROJECTIONS:
            return f"LoRA on {target} (it folds LoRA on {', '.join(LORA_PROJECTIONS)} only)"
    return None


def native_problem(
    cfg: Mapping[str, Any] | Any, tokens: int = 0, lora_targets: tuple[str, ...] = ()
) -> str | None:
    """Why the native engine cannot decode a model of this config (a ``config.json`` dict
    or a transformers config object), as a phrase ("model_type 'gpt2'"); None when it can.
    ``tokens``: the longest sequence (prompt + completion) it will decode, where known;
    ``lora_targets``: the modules LoRA adapts (empty: no LoRA). grpo-submit and the trainer
    (grpo_hpc.train.rollout.engines.choose_engine) both ask this, from the same inputs;
    the trainer then adds what only the loaded model shows (a LoRA variant or bias, an
    attention output bias: grpo_hpc.train.rollout.native.architecture.shape_of)."""
    mtype = _get(cfg, "model_type")
    if mtype not in SUPPORTED_TYPES:
        moe = any(_get(cfg, k) for k in ("num_experts", "num_local_experts", "n_routed_experts"))
        return f"model_type {mtype!r}" + (" (a mixture of experts)" if moe else "")
    # Gemma names it hidden_activation (its config.json may carry an unused hidden_act too)
    act = _get(cfg, "hidden_activation") or _get(cfg, "hidden_act", "silu")
    if act not in ACTIVATIONS:
        return f"activation {act!r} (native engine knows {', '.join(ACTIVATIONS)})"
    if any(t.startswith("dynamic") for t in _rope_types(cfg)):
        return "dynamic rotary scaling"
    if _get(cfg, "attn_logit_softcapping") or _get(cfg, "final_logit_softcapping"):
        return "logit soft-capping"
    if _get(cfg, "use_bidirectional_attention"):
        return "bidirectional attention"
    if mtype != "qwen2" and _get(cfg, "attention_bias"):
        return "attention biases (qwen2's q/k/v biases only)"
    if _get(cfg, "mlp_bias"):
        return "MLP biases"
    return lora_problem(lora_targets) or length_problem(cfg, tokens)


@dataclass(frozen=True)
class EngineChoice:
    """The engine that decodes, and why, in words."""

    engine: str
    """``native``, ``hf``, or ``""``: undecided here (config.json not readable)."""
    why: str
    """The reason, as the ``rollout:`` line says it."""
    refusal: str | None = None
    """One line (what is wrong, what to do) when ``rollout.engine=native`` cannot run."""

    @property
    def line(self) -> str:
        """What grpo-submit, --dry-run and the training log's [Speed] line say."""
        if not self.engine:
            return f"rollout: decided at step 0 (config.json not readable here: {self.why})"
        name = "native" if self.engine == "native" else "HF generate"
        return f"rollout: {name}{self.why}"


def choose(setting: str, model_type: str | None, problem: str | None, cuda: bool) -> EngineChoice:
    """``rollout.engine`` resolved for a model (``model_type``; ``problem``: why the native
    engine cannot decode it, :func:`native_problem`, None when it can) on a CUDA GPU or
    not. Pure."""
    if setting == "hf":
        return EngineChoice("hf", " (rollout.engine=hf)")
    if problem and setting == "native":
        refusal = (
            f"rollout.engine=native cannot decode {problem}: use rollout.engine=hf or auto "
            f"(HF generate: rollouts about {HF_SLOWDOWN} slower on a GPU); the native engine "
            f"decodes model_types {', '.join(SUPPORTED_TYPES)}"
        )
        return EngineChoice("native", f" ({model_type}): refused, {problem}", refusal)
    if setting == "native":
        return EngineChoice("native", f" ({model_type})" + ("" if cuda else ", on a CPU"))
    if problem:
        unsupported = (
            f"model_type {model_type} has no native implementation"
            if problem.startswith("model_type")
            else f"the native engine does not decode {problem}"
        )
        if not cuda:
            return EngineChoice("hf", f" (rollout.engine=auto on a CPU; {unsupported} either)")
        return EngineChoice("hf", f", {unsupported}: rollouts about {HF_SLOWDOWN} slower")
    if not cuda:
        return EngineChoice(
            "hf", " (rollout.engine=auto on a CPU: the native engine pays on a GPU only)"
        )
    return EngineChoice("native", f" ({model_type})")


def choose_for_config(
    setting: str,
    cfg: Mapping[str, Any] | Any,
    cuda: bool,
    tokens: int = 0,
    lora_targets: tuple[str, ...] = (),
) -> EngineChoice:
    """:func:`choose` for a model's config (a config.json dict or a transformers config);
    ``tokens``: the longest sequence to decode (longest prompt + max_new_tokens), where
    known; ``lora_targets``: the modules LoRA adapts (empty: no LoRA)."""
    problem = native_problem(cfg, tokens, lora_targets)
    return choose(setting, _get(cfg, "model_type"), problem, cuda)


def undecided(why: str) -> EngineChoice:
    """Where the model's config.json cannot be read: the trainer decides at step 0."""
    return EngineChoice("", why)
