"""Peak GPU memory per rank, estimated from a model's ``config.json`` and the run's settings.

Pure functions: no weights are read, nothing is allocated. The model is what the trainer
keeps (grpo_hpc/train: models, dist, optimization, update, logp_head, native/weights):

- policy weights: fp32 master copy (autocast computes in bf16/fp16); a LoRA policy keeps its
  frozen base in the compute dtype and only the adapters in fp32;
- gradients (fp32, trainable only) and AdamW's two moments (fp32, trainable only); FSDP2
  shards weights, gradients and moments over the ranks; ``dist.cpu_offload`` moves all
  three to host memory (FSDP2 CPUOffloadPolicy);
- DDP's gradient buckets (one more fp32 copy of the trainable gradients, multi-GPU only)
  and a fixed DDP_RANKS_FIXED_BYTES measured on two ranks;
- parameters from config.json as transformers builds them (tests/unit/memory/
  test_memory_families.py holds the count equal for every bench/shapes config): explicit
  head_dim, tied embeddings, q/k norms, Gemma 3's four norms per layer, fused projections
  (the same count), and every expert of a mixture of experts with its router (all trained:
  gradients and AdamW moments for each);
- the low-precision casts of fp32 weights that backward keeps (the layers that are not
  checkpointed, plus one in flight; the update's autocast keeps no cache); under FSDP2
  the all-gathered bf16/fp16 layers instead (two decoder layers in flight, and the
  root's embedding and head);
- the native engine's packed bf16/fp16 weights (a full, unsharded copy; LoRA folded in;
  under LoRA without FSDP2 only the adapted projections, the frozen base read in place)
  and its static KV cache of rows x (prompt + max_new) slots, both kept for the whole run;
  its prefill runs at most PREFILL_TOKENS padded tokens at once (partial rollouts' long
  continued prompts);
- activations of one micro-batch (``algo.micro_batch_tokens`` padded tokens); with gradient
  checkpointing the layer inputs plus one layer being recomputed; compiled layers
  (``dist.compile``, as ``auto`` resolves it for the submission) keep fewer than eager ones;
- the fused log-prob head: a few ``chunk x vocab`` fp32 logit blocks and its fp32 weight
  gradient accumulator;
- a frozen reference model when ``algo.beta > 0``; the CUDA context.

Calibrated against measured peaks (``torch.cuda.max_memory_allocated``) of the 0.5B, 1.5B and
3B shapes on one H100 (bench/results) and checked against
``bench/results/ladder_h100_2026-11-26.json`` by
``tests/unit/memory/test_memory_ladder.py``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from grpo_hpc.memory.shape import ModelShape

GIB = 2**30
PROMPT_TOKENS = 320
"""Prompt length assumed per row: a chat-formatted GSM8K question with the built-in answer
instruction is 250-320 tokens for Qwen's tokenizer."""
CUDA_CONTEXT_GIB = 0.6
"""CUDA context, cuBLAS workspaces and NCCL buffers: outside torch's allocator."""
FRAGMENTATION = 1.05
"""The headroom: a plan fits when its peak x FRAGMENTATION + the CUDA context is within the
GPU's memory, so the peak estimate may use at most 1/1.05 (95 %) of what the allocator can
get. It covers the caching allocator holding more than it hands out (3.0 GiB, 4 %, unusable
at a 7B OOM on 2x H100) and the estimate's own misses: every measured ladder row peaked
below this line (tests/unit/memory/test_memory_ladder.py holds it)."""
HEAD_CHUNK_TOKENS = 1024
"""grpo_hpc.train.algo.logp_head.DEFAULT_CHUNK_TOKENS."""
ROW_BUCKET, SPAN_BUCKET = 8, 64
"""The native engine pads rows and cache slots to these multiples."""
PREFILL_TOKENS = 16384
"""The native engine prefills a rollout's prompts in chunks of at most this many padded
tokens (``prompts x longest prompt``; a longer prompt alone), the default of
``NativeEngine.prefill_tokens``: its prefill transient is bounded by it, not by every
continued answer of a partial rollout at full length at once."""


@dataclass(frozen=True)
class Settings:
    """The run settings that decide memory (from the resolved config and the profile)."""

    ranks: int = 1
    """Processes sharing the model (FSDP2 shards over them)."""
    strategy: str = "ddp"
    """ddp or fsdp."""
    precision: str = "bf16"
    """fp32, bf16 or fp16 (compute dtype of autocast and of the engine)."""
    rows: int = 64
    """Completions generated per rank per step (prompts per rank x G)."""
    prompt_tokens: int = PROMPT_TOKENS
    max_new_tokens: int = 512
    micro_batch_size: int = 8
    micro_batch_tokens: int = 4096
    gradient_checkpointing: bool = False
    checkpoint_every: int = 1
    """With checkpointing: one decoder layer in this many recomputes (the rest keep all)."""
    lora_rank: int = 0
    lora_targets: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")
    beta: float = 0.0
    engine: str = "native"
    """native (packed weights + static cache) or hf (generate's own cache)."""
    cpu_offload: bool = False
    """FSDP2 CPUOffloadPolicy: sharded weights, gradients and AdamW state in host memory."""
    release_engine: bool = False
    """The native engine frees its packed weights, KV caches and CUDA graphs before each
    update and rebuilds them at the next rollout (``rollout.release_engine_memory``)."""
    compiled_layers: bool = False
    """Decoder layers compiled (``dist.compile`` resolved on): a compiled layer keeps fewer
    activations for backward (COMPILED_INTERMEDIATE_SAVED, COMPILED_HIDDEN_SAVED)."""
    reshard_after_forward: bool = True
    """FSDP2 frees a layer's gathered weights after its forward (``dist.reshard_after_forward``);
    false keeps every layer gathered from its forward to its backward."""
    optim_state: str = "fp32"
    """AdamW's moments (``optim.state``): fp32, or int8 (torchao's AdamW8bit)."""
    staleness: int = 0
    """``algo.max_staleness``: >= 1 generates while the update runs, from a second copy of
    the weights with an engine of its own (docs/async.md); nothing of the engine is then
    released for the update."""
    partial_pool: int = 0
    """``rollout.partial_pool``: the generator's engine decodes the rows of this many steps
    at once (0: one step's), a continued answer's tokens prefilled again as its prompt."""
    rollout_steps: int = 1
    """``rollout.steps_per_generation``: the policy's engine decodes this many steps' rows
    in one rollout (its KV cache and generation transient ``rollout_steps`` times a step's;
    no copy of the weights: the run is otherwise as a synchronous one)."""
    evaluates: bool = True
    """The run evaluates held-out problems while it trains (``training.eval_every`` > 0).
    In an asynchronous run the policy's own engine then allocates a KV cache for the
    evaluation (the rollout's rows: ``evaluation.scoring.eval_chunk``); without evaluation
    it never generates and holds no cache, only its packed weights (built with it)."""

    @property
    def compute_bytes(self) -> int:
        return 4 if self.precision == "fp32" else 2

    @property
    def fsdp(self) -> bool:
        return self.strategy == "fsdp" and self.ranks > 1

    def describe(self) -> str:
        parts = [f"{self.strategy if self.ranks > 1 else 'single GPU'}", self.precision]
        if self.lora_rank:
            parts.append(f"LoRA r={self.lora_rank}")
        if self.gradient_checkpointing:
            every = self.checkpoint_every
            parts.append("gradient checkpointing" + (f" (1 layer in {every})" if every > 1 else ""))
        if self.compiled_layers:
            parts.append("compiled layers")
        if self.optim_state == "int8":
            parts.append("8-bit AdamW state")
        if self.cpu_offload:
            parts.append("optimizer CPU offload")
        if self.release_engine and self.engine == "native" and not self.staleness:
            parts.append("engine released during the update")
        if self.staleness:
            parts.append(f"generation overlapped (max_staleness={self.staleness})")
        if self.rollout_steps > 1:
            parts.append(f"{self.rollout_steps} steps' rows a rollout")
        if self.engine == "hf":
            parts.append("HF generate")
        parts.append(f"micro_batch_tokens={self.micro_batch_tokens}")
        return ", ".join(parts)


@dataclass(frozen=True)
class Estimate:
    """Peak memory per rank, by component (bytes). ``peak_bytes`` is the larger of the
    generation and update phases; ``total_gib`` adds fragmentation and the CUDA context."""

    weights: int
    grads: int
    optimizer: int
    ddp_buckets: int
    compute_weights: int
    """Low-precision weight casts kept for backward (DDP, one GPU) or FSDP2's gathered
    layers."""
    engine_weights: int
    kv_cache: int
    activations: int
    logp_head: int
    reference: int
    generation_transient: int
    micro_batch_tokens: int
    optimizer_step: int = 0
    """Transient of the optimizer step beyond the resident state (torchao's int8 step:
    one parameter's moments dequantized to fp32, and its update)."""
    engine_released: bool = False
    """The engine's weights and cache are freed while the update runs."""
    shadow: int = 0
    """An asynchronous run's copy of the weights its generator reads, with that copy's
    engine (the native engine's packed weights and KV cache; resident)."""
    overlapped: int = 0
    """What generation holds while the update and the optimizer step run, in an
    asynchronous run (its transient, HF generate's cache)."""
    """Padded tokens in the largest micro-batch."""

    @property
    def resident(self) -> int:
        """Kept across phases: weights, optimizer state, engine copy and cache, reference."""
        kept = self.weights + self.optimizer + self.engine_weights + self.kv_cache
        return kept + self.reference + self.shadow

    @property
    def generate_bytes(self) -> int:
        return self.resident + self.generation_transient

    @property
    def update_bytes(self) -> int:
        released = self.engine_weights + self.kv_cache if self.engine_released else 0
        return (
            self.resident
            - released
            + self.grads
            + self.ddp_buckets
            + self.compute_weights
            + self.activations
            + self.logp_head
            + self.overlapped
        )

    @property
    def step_bytes(self) -> int:
        """The optimizer step: the update's state without its activations, plus the step's
        own transient."""
        released = self.engine_weights + self.kv_cache if self.engine_released else 0
        kept = self.resident - released + self.grads + self.ddp_buckets
        return kept + self.optimizer_step + self.overlapped

    @property
    def peak_phase(self) -> str:
        phases = {
            "update": self.update_bytes,
            "generate": self.generate_bytes,
            "optimizer step": self.step_bytes,
        }
        return max(phases, key=lambda k: phases[k])  # ties: the first (update)

    @property
    def peak_bytes(self) -> int:
        """What ``torch.cuda.max_memory_allocated`` should report."""
        return max(self.generate_bytes, self.update_bytes, self.step_bytes)

    @property
    def peak_gib(self) -> float:
        return self.peak_bytes / GIB

    @property
    def total_gib(self) -> float:
        """What the GPU must hold: allocator peak, its slack, and the CUDA context."""
        return self.peak_gib * FRAGMENTATION + CUDA_CONTEXT_GIB

    def breakdown(self) -> dict[str, float]:
        keys = [f.name for f in dataclasses.fields(self) if f.type in (int, "int")]
        keys.remove("micro_batch_tokens")
        return {k: round(getattr(self, k) / GIB, 3) for k in keys}


INT8_STATE_BYTES = 2 + 2 * 4 / 256
"""Bytes a parameter of torchao's AdamW8bit moments: two int8 codes, and for each moment one
fp32 scale per block of 256 values (its default block size). 7B full-parameter on 2x H100
with it: 54.9 GiB measured, 60.8 GiB estimated
(bench/results/archive/trl_ladder_7b_h100x4_2026-11-26.md)."""

LORA_HIDDEN_SAVED = 12
"""Hidden-sized tensors a LoRA decoder layer keeps per token for backward: fewer than full
fine-tuning's ~20, since a frozen linear keeps its weight, not its input. Fitted on the
1- and 2-GPU ladder (bench/results/ladder_h100_2026-11-26.json, LoRA rows 0.5B-7B, bf16 and
fp16) and the model families' rows (bench/results/ladder_families_h200_2026-11-28.json):
10 left Qwen3-1.7B's measured peak above the line a plan must fit under (23.15 GiB against
22.70), and every LoRA row but Phi-4-mini's 0.5-2.1 GiB above the estimate; at 12 every
row is under the line and within 15 % (tests/unit/memory/test_memory_ladder.py)."""
DDP_RANKS_FIXED_BYTES = int(0.45 * GIB)
"""What a DDP step on two ranks held beyond the same step on one GPU, besides the gradient
buckets: 0.43-0.46 GiB at every LoRA shape of the ladder, 0.5B to 7B, where the buckets
are a few MB (2x H100, 2026-11-26, bench/results/ladder_h100_2026-11-26.json). Where it comes from
(the
reducer's state, collectives' buffers in PyTorch's allocator) is not pinned down."""
LORA_FIXED_BYTES = 2**30
"""What the LoRA rows of the ladder held beyond the per-layer model, about 1 GiB at every
size (fitted with LORA_HIDDEN_SAVED; where it comes from is not pinned down)."""


COMPILED_INTERMEDIATE_SAVED, COMPILED_HIDDEN_SAVED = 2, 19
"""Intermediate- and hidden-sized tensors a compiled, fully trained decoder layer keeps per
token (compute dtype), against eager's 4 and 20: the compiled backward keeps gate and up
and recomputes the cheap pointwise work. Fitted on one H100 (bench/results/LOG.md, the
default step measured as it runs) to stay at or above every measured peak: the 1.5B step
without recompute and with every other layer recomputed (~85 KB per token and layer kept,
2 and 17 would give 88 KB), and the one-GPU ladder rows of ``ladder_auto24.json``
(0.5B-3B, compiled, no recompute; 2 and 18 meet the 3B row's peak, 19 leaves a margin)."""


def _round_up(n: int, k: int) -> int:
    return -(-n // k) * k


def family_saved(shape: ModelShape) -> int:
    """Elements per token a decoder layer keeps for backward beyond the calibrated Qwen2.5
    layer (whose query and attention output are hidden-sized, with two norms and no q/k
    norms): the query and attention output where heads x head_dim exceeds hidden (Qwen3
    0.6B: twice), each extra norm's input and output (Gemma 3), the q/k norms' inputs, a
    router's logits. Counted from the shapes, not yet measured (no ladder row of these
    families: docs/models.md)."""
    h, q = shape.hidden, shape.heads * shape.head_dim
    kv = shape.kv_heads * shape.head_dim
    wider_q = 2 * max(0, q - h)
    extra_norms = 2 * (shape.norms - 2) * h
    qk_norms = q + kv if shape.qk_norm else 0
    return wider_q + extra_norms + qk_norms + shape.experts


def micro_tokens(s: Settings) -> int:
    """Padded tokens of the largest micro-batch (every row at full length: the worst case,
    and what a random or rambling policy produces). Packed micro-batches (``algo.packing``)
    count real tokens against the same budget, so at full length they hold the same rows
    and tokens: the worst case, hence the estimate, is the same with and without packing
    (the packed attention builds no [T, T] mask)."""
    row = s.prompt_tokens + s.max_new_tokens
    by_tokens = s.micro_batch_tokens // row if s.micro_batch_tokens else s.micro_batch_size
    return max(1, min(s.micro_batch_size, by_tokens, s.rows)) * row


def estimate(shape: ModelShape, s: Settings) -> Estimate:
    """Peak GPU memory per rank of one GRPO step (pure)."""
    p, c, n = shape.params, s.compute_bytes, s.ranks
    lora = s.lora_rank > 0
    trainable = shape.lora_params(s.lora_rank, s.lora_targets) if lora else p
    # Frozen LoRA base in the compute dtype; otherwise fp32 master weights.
    weight_bytes = c * p + 4 * trainable if lora else 4 * p
    shard = n if s.fsdp else 1
    on_gpu = 0 if (s.cpu_offload and s.fsdp) else 1
    weights = on_gpu * weight_bytes // shard
    grads = on_gpu * 4 * trainable // shard
    # fp32 moments: the trainer's AdamW is fused on the GPU (FSDP2 included) and updates in
    # place, with no temporary (torch's foreach default would add 4 * trainable / shard).
    # int8 moments: a quarter of that, and torchao's step dequantizes one parameter's two
    # moments to fp32 beside its update: the largest trained tensor (the embedding or the
    # head) x 12 bytes, per shard.
    int8 = s.optim_state == "int8"
    optimizer = int(on_gpu * (INT8_STATE_BYTES if int8 else 8) * trainable) // shard
    head_w = shape.vocab * shape.hidden
    largest = 0 if lora else head_w
    optimizer_step = on_gpu * 12 * largest // shard if int8 else 0
    ddp = n > 1 and not s.fsdp
    ddp_buckets = 4 * trainable + DDP_RANKS_FIXED_BYTES if ddp else 0
    if s.fsdp:  # two gathered decoder layers in flight (every layer when none is resharded
        # after its forward), the gathered root (embedding, head), and one layer's unsharded
        # fp32 gradient before its reduce-scatter
        gathered = 2 if s.reshard_after_forward else shape.layers
        compute = c * (gathered * shape.layer_params + shape.embed_params) + 4 * shape.layer_params
    elif lora or s.precision == "fp32":
        compute = 0  # weights are already in the compute dtype: autocast caches nothing
    else:
        # The update's autocast keeps no cast cache (optimization.autocast_factory): a layer
        # casts its weights as it runs them, and only a layer that is not checkpointed keeps
        # its casts for backward (plus one layer's in flight). Compiled layers cast inside
        # their graph and behave the same. Measured without the cache on an H100: eager
        # 1.5B, every layer checkpointed, 2.44 GiB lower (the whole bf16 copy of its
        # layers; bench/results/h100_update_eager_autocast_*_qwen2.5-1.5b.json).
        every = max(1, s.checkpoint_every) if s.gradient_checkpointing else 0
        kept = shape.layers - (-(-shape.layers // every)) if every else shape.layers
        compute = c * shape.layer_params * (kept + 1)
    native = s.engine == "native"  # LoRA too: adapters are folded into the packed copy
    if native and lora and not s.fsdp:  # the frozen base is read in place, not copied
        engine_weights = c * shape.packed_adapted_params(s.lora_targets)
    else:  # fp32 master weights or FSDP2 shards: a full low-precision copy
        engine_weights = c * p if native else 0
    slots = s.prompt_tokens + s.max_new_tokens
    decoded = s.rows * s.rollout_steps  # rows a rollout decodes at once
    rows = _round_up(decoded, ROW_BUCKET) if native else decoded
    slots = _round_up(slots, SPAN_BUCKET) if native else slots
    # Every layer at full capacity, sliding-window layers too (Gemma 3, Mistral/Ministral):
    # the native engine's KVCache is one [layers, rows, kv_heads, capacity, head_dim] tensor
    # (train/rollout/native/forward.py), and HF generate's cache is held to the same bound.
    kv = rows * slots * shape.layers * 2 * shape.kv_heads * shape.head_dim * c
    # The native engine keeps its cache across steps; HF generate's lives while it generates.
    kv_resident, kv_transient = (kv, 0) if native else (0, kv)
    # An asynchronous run's rollouts decode in the copy's engine (its cache is in
    # ``shadow``): the policy's engine allocates one only for an evaluation. Measured on one
    # H200 without evaluation (bench/results/LOG-speed.md, 2026-12-05): the asynchronous
    # peak over the synchronous one was 8.7 GiB (Qwen2.5-1.5B) and 17.5 GiB (Llama-3.1-8B
    # LoRA), the copy, its packed weights and one cache; counting a second cache said 16.4
    # and 35.0.
    kv_policy = kv_resident if (not s.staleness or s.evaluates) else 0
    copy_bytes = 4 * trainable if (lora and not s.fsdp) else weight_bytes
    tokens = micro_tokens(s)
    h, i = shape.hidden, shape.active_intermediate  # a token's routed experts under MoE
    # fp32 residual stream when the embedding is fp32 (autocast over fp32 weights).
    resid = c if (lora or s.fsdp) else 4
    # Bytes per token one decoder layer keeps for backward: gate, up, silu(gate) and their
    # product (the product only as the input of a trained down projection), plus
    # hidden-sized tensors (norms, q/k/v, attention output, residuals): ~20 when every
    # linear is trained, LORA_HIDDEN_SAVED when frozen linears keep no inputs.
    mlp_saved = 3 if lora and "down_proj" not in s.lora_targets else 4
    per_layer = mlp_saved * c * i + (LORA_HIDDEN_SAVED if lora else 20) * c * h
    if s.compiled_layers and not lora:  # LoRA layers were not measured compiled
        per_layer = COMPILED_INTERMEDIATE_SAVED * c * i + COMPILED_HIDDEN_SAVED * c * h
    per_layer += c * family_saved(shape)
    if s.gradient_checkpointing:
        # Checkpointed layers keep their input; the others keep everything; one layer is
        # being recomputed at a time.
        ckpt = -(-shape.layers // max(1, s.checkpoint_every))
        kept = (shape.layers - ckpt) * per_layer
        activations = tokens * (ckpt * resid * h + kept + per_layer)
    else:
        activations = tokens * shape.layers * per_layer
    activations += LORA_FIXED_BYTES if lora else 0
    chunk = min(HEAD_CHUNK_TOKENS, tokens)
    head_cast = 0 if (s.fsdp or lora or c == 4) else c * head_w
    head_grad = 0 if lora else 4 * head_w
    logp_head = 3 * chunk * shape.vocab * 4 + head_cast + head_grad
    reference = (c * p if lora else 4 * p) // shard if s.beta > 0 else 0
    prompts = rows if not native else max(1, decoded // 8)
    transient = prompts * s.prompt_tokens * (3 * c * i + 8 * c * h)
    kv_shadow, shadow_transient = kv_resident, transient + kv_transient
    if s.partial_pool:  # P steps' rows; a continued row's prompt holds up to a cap's tokens
        pool_rows = s.rows * s.partial_pool  # HF generate's cache too: it decodes them all
        pool_rows = _round_up(pool_rows, ROW_BUCKET) if native else pool_rows
        pool_slots = s.prompt_tokens + 2 * s.max_new_tokens
        pool_slots = _round_up(pool_slots, SPAN_BUCKET) if native else pool_slots
        pool_kv = pool_rows * pool_slots * shape.layers * 2 * shape.kv_heads * shape.head_dim * c
        kv_shadow = pool_kv if native else 0
        # worst case: every row continued, each its prompt and a cap's tokens as its prompt.
        # HF generate prefills them all at once; the native engine in chunks of at most
        # PREFILL_TOKENS padded tokens (NativeEngine.prefill_tokens), or one longer prompt.
        longest = s.prompt_tokens + s.max_new_tokens
        prefilled = s.rows * s.partial_pool * longest
        if native:
            prefilled = min(prefilled, max(PREFILL_TOKENS, longest))
        shadow_transient = prefilled * (
            3 * c * shape.active_intermediate + 8 * c * shape.hidden
        ) + (0 if native else pool_kv)
    return Estimate(
        weights=weights,
        grads=grads,
        optimizer=optimizer,
        ddp_buckets=ddp_buckets,
        compute_weights=compute,
        engine_weights=engine_weights,
        kv_cache=kv_policy,
        activations=activations,
        logp_head=logp_head,
        reference=reference,
        generation_transient=transient + kv_transient,
        micro_batch_tokens=tokens,
        optimizer_step=optimizer_step,
        engine_released=native and s.release_engine and not s.staleness,
        # the generator's copy of the weights and its own engine (packed copy, KV cache):
        # the policy's engine stays for the held-out evaluation. The copy is whole on every
        # rank, FSDP2's too (weight_bytes, not divided by the shards: each rank generates
        # from a full copy gathered after each update, a tensor at a time, no second copy);
        # a LoRA copy shares the frozen base where the policy keeps its parameters
        # (making.plain_copy): its adapters alone
        shadow=copy_bytes + engine_weights + kv_shadow if s.staleness else 0,
        overlapped=shadow_transient if s.staleness else 0,
    )
