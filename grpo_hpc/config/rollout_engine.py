"""What ``rollout.engine`` resolves to, and why: one pure decision that ``grpo-submit``
(on the login node, from the model's ``config.json``) and the trainer (from the loaded
model's config) both make, so the line a submission prints is what the job will do.

- ``hf``: transformers ``generate``, always.
- ``native``: this package's decoder (grpo_hpc.train.rollout.native); refused in one line
  when the architecture is not one it implements (:func:`native_problem`).
- ``auto``: native on a CUDA GPU where the architecture is supported, else HF generate. On
  a CPU the native engine does not pay (59 tok/s against HF's 61 on SmolLM2-135M:
  bench/results/LOG.md, the CPU demo after issue 24), so ``auto`` keeps HF generate there.

Imports nothing but the standard library: the login node reads it (tests/unit/test_layering.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

SUPPORTED_TYPES = ("llama", "qwen2", "mistral")
"""HF ``model_type``s whose decoder layer the native engine implements (RMSNorm, rotary
attention with optional q/k/v bias, SwiGLU MLP)."""

MISTRAL_DEFAULT_WINDOW = 4096
"""transformers' ``MistralConfig.sliding_window`` when config.json leaves it out."""

HF_SLOWDOWN = "9-13x"
"""How much slower HF ``generate`` decodes than the native engine on a GPU, as measured:
one H100, Qwen2.5-0.5B shape, bf16, 256 new tokens: 31,778 against 2,357 tok/s at 64 rows
(13.5x), 74,436 against 8,066 at 256 rows (9.2x) (bench/README.md, "Rollout speed per
engine"; bench/results/decode_qwen2.5-0.5b_h100_2026-11-23.json)."""

ENGINES = ("auto", "native", "hf")


def _get(cfg: Mapping[str, Any] | Any, key: str, default: Any = None) -> Any:
    """``key`` of a config.json dict or of a transformers config object."""
    if isinstance(cfg, Mapping):
        return cfg.get(key, default)
    return getattr(cfg, key, default)


def native_problem(cfg: Mapping[str, Any] | Any) -> str | None:
    """Why the native engine cannot decode a model of this config (a ``config.json`` dict
    or a transformers config object), as a phrase ("model_type 'qwen3' (...)"); None when
    it can. The trainer's check (grpo_hpc.train.rollout.native.weights.shape_of) is this
    one, plus what only the loaded model shows (its LoRA adapters)."""
    mtype = _get(cfg, "model_type")
    if mtype not in SUPPORTED_TYPES:
        return f"model_type {mtype!r} (native engine knows {', '.join(SUPPORTED_TYPES)})"
    act = _get(cfg, "hidden_act", "silu")
    if act != "silu":
        return f"activation {act!r} (native engine knows silu)"
    # a config object carries transformers' default; a config.json may leave it out
    window = _get(
        cfg, "sliding_window", MISTRAL_DEFAULT_WINDOW if isinstance(cfg, Mapping) else None
    )
    if _get(cfg, "use_sliding_window", False) or (mtype == "mistral" and window):
        return "sliding-window attention"
    rope = _get(cfg, "rope_parameters") or _get(cfg, "rope_scaling") or {}
    if str(rope.get("rope_type", rope.get("type", "default"))).startswith("dynamic"):
        return "dynamic rotary scaling"
    return None


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
            f"(HF generate), or a {'/'.join(SUPPORTED_TYPES)} model without a sliding window"
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


def choose_for_config(setting: str, cfg: Mapping[str, Any] | Any, cuda: bool) -> EngineChoice:
    """:func:`choose` for a model's config (a config.json dict or a transformers config)."""
    return choose(setting, _get(cfg, "model_type"), native_problem(cfg), cuda)


def undecided(why: str) -> EngineChoice:
    """Where the model's config.json cannot be read: the trainer decides at step 0."""
    return EngineChoice("", why)
