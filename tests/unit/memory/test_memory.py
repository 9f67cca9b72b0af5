"""The memory estimator: parameter counts against real models, peaks against the measured
benchmark files, and grpo-submit's refusal/acceptance as a user runs it."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from grpo_hpc.config.load import build_config
from grpo_hpc.config.profiles import load_profile
from grpo_hpc.core.errors import ConfigError, ExitCode
from grpo_hpc.memory import estimate as memory
from grpo_hpc.memory import fit as memory_fit
from grpo_hpc.memory import plan as memory_plan
from grpo_hpc.submit.plan import resolve
from tests.conftest import run_cli

ROOT = Path(__file__).resolve().parents[3]
SHAPES = ROOT / "bench" / "shapes"
RESULTS = ROOT / "bench" / "results"
SIZES = ["qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-3b", "qwen2.5-7b"]


def shape(name: str) -> memory.ModelShape:
    return memory.ModelShape.from_config(json.loads((SHAPES / name / "config.json").read_text()))


@pytest.mark.parametrize("name", SIZES)
def test_parameter_count_matches_the_real_model(name: str) -> None:
    """The count from config.json equals the parameters transformers builds (on the meta
    device: no memory, no weights)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(SHAPES / name))
    real = sum(p.numel() for p in model.parameters())  # tied weights are counted once
    assert shape(name).params == real


def test_lora_parameter_count_matches_peft() -> None:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM

    targets = ("q_proj", "k_proj", "v_proj", "o_proj")
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(SHAPES / SIZES[0]))
    model = get_peft_model(model, LoraConfig(r=16, target_modules=list(targets)))
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert shape(SIZES[0]).lora_params(16, targets) == trainable


CALIBRATION = (
    # bench/trl/baseline.py: the trainer's step beside TRL's; then the same, token budget
    # 4096 + checkpointing
    "trl_side_by_side_qwen2.5-0.5b_h100_2026-11-23.json",
    "trl_side_by_side_qwen2.5-0.5b_h100_2026-11-23_gradckpt.json",
    # bench/speed/grpo_step.py (bench/gpu.sh random, stage multi)
    "grpo_step_1gpu_ddp_h200_2026-11-23.json",
    "grpo_step_2gpu_ddp_h200x2_2026-11-23.json",
    "grpo_step_2gpu_fsdp_h200x2_2026-11-23.json",
)
"""The bench/results files whose peaks the estimator is held to, by name: the 0.5B
native-engine steps with a token budget that record the trainer's own peak. A file
measured later joins by being named here (bench/README.md lists every file a test reads)."""


def _measured_rows() -> list[tuple[str, memory.Settings, float]]:
    """(file, settings, measured max_memory_allocated GiB) of each CALIBRATION file."""
    rows = []
    for name in CALIBRATION:
        data = json.loads((RESULTS / name).read_text())
        run = data.get("grpo_hpc", data)  # trl_baseline.py's files hold both sides
        cfg, median = run["config"], run["median"]
        assert cfg["shape"] == "qwen2.5-0.5b" and cfg["engine"] == "native", name
        s = memory.Settings(
            ranks=cfg["nproc"],
            strategy=cfg["strategy"],
            precision=cfg["precision"],
            rows=cfg["prompts"] // cfg["nproc"] * cfg["G"],
            prompt_tokens=310,  # the trainer's prompts in these runs (bench README)
            max_new_tokens=cfg["max_new"],
            micro_batch_size=cfg["micro"],
            micro_batch_tokens=cfg["micro_tokens"],
            gradient_checkpointing=cfg["grad_ckpt"],
            engine=cfg["engine"],
        )
        rows.append((name, s, median["gpu_mem_gb"]))
    return rows


def test_estimate_within_15_percent_of_measured_benchmarks() -> None:
    rows = _measured_rows()
    assert len(rows) == 5
    bench_shape = memory.ModelShape.from_config(
        {**json.loads((SHAPES / SIZES[0] / "config.json").read_text()), "model_type": "llama"}
    )  # bench/common.py builds the 0.5B shape as a Llama (no q/k/v bias)
    for name, s, measured in rows:
        est = memory.estimate(bench_shape, s).peak_gib
        assert abs(est / measured - 1) <= 0.15, (name, est, measured)


def _async_measured() -> list[tuple[str, memory.Settings, float]]:
    """(shape, settings, measured peak GiB) of the long-tail runs on one H200, 2026-12-05,
    synchronous and asynchronous, no evaluation (bench/results/LOG-speed.md): Qwen2.5-1.5B
    (the runs' median step peak, ``longtail_qwen_*_k{0,1}.json``) and the synchronous
    Llama-3.1-8B LoRA r16 run (the highest step peak of its ``metrics.jsonl``). Its
    asynchronous run (62.6 GiB) predates the copy's shared LoRA base and is not held here:
    the next GPU call re-measures it (docs/async.md)."""
    rows = []
    for shape, lora, prompts, compiled, ks in (
        ("qwen2.5-1.5b", 0, 8, True, (0, 1)),
        ("llama-3.1-8b", 16, 4, False, (0,)),
    ):
        for k in ks:
            if lora:
                f = RESULTS / f"longtail_lora8b_h200_2026-12-05_k{k}_metrics.jsonl"
                peak = max(json.loads(x)["gpu_mem_gb"] for x in f.read_text().splitlines())
            else:
                f = RESULTS / f"longtail_qwen_h200_2026-12-05_k{k}.json"
                peak = json.loads(f.read_text())["median"]["gpu_mem_gb"]
            s = memory.Settings(
                rows=prompts * 8,
                max_new_tokens=4096,
                micro_batch_size=32,
                micro_batch_tokens=18432,
                gradient_checkpointing=True,
                lora_rank=lora,
                compiled_layers=compiled,  # dist.compile=auto: on for full parameters on an H200
                staleness=k,
                evaluates=False,
            )
            rows.append((shape, s, peak))
    return rows


def _shape(name: str) -> memory.ModelShape:
    return memory.ModelShape.from_config(json.loads((SHAPES / name / "config.json").read_text()))


def test_an_asynchronous_peak_counts_one_cache_when_nothing_evaluates() -> None:
    """Held to the measured peaks: each within 15 % (the calibration rule above), and what
    asynchrony adds on Qwen2.5-1.5B within 10 % of what it added on the GPU (8.7 GiB: the
    copy, its packed weights, one KV cache). Counting the policy's cache too, which nothing
    allocates without an evaluation, said 16.4."""
    est, seen = {}, {}
    for shape, s, measured in _async_measured():
        est[shape, s.staleness] = e = memory.estimate(_shape(shape), s)
        seen[shape, s.staleness] = measured
        assert abs(e.peak_gib / measured - 1) <= 0.15, (shape, s.staleness, e.peak_gib, measured)
        if s.staleness:
            sync = est[shape, 0]
            added = (e.peak_bytes - sync.peak_bytes) / memory.GIB
            assert abs(added / (measured - seen[shape, 0]) - 1) <= 0.10, added
            # with an evaluation the policy's engine allocates a cache of the rollout's rows
            evaluating = memory.estimate(_shape(shape), replace(s, evaluates=True))
            assert evaluating.kv_cache == sync.kv_cache > 0 and e.kv_cache == 0


def test_a_lora_copy_holds_its_adapters_not_the_base() -> None:
    """The asynchronous copy of a LoRA policy shares the frozen base (one GPU or DDP:
    tests/unit/train/rollout/test_shadow_copy.py); under FSDP2 it keeps whole weights."""
    shape, s = _shape("llama-3.1-8b"), _async_measured()[2][1]
    base = 2 * shape.params  # the frozen base in bf16
    one = memory.estimate(shape, replace(s, staleness=1))
    sharded = memory.estimate(shape, replace(s, staleness=1, ranks=2, strategy="fsdp"))
    assert sharded.shadow - one.shadow >= base
    assert one.shadow < base / 4 + one.engine_weights + memory.estimate(shape, s).kv_cache


def test_several_steps_batches_from_one_rollout_hold_their_rows_and_no_copy() -> None:
    """``rollout.steps_per_generation=M``: the policy's own engine decodes M steps' rows at
    once, so its cache and generation transient are those of a synchronous step of M times
    the prompts; there is no copy of the weights, and the update's terms are a step's.
    Arithmetic, not measured on a GPU (docs/async.md)."""
    cfg = build_config("tiny", ["algo.max_staleness=2", "rollout.steps_per_generation=3"])
    s = memory_plan.settings_of(cfg)
    assert s.staleness == 0 and s.rollout_steps == 3
    assert "3 steps' rows a rollout" in s.describe()
    shape, base = _shape("qwen2.5-1.5b"), _async_measured()[1][1]
    sync = replace(base, staleness=0)
    grouped = memory.estimate(shape, replace(sync, rollout_steps=3))
    wide = memory.estimate(shape, replace(sync, rows=sync.rows * 3))
    assert grouped.kv_cache == wide.kv_cache > memory.estimate(shape, sync).kv_cache
    assert grouped.generation_transient == wide.generation_transient
    assert grouped.shadow == 0 and grouped.overlapped == 0
    assert grouped.activations == memory.estimate(shape, sync).activations


def test_a_partial_pool_holds_its_steps_rows_with_continued_prompts() -> None:
    """``rollout.partial_pool=P``: the generator's cache holds P steps' rows, each with room
    for a continued answer's tokens as its prompt (prompt + 2 caps), and its prefill may
    take every row at full length, which the native engine runs in chunks of at most
    PREFILL_TOKENS padded tokens (one longer prompt alone); the policy's own terms do not
    move. Arithmetic, not measured on a GPU (docs/async.md)."""
    shape, s = _shape("qwen2.5-1.5b"), replace(_async_measured()[1][1], staleness=2)
    plain = memory.estimate(shape, s)
    pooled = memory.estimate(shape, replace(s, partial_pool=2))
    per_slot = shape.layers * 2 * shape.kv_heads * shape.head_dim * s.compute_bytes
    rows = -(-s.rows * 2 // 8) * 8
    slots = -(-(s.prompt_tokens + 2 * s.max_new_tokens) // 64) * 64
    assert pooled.shadow - plain.shadow == rows * slots * per_slot - plain_kv(shape, s)
    # The prefill's transient per token, the estimate's formula for every prefill.
    c = s.compute_bytes
    per_token = 3 * c * shape.active_intermediate + 8 * c * shape.hidden
    longest = s.prompt_tokens + s.max_new_tokens
    # 128 continued rows of 4,416 tokens (41 GiB at once): one chunk of the budget (1.2 GiB)
    assert longest < memory.PREFILL_TOKENS and s.rows * 2 * longest > 30 * memory.PREFILL_TOKENS
    assert pooled.overlapped == memory.PREFILL_TOKENS * per_token > plain.overlapped
    # a cap past the budget: one continued prompt is a chunk of its own
    cap = 5 * memory.PREFILL_TOKENS
    long = memory.estimate(shape, replace(s, partial_pool=2, max_new_tokens=cap))
    assert long.overlapped == (s.prompt_tokens + cap) * per_token
    assert pooled.kv_cache == plain.kv_cache and pooled.activations == plain.activations
    # no effect on a synchronous run
    sync = replace(s, staleness=0)
    assert memory.estimate(shape, replace(sync, partial_pool=2)) == memory.estimate(shape, sync)
    # HF generate decodes P steps' rows too, its cache held while it generates: every row
    # continued, prefilled at once, plus that cache
    hf = replace(s, engine="hf")
    hf_pooled = memory.estimate(shape, replace(hf, partial_pool=2))
    hf_kv = s.rows * 2 * (s.prompt_tokens + 2 * s.max_new_tokens) * per_slot
    assert hf_pooled.overlapped == s.rows * 2 * longest * per_token + hf_kv


def plain_kv(shape: memory.ModelShape, s: memory.Settings) -> int:
    """The generator's cache of one step's rows (the native engine's buckets)."""
    rows = -(-s.rows // 8) * 8
    slots = -(-(s.prompt_tokens + s.max_new_tokens) // 64) * 64
    return rows * slots * shape.layers * 2 * shape.kv_heads * shape.head_dim * s.compute_bytes


def _check(profile: str, *overrides: str) -> memory_plan.Check:
    over = [f"model.name_or_path={SHAPES / 'qwen2.5-7b'}", *overrides]
    return resolve("gsm8k", over, load_profile(profile), "r")[1]


def test_7b_targets() -> None:
    full_sc = _check("supercloud")
    assert full_sc.refusal and "model.lora_rank=16" in full_sc.refusal
    full_h100 = _check("h100x2")
    assert full_h100.refusal is None and full_h100.plan.settings.strategy == "fsdp"
    lora_sc = _check("supercloud", "model.lora_rank=16")
    assert lora_sc.refusal is None and lora_sc.plan.estimate.total_gib <= 32


def test_7b_full_on_h100x2_fits_by_releasing_the_engine_not_by_offloading() -> None:
    """The native engine's packed weights and cache are freed during the update (and
    rebuilt for the next rollout): cheaper than FSDP2's CPU offload, which runs AdamW on
    the host."""
    cfg, chk = resolve(
        "gsm8k", [f"model.name_or_path={SHAPES / 'qwen2.5-7b'}"], load_profile("h100x2"), "r"
    )
    assert "engine released during the update" in chk.plan.changed
    assert cfg.rollout.release_engine_memory and not cfg.dist.cpu_offload
    e = chk.plan.estimate
    kept = memory.estimate(
        memory.ModelShape.from_config(json.loads((SHAPES / "qwen2.5-7b/config.json").read_text())),
        replace(chk.plan.settings, release_engine=False),
    )
    freed = kept.update_bytes - e.update_bytes
    assert freed == e.engine_weights + e.kv_cache > 14 * memory.GIB
    assert e.generate_bytes == kept.generate_bytes  # the rollout still holds them


def test_an_asynchronous_run_holds_a_second_copy_and_generates_during_the_update() -> None:
    """algo.max_staleness >= 1: the generator's copy of the weights (fp32 masters: 4 bytes a
    parameter) and its own engine are resident, its generation transient overlaps the update
    and the optimizer step, and no engine is released for the update (it is generating)."""
    qwen = shape("qwen2.5-1.5b")
    sync = memory.Settings(rows=64, max_new_tokens=1024, release_engine=True)
    asyn = replace(sync, staleness=1)
    a, b = memory.estimate(qwen, sync), memory.estimate(qwen, asyn)
    # fp32 masters, and the shadow engine's packed bf16 copy and KV cache beside the policy's
    assert b.shadow == 4 * qwen.params + a.engine_weights + a.kv_cache and a.shadow == 0
    assert b.generate_bytes == a.generate_bytes + b.shadow
    released = a.engine_weights + a.kv_cache
    assert b.update_bytes == a.update_bytes + released + b.shadow + b.generation_transient
    assert "generation overlapped (max_staleness=1)" in asyn.describe()
    assert "engine released" not in asyn.describe()
    assert memory_fit._apply(replace(asyn, release_engine=False), "release_engine") is None


def test_an_asynchronous_fsdp2_run_counts_a_whole_copy_on_every_rank() -> None:
    """FSDP2 shards the policy, not the generating copy: each rank holds the full fp32
    copy (4 bytes a parameter, not halved over 2 ranks) and its engine. A run that fits
    synchronously and not with the copy is refused before it queues (8B, full parameters,
    2x 80 GiB with no CPU offload allowed), with what would fit."""
    llama = shape("llama-3.1-8b")
    s = memory.Settings(ranks=2, strategy="fsdp", rows=64, max_new_tokens=1024,
                        gradient_checkpointing=True)  # fmt: skip
    a, b = memory.estimate(llama, s), memory.estimate(llama, replace(s, staleness=1))
    assert b.weights == 4 * llama.params // 2  # the policy: sharded
    assert b.shadow == 4 * llama.params + a.engine_weights + a.kv_cache  # the copy: whole
    assert b.generate_bytes == a.generate_bytes + b.shadow
    profile = replace(load_profile("h100x2"), allow_cpu_offload=False)
    over = [f"model.name_or_path={SHAPES / 'llama-3.1-8b'}", "dist.strategy=fsdp"]
    sync = resolve("gsm8k", over, profile, "r")[1]
    assert sync.refusal is None and "fits" in sync.line
    asyn = resolve("gsm8k", [*over, "algo.max_staleness=1"], profile, "r")[1]
    assert asyn.refusal is not None and "exceeds h100x2's 80 GiB" in asyn.refusal, asyn.line
    assert "generation overlapped (max_staleness=1)" in asyn.refusal


def test_under_fsdp2_checkpointing_is_preferred_to_halving_the_token_budget() -> None:
    """Halving micro_batch_tokens doubles FSDP2's per-micro-batch weight gathers: at 7B on
    2x H100 it stepped in 14.3 s where checkpointing stepped in 11.6 s (bench/results/
    ladder_h100_2026-11-26.json). Without checkpointing in the config, the plan adds it, not a
    smaller budget."""
    check = _check("h100x2", "model.gradient_checkpointing=false")
    s = check.plan.settings
    assert (s.strategy, s.gradient_checkpointing, s.micro_batch_tokens) == ("fsdp", True, 4096)
    assert "gradient checkpointing" in check.plan.changed
    # under DDP a smaller budget stays the cheaper mean (no gathers per micro-batch)
    ddp = memory.Settings(ranks=2, strategy="ddp", precision="bf16", rows=64,
                          max_new_tokens=512, micro_batch_tokens=4096)  # fmt: skip
    assert memory_fit._cost("micro_batch_tokens", 1, ddp) == 1
    assert memory_fit._cost("micro_batch_tokens", 1, replace(ddp, strategy="fsdp")) == 3


def test_means_are_applied_only_when_needed() -> None:
    small = _check("h100x2", f"model.name_or_path={SHAPES / 'qwen2.5-0.5b'}")
    assert small.plan.changed == () and "fits" in small.line
    cfg, chk = resolve(
        "gsm8k",
        [f"model.name_or_path={SHAPES / 'qwen2.5-1.5b'}"],
        load_profile("supercloud"),
        "r",
    )
    assert chk.plan.changed == ("FSDP2",) and cfg.dist.strategy == "fsdp"


def test_cpu_profile_has_no_budget() -> None:
    cfg = build_config("tiny", [])
    chk = memory_plan.check(cfg, load_profile("local"))
    assert (
        chk.refusal is None and chk.line == "memory: not checked (profile local has no gpu_mem_gb)"
    )


def test_config_json_from_the_local_hf_cache(tmp_path: Path, monkeypatch) -> None:
    snap = tmp_path / "models--Org--Model" / "snapshots" / "abc"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text((SHAPES / SIZES[1] / "config.json").read_text())
    (tmp_path / "models--Org--Model" / "refs").mkdir()
    (tmp_path / "models--Org--Model" / "refs" / "main").write_text("abc")
    import huggingface_hub.constants as c

    monkeypatch.setattr(c, "HF_HUB_CACHE", str(tmp_path))
    assert memory_plan.read_config_json("Org/Model")["hidden_size"] == 1536
    assert memory_plan.read_config_json("Org/Absent") is None


def submit(*args: str, env: dict | None = None):
    return run_cli("grpo_hpc.cli.submit:main", *args, env=env)


def test_submit_refuses_7b_full_on_supercloud(logs_dir: Path) -> None:
    model = f"model.name_or_path={SHAPES / 'qwen2.5-7b'}"
    result = submit("--profile", "supercloud", "--config", "gsm8k", model, "--name", "big")
    assert result.returncode == ExitCode.CONFIG_ERROR, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "exceeds supercloud's 32 GiB by" in lines[0], result.stderr
    assert "model.lora_rank=16" in lines[0] and "--force" in lines[0]
    assert not logs_dir.exists() or not any(logs_dir.iterdir())
    # --force passes the memory check and stops only at the next one (no Slurm here)
    forced = submit(
        "--profile", "supercloud", "--config", "gsm8k", model, "--force", env={"PATH": "/nope"}
    )
    assert forced.returncode == ExitCode.CONFIG_ERROR and "sbatch not found" in forced.stderr


def test_dry_run_prints_the_memory_line(logs_dir: Path) -> None:
    model = f"model.name_or_path={SHAPES / 'qwen2.5-7b'}"
    result = submit("--profile", "h100x2", "--config", "gsm8k", model, "--dry-run")
    assert result.returncode == 0, result.stderr
    line = next(x for x in result.stdout.splitlines() if x.startswith("memory:"))
    assert "of 80 GiB (h100x2): fits" in line and "fsdp, bf16" in line
    assert "to fit: FSDP2" in line  # the profile's DDP does not hold 7B replicated


def test_dry_run_refuses_what_the_submission_refuses(logs_dir: Path) -> None:
    """One plan value behind both (grpo_hpc.submit.plan): a dry run of a plan that does not
    fit exits 2 with the submission's own one-line refusal, after printing the job, the same
    memory line and the refusal; --force lets both through the memory check."""
    model = f"model.name_or_path={SHAPES / 'qwen2.5-7b'}"
    args = ("--profile", "supercloud", "--config", "gsm8k", model, "--name", "big")
    real = submit(*args)
    dry = submit(*args, "--dry-run")
    assert real.returncode == dry.returncode == ExitCode.CONFIG_ERROR, dry.stdout + dry.stderr
    assert dry.stderr == real.stderr and "exceeds supercloud's 32 GiB" in dry.stderr
    memory = [x for x in dry.stdout.splitlines() if x.startswith("memory:")]
    assert len(memory) == 1 and "does NOT fit" in memory[0]
    refusal = real.stderr.strip().removeprefix("grpo-submit: error: ")
    assert f"# refused at submission: {refusal}" in dry.stdout
    assert "#SBATCH" in dry.stdout
    assert not logs_dir.exists() or not any(logs_dir.iterdir())
    forced = submit(*args, "--dry-run", "--force")
    assert forced.returncode == 0 and "refused at submission" not in forced.stdout, forced.stderr


def test_checkpointing_every_other_layer_sits_between() -> None:
    """Selective checkpointing keeps the activations of the layers it skips."""
    s = shape("qwen2.5-0.5b")
    base = memory.Settings(rows=64, micro_batch_tokens=4096)
    none = memory.estimate(s, base).activations
    every = [
        memory.estimate(s, memory.Settings(**{**base.__dict__, "gradient_checkpointing": True,
                                              "checkpoint_every": k})).activations
        for k in (1, 2, 4)
    ]  # fmt: skip
    assert every[0] < every[1] < every[2] < none


def _budget(profile: str, model: str, *overrides: str) -> int:
    """The token budget a gsm8k submission (algo.micro_batch_tokens: auto) resolves to."""
    over = [f"model.name_or_path={model}", *overrides]
    return resolve("gsm8k", over, load_profile(profile), "r")[0].algo.micro_batch_tokens


def test_auto_token_budget_is_the_larger_only_where_half_the_gpu_holds_it() -> None:
    assert memory_plan.AUTO_TOKENS == (18432, 4096)
    # 135M and 0.5B on 80 GB: 8.9 and 18.1 GiB at 18,432 tokens
    assert _budget("h100x2", "smollm2-135m") == 18432
    assert _budget("h100x2", str(SHAPES / "qwen2.5-0.5b")) == 18432
    # the same 0.5B on a 32 GB V100 (18.5 GiB > 16): the smaller budget
    assert _budget("supercloud", str(SHAPES / "qwen2.5-0.5b")) == 4096
    # full-parameter 1.5B-7B keep 4,096: the plans measured on 2x H100 (docs/memory.md)
    for size in ("qwen2.5-1.5b", "qwen2.5-3b", "qwen2.5-7b"):
        assert _budget("h100x2", str(SHAPES / size)) == 4096, size
    assert _budget("h100x2", str(SHAPES / "qwen2.5-7b"), "model.lora_rank=16") == 18432
    # a value given is kept, auto or not
    assert _budget("h100x2", "smollm2-135m", "algo.micro_batch_tokens=2048") == 2048


def test_auto_token_budget_without_a_figure_is_the_smaller() -> None:
    cfg = build_config("gsm8k", [])
    assert cfg.algo.micro_batch_tokens == "auto"
    assert memory_plan.auto_tokens(cfg, None) == 4096  # a CPU, or a profile without memory
    unknown = build_config("gsm8k", ["model.name_or_path=/nowhere/model"])
    assert memory_plan.auto_tokens(unknown, 80.0) == 4096  # no config.json to estimate
    # a profile without gpu_mem_gb leaves auto to the trainer, which knows its GPU
    kept = resolve("gsm8k", [], load_profile("local"), "r")[0]
    assert kept.algo.micro_batch_tokens == "auto"


def test_a_token_budget_that_is_not_auto_or_a_count_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"algo.micro_batch_tokens='lots' must be auto or"):
        build_config("gsm8k", ["algo.micro_batch_tokens=lots"])
    with pytest.raises(ConfigError, match="must be auto or an integer >= 0"):
        build_config("gsm8k", ["algo.micro_batch_tokens=-1"])


def test_a_split_run_is_judged_per_role() -> None:
    """rollout.placement=split: the trainers hold no generating copy and shard over
    themselves, the generator holds the copy and its engine. 8B, full parameters, FSDP2,
    4x 80 GiB, no CPU offload: the thread placement (a copy on every GPU) is refused, the
    split (3 trainers, 1 generator) fits, its line naming both figures; on 8x 40 GiB the 7
    trainers fit and the generator does not: refused, saying so and what to change."""
    over = [f"model.name_or_path={SHAPES / 'llama-3.1-8b'}", "dist.strategy=fsdp"]
    over += ["algo.max_staleness=1"]
    four = replace(load_profile("h100x2"), allow_cpu_offload=False, gpus_per_node=4)
    four = replace(four, nproc_per_node=4)
    over4 = [*over, "rollout.prompts_per_step=36"]  # whole groups on 4 ranks and on 3
    thread = resolve("gsm8k", over4, four, "r")[1]
    assert thread.refusal is not None and "exceeds h100x2's 80 GiB" in thread.refusal
    cfg, split = resolve("gsm8k", [*over4, "rollout.placement=split"], four, "r")
    assert split.refusal is None, split.line
    roles = memory_plan.split_memory(cfg, 1)
    assert roles is not None and max(roles.trainer_gib, roles.generator_gib) <= 80
    per_role = f"{roles.trainer_gib:.1f} GiB per trainer GPU, {roles.generator_gib:.1f} GiB"
    assert f"memory: {per_role} per generator GPU, of 80 GiB (h100x2): fits" in split.line
    # the trainers' settings: 3 ranks sharing the step, no copy of their own
    s = memory_plan.settings_of(cfg)
    assert (s.ranks, s.staleness, s.rows) == (3, 0, 12 * cfg.rollout.num_generations)
    eight = replace(four, gpus_per_node=8, nproc_per_node=8, gpu_mem_gb=40)
    over8 = [*over, "rollout.prompts_per_step=28", "rollout.placement=split"]  # 7 trainers
    _, small = resolve("gsm8k", over8, eight, "r")
    assert small.refusal is not None and "a generator's estimate" in small.refusal
    assert "exceeds h100x2's 40 GiB" in small.refusal and "rollout.max_new_tokens" in small.refusal
    assert "a generator does NOT fit" in small.line


def test_a_split_generator_holds_its_trainers_partial_pool() -> None:
    """rollout.partial_pool under the split placement: the trainers keep the pool, the
    generator decodes it, so the generator's figure grows by the pool's KV cache (P steps'
    rows, each with room for its prompt and two caps) and the trainers' does not move."""
    over = [f"model.name_or_path={SHAPES / 'qwen2.5-1.5b'}", "rollout.max_new_tokens=4096"]
    over += ["algo.max_staleness=2", "rollout.placement=split", "algo.micro_batch_tokens=4096"]
    plain = memory_plan.split_memory(build_config("gsm8k", over), 1)
    cfg = build_config("gsm8k", [*over, "rollout.partial_pool=2"])
    pooled = memory_plan.split_memory(cfg, 1)
    assert plain is not None and pooled is not None
    assert pooled.trainer_gib == plain.trainer_gib
    s = memory_plan.settings_of(cfg)  # the trainers' (one trainer: every row of a step)
    assert (s.ranks, s.rows, s.partial_pool) == (1, 256, 0)
    per_token = 28 * 2 * 2 * 128 * 2  # layers x (K, V) x KV heads x head dim x bf16
    grown = 2 * s.rows * (s.prompt_tokens + 2 * 4096) - s.rows * (s.prompt_tokens + 4096)
    assert pooled.generator_gib - plain.generator_gib >= grown * per_token / memory.GIB


def test_a_partial_pool_that_does_not_fit_says_what_would() -> None:
    """Qwen2.5-1.5B at 4,096 with a partial pool of 2 on h100x2: nothing automatic fits a
    thread-placement rank, and the refusal names the run without its pool (and synchronous)
    as what would, with their figures; under the split placement the generator does not fit
    and its refusal names rollout.partial_pool=0 with a generator's estimate without it."""
    over = [f"model.name_or_path={SHAPES / 'qwen2.5-1.5b'}", "rollout.max_new_tokens=4096"]
    over += ["algo.max_staleness=2", "rollout.partial_pool=2"]
    _, thread = resolve("gsm8k", over, load_profile("h100x2"), "r")
    assert thread.refusal is not None, thread.line
    assert "would fit: rollout.partial_pool=0 (" in thread.refusal
    assert "or algo.max_staleness=0 (" in thread.refusal
    _, split = resolve("gsm8k", [*over, "rollout.placement=split"], load_profile("h100x2"), "r")
    assert split.refusal is not None and "a generator's estimate" in split.refusal
    assert "; rollout.partial_pool=0 (" in split.refusal and " GiB a generator), " in split.refusal


GROUPED_8B = [  # bench/gpu/async.sh's lora8b row with grouped generation M = 3
    f"model.name_or_path={SHAPES / 'llama-3.1-8b'}",
    "model.lora_rank=16",
    "model.gradient_checkpointing=true",
    "rollout.max_new_tokens=4096",
    "rollout.prompts_per_step=4",
    "algo.micro_batch_tokens=18432",
    "algo.max_staleness=2",
    "rollout.steps_per_generation=3",
    "dist.precision=bf16",
]


def test_grouped_generation_out_of_memory_says_what_would_fit() -> None:
    """The 8B LoRA row at M = 3 ran out of memory on one H100 (2026-12-06, 76.3 GiB
    allocated; bench/results/LOG-speed.md) and was told "nothing tried fits". Fewer steps'
    rows a rollout, or synchronous, fit: the advice names them, each as overrides that a
    config accepts (synchronous alone would be refused: k = 0 with M = 3)."""
    cfg = build_config("gsm8k", GROUPED_8B)
    advice = memory_plan.oom_advice(cfg, 79.1787)  # what torch reported for the H100
    assert advice.startswith("estimated 83.8 GiB as run; would fit: ")
    assert "rollout.steps_per_generation=2 (65.7 GiB)" in advice
    assert "or algo.max_staleness=0 rollout.steps_per_generation=1 (47.6 GiB)" in advice
    for alt in advice.split("would fit: ")[1].split(" or "):
        build_config("gsm8k", [*GROUPED_8B, *alt.split(" (")[0].split()])  # accepted
    one_gpu = replace(load_profile("h100x2"), gpus_per_node=1, nproc_per_node=1, gpu_mem_gb=60)
    _, check = resolve("gsm8k", GROUPED_8B, one_gpu, "r")  # --dry-run on a 60 GiB GPU
    assert check.refusal is not None, check.line
    assert "would fit: rollout.steps_per_generation=2 (" in check.refusal
    assert "or algo.max_staleness=0 rollout.steps_per_generation=1 (" in check.refusal


def test_the_settings_know_whether_the_run_evaluates() -> None:
    """``training.eval_every`` decides it (the policy's cache of an asynchronous run)."""
    off = build_config("tiny", ["training.eval_every=0", "algo.max_staleness=1"])
    on = build_config("tiny", ["training.eval_every=5", "algo.max_staleness=1"])
    assert not memory_plan.settings_of(off).evaluates
    assert memory_plan.settings_of(on).evaluates
