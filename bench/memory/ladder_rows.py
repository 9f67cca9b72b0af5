"""One ladder row run for real: the trainer under torchrun in a process group of its own
with a timeout (and TRL beside it, on request), its measured figures, and the trainer's
side of it (``--child``: the memory cap, then the trainer) (:mod:`bench.memory.ladder`)."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench.memory.ladder_plan import (
    BUDGETS,
    LORA_RANK,
    PEAK_FLOPS,
    SHAPES_DIR,
    decode_bw,
    load_shape,
)


def run_row(args: argparse.Namespace, name: str, budget: str, mode: str, plan, work: Path) -> dict:  # noqa: ANN001
    """The real trainer on ``args.nproc`` GPUs (or CPU processes) with the plan's settings
    (one rank's share of the step); its measured figures."""
    from grpo_hpc.config.profiles import profile_from_dict
    from grpo_hpc.core.paths import RunPaths
    from grpo_hpc.submit.job import create_run

    s = plan.settings
    prof = {"executor": "local", "precision": s.precision, "strategy": s.strategy}
    profile = profile_from_dict({**prof, "attn_implementation": "sdpa"}, name="ladder")
    paths = RunPaths(work / f"{name}-{budget}-{mode}")
    overrides = row_overrides(args, name, s)
    create_run(paths, profile, "tiny", overrides, force=True)
    cap = BUDGETS[budget][1] if args.device == "cuda" else 0
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone",
              f"--nproc-per-node={args.nproc}", "--max-restarts=0"]  # fmt: skip
    cmd = [*launch, "-m", "bench.memory.ladder", "--child", str(paths.root), "--cap-gib", str(cap)]
    t0 = time.monotonic()
    code, tail = _run_group(cmd, args.row_timeout)
    out: dict = {"wall_s": round(time.monotonic() - t0, 1), "exit_code": code}
    metrics = (
        [json.loads(x) for x in paths.metrics.read_text().splitlines()]
        if (paths.metrics.exists())
        else []
    )
    steps = [m for m in metrics if "loss" in m]
    peaks = [m["gpu_mem_gb"] for m in steps if "gpu_mem_gb" in m]
    if peaks:
        out["peak_gib"] = round(max(peaks), 2)
    if code == 0:
        out["status"] = "fits"
        out |= speed(steps[1:] or steps, load_shape(name), plan, args)
        return out
    progress = json.loads(paths.progress.read_text()) if paths.progress.exists() else {}
    reason = progress.get("reason") or ""
    if code == 6 or "out of memory" in reason:  # torchrun reports a failed rank as exit 1
        out["status"] = "oom"
        out["oom_phase"] = _phase(reason)
        out["oom_reason"] = reason
        if progress.get("peak_gpu_gib") is not None:
            out["peak_gib"] = round(progress["peak_gpu_gib"], 2)
    else:
        out["status"] = "timeout" if code is None else "error"
        out["error"] = (reason or tail).strip()[-600:]
    return out


def row_overrides(args: argparse.Namespace, name: str, s) -> list[str]:  # noqa: ANN001
    """The run's config overrides for one row: ``s`` (memory.Settings) on ``args.nproc``
    ranks (also bench/memory/probe.py, which runs a row's plan under its instruments)."""
    return [
        f"model.name_or_path=random:{SHAPES_DIR / name}",
        f"model.lora_rank={s.lora_rank}",
        f"model.gradient_checkpointing={s.gradient_checkpointing}",
        f"rollout.prompts_per_step={args.prompts * args.nproc}",
        f"rollout.num_generations={args.G}",
        f"rollout.max_new_tokens={args.max_new}",
        "rollout.generation_timeout_s=3600",
        f"rollout.engine={'hf' if s.engine == 'hf' else 'auto'}",
        f"algo.micro_batch_size={s.micro_batch_size}",
        f"algo.micro_batch_tokens={s.micro_batch_tokens}",
        f"dist.cpu_offload={s.cpu_offload}",
        f"rollout.release_engine_memory={s.release_engine}",
        f"dist.nproc_per_node={args.nproc}",
        f"training.max_steps={args.steps}",
        "training.save_every_steps=0",
        "training.save_final=false",  # steps are timed; a 7B checkpoint would not fit the disk
        "data.num_eval=0",
        "wandb.mode=disabled",
        "reward.custom={grpo_hpc.train.rewards.toy:digit_fraction: 1.0}",
    ]


def _run_group(cmd: list[str], timeout: float) -> tuple[int | None, str]:
    """Run ``cmd`` (torchrun) in its own process group; (exit code, stderr tail), the code
    None after a timeout. On timeout torchrun gets SIGTERM, which stops its workers the
    graceful way; whatever is left after a grace period is killed, the workers included:
    torchrun starts each in a session of its own, so killing torchrun's group alone leaves
    them holding the GPUs (and this pipe) through the next rows."""
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)  # fmt: skip
    try:
        _, err = proc.communicate(timeout=timeout)
        return proc.returncode, (err or "")[-1500:]
    except subprocess.TimeoutExpired:
        workers = _children(proc.pid)
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.communicate(timeout=KILL_GRACE_S)
        except subprocess.TimeoutExpired:
            for pgid in [proc.pid, *workers]:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pgid, signal.SIGKILL)
            proc.communicate()
        return None, f"timed out after {timeout:g} s"


KILL_GRACE_S = 45.0
"""How long torchrun may take to stop its workers after SIGTERM before everything is killed."""


def _children(pid: int) -> list[int]:
    """Direct children of ``pid`` (Linux /proc; empty elsewhere)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) == pid:  # state, ppid, ...
                out.append(int(stat.parent.name))
    return out


def _phase(reason: str) -> str:
    for phase in ("loading", "generating", "training", "scoring", "checkpointing"):
        if f"while {phase}" in reason:
            return phase
    return "unknown"


def speed(steps: list[dict], shape, plan, args: argparse.Namespace) -> dict:  # noqa: ANN001
    """Medians of the measured steps: s/step split, decode tok/s (the job's, and per GPU)
    and % of one GPU's decode roofline, update MFU (model FLOPs: 6 per parameter and token
    for full parameters, 4 for LoRA whose frozen weights get no gradient; recomputation
    not counted)."""
    med = {k: statistics.median(m[k] for m in steps) for k in ("time/step", "time/generate",
           "time/train", "tokens_per_s", "gen_len/mean")}  # fmt: skip
    s, c = plan.settings, plan.settings.compute_bytes
    rows, gen = s.rows, med["gen_len/mean"]
    per_slot = shape.layers * 2 * shape.kv_heads * shape.head_dim * c
    step_bytes = shape.params * c + rows * (s.prompt_tokens + gen / 2) * per_slot
    bw, _ = decode_bw()
    roofline = rows / (step_bytes / bw)  # one rank's rows against one GPU's bandwidth
    per_gpu = med["tokens_per_s"] / s.ranks  # the trainer logs the whole job's tokens/s
    tokens = rows * (s.prompt_tokens + gen)
    flops = (4 if s.lora_rank else 6) * (shape.params - shape.embed_params) * tokens
    return {
        "s_per_step": round(med["time/step"], 3),
        "generate_s": round(med["time/generate"], 3),
        "update_s": round(med["time/train"], 3),
        "decode_tok_s": round(med["tokens_per_s"]),
        "decode_tok_s_per_gpu": round(per_gpu),
        "decode_roofline_pct": round(100 * per_gpu / roofline, 1),
        "update_mfu_pct": round(100 * flops / med["time/train"] / PEAK_FLOPS, 1),
        "steps_measured": len(steps),
    }


def run_trl(args: argparse.Namespace, name: str, budget: str, mode: str, model: Path) -> dict:
    """TRL 1.16's GRPOTrainer on one GPU under the same cap, precision, mode (peft LoRA r=16
    on q/k/v/o, base in the compute dtype), prompts, G, lengths and steps, in a child process
    (bench/trl/baseline.py: HF generate, gradient checkpointing, micro-batches of 16);
    its median s/step and peak, or why it did not run to the end."""
    out = model.parent / f"trl-{name}-{budget}-{mode}.json"
    cmd = [sys.executable, "-m", "bench.trl.baseline", f"--shape={name}",
           f"--model-dir={model}", f"--precision={BUDGETS[budget][0]}",
           f"--cap-gib={BUDGETS[budget][1]}", f"--lora-rank={LORA_RANK if mode == 'lora' else 0}",
           f"--prompts={args.prompts}", f"--G={args.G}", f"--max-new={args.max_new}",
           f"--steps={args.steps}", "--variants", f"--out={out}"]  # fmt: skip
    code, tail = _run_group(cmd, args.row_timeout)
    if code == 0:
        trl = json.loads(out.read_text())["trl"]
        return {"status": "fits", "s_per_step": round(trl["s_per_step_median"], 3),
                "peak_gib": round(trl["peak_gib"], 2)}  # fmt: skip
    if code is not None and "out of memory" in tail.lower():
        return {"status": "oom"}
    return {"status": "timeout" if code is None else "error", "error": tail.strip()[-400:]}


def child(run_dir: str, cap_gib: float) -> int:
    """One row's trainer, in this process, under the budget's memory cap."""
    import torch

    if cap_gib and torch.cuda.is_available():
        device = int(os.environ.get("LOCAL_RANK", "0"))  # the GPU this rank will train on
        total = torch.cuda.get_device_properties(device).total_memory / 2**30
        torch.cuda.set_per_process_memory_fraction(min(1.0, cap_gib / total), device)
    from grpo_hpc.train.__main__ import main as train_main

    return train_main([run_dir])
