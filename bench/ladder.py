"""Model-size ladder: which Qwen2.5 shapes fit which GPU budget, how fast a GRPO step is there,
and how close the memory estimator (grpo_hpc.memory.estimate) comes to the measured peak.

For each shape (bench/shapes: 0.5B, 1.5B, 3B, 7B; random weights built on the GPU) x budget
x mode (full parameters, LoRA r=16), one step config: 8 prompts x G=8 per GPU, 512 new tokens.

- ``h100``: bf16 autocast, each GPU capped at 80 GiB (the h100x2 profile: DDP, FSDP2 where
  the plan needs it);
- ``supercloud``: fp16 autocast + grad scaler, SDPA, each GPU capped at 32 GiB (a V100's
  memory; the supercloud profile) with ``torch.cuda.set_per_process_memory_fraction``.

Each row runs the real trainer (``grpo_hpc.train``) under torchrun with ``--nproc`` ranks
(one GPU each) in its own process group with a timeout, with the memory means the estimator
picks for that many GPUs under the cap: for ``--nproc 2`` what ``grpo-submit`` resolves for
the budget's 2-GPU profile (strategy, gradient checkpointing, token budget, optimizer CPU
offload), for ``--nproc 1`` the same on one GPU. Rows the estimator says cannot fit are not
run ("estimated: does not fit"). Beside every row: the estimator's figures for one GPU and
for the 2-GPU profile; ``measured`` says which figures come from a run, ``gpus`` on how many
GPUs. ladder.json is rewritten (atomically) after every row, and rows already settled in
it (fits, out of memory) are skipped, so a cut-short run continues where it stopped and
rows that timed out or failed run again, as do rows marked ``stale`` (measured before a
change to what they measure; the reason is in the row) and rows whose settings the
estimator now resolves differently.

    python -m bench.ladder --nproc 2 --out bench/results/ladder.json   # 2 GPUs, ~15 min
    python -m bench.ladder --out bench/results/ladder.json             # one GPU, ~8 min
    python -m bench.ladder --device cpu --shapes tiny --steps 2 --max-new 16 --out /tmp/l.json
    python -m bench.ladder --out bench/results/ladder.json --merge OUT/ladder_b.json
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import SHAPES as COMMON_SHAPES
from bench.common import build_model, env_info, write_result

HERE = Path(__file__).resolve().parent
SHAPES_DIR = HERE / "shapes"
SHAPES = ("qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-3b", "qwen2.5-7b")
BUDGETS = {
    # name: (precision, cap GiB, 2-GPU profile)
    "h100": ("bf16", 80.0, "h100x2"),
    "supercloud": ("fp16", 32.0, "supercloud"),
}
MODES = ("full", "lora")
LORA_RANK = 16
PEAK_FLOPS = 989e12
"""H100/H200 SXM dense bf16/fp16 tensor-core peak (the fp16 rows run on the same chips)."""
DECODE_BW = {"H100": (2.99e12, "measured copy bandwidth, bench/results/LOG.md"),
             "H200": (4.8e12, "nominal HBM3e bandwidth, not measured here")}  # fmt: skip
"""Memory bandwidth behind the decode roofline, by chip (the row's device name)."""


@functools.cache
def decode_bw() -> tuple[float, str]:
    """(bytes/s, where the figure comes from) for this machine's GPU."""
    device = env_info()["device"]
    return next((v for k, v in DECODE_BW.items() if k in device), DECODE_BW["H100"])


def load_shape(name: str):  # noqa: ANN201
    from grpo_hpc.memory import estimate as memory

    config = json.loads((SHAPES_DIR / name / "config.json").read_text())
    return memory.ModelShape.from_config(config)


@functools.cache
def prompt_tokens(vocab: int) -> int:
    """Longest prompt of the first step, as the trainer builds it (char tokenizer)."""
    from grpo_hpc.config.schema import DataConfig
    from grpo_hpc.tasks import problems as data
    from grpo_hpc.train.models import char_tokenizer

    tok = char_tokenizer(vocab)
    problems = data.arithmetic_problems(64, DataConfig(), 0)
    return max(len(tok(data.prompt_text(tok, p["question"])).input_ids) for p in problems)


@functools.cache
def _capability(device: str) -> tuple[int, int]:
    """The compute capability of the GPU the rows run on; (0, 0) on a CPU."""
    if device != "cuda":
        return (0, 0)
    import torch

    return torch.cuda.get_device_capability()


def settings(args: argparse.Namespace, budget: str, mode: str, prompt: int, ranks: int = 1):  # noqa: ANN201
    """A row's memory settings before the plan: as the trainer will resolve ``dist.compile``
    (``auto``) on the GPU the ladder runs on. The supercloud budget caps an H100 at a V100's
    32 GiB but keeps the H100's kernels, so its full-parameter rows run compiled and packed
    where a V100 would run eager (grpo-submit's estimate for that profile assumes eager
    layers, which keep more for backward: the safe side)."""
    from grpo_hpc.config import speed
    from grpo_hpc.memory import estimate as memory

    precision = "fp32" if args.device == "cpu" else BUDGETS[budget][0]
    where = speed.Where(
        cuda=args.device == "cuda",
        capability=_capability(args.device),
        precision=precision,
        lora=mode == "lora",
        varlen=True,
    )
    return memory.Settings(
        compiled_layers=speed.compile_on(speed.AUTO, where),
        ranks=ranks,
        strategy="ddp",
        precision=precision,
        rows=args.prompts * args.G,
        prompt_tokens=prompt,
        max_new_tokens=args.max_new,
        micro_batch_size=args.prompts * args.G,
        micro_batch_tokens=args.micro_tokens,
        lora_rank=LORA_RANK if mode == "lora" else 0,
    )


def estimates(args: argparse.Namespace, name: str, budget: str, mode: str) -> dict:
    """The estimator's plan for one GPU under the cap, and for the budget's 2-GPU profile."""
    from grpo_hpc.config.profiles import load_profile
    from grpo_hpc.memory import fit as memory_fit

    shape = load_shape(name)
    prompt = prompt_tokens(shape.vocab)
    cap = BUDGETS[budget][1]
    one = memory_fit.fit(shape, settings(args, budget, mode, prompt), cap)
    prof = load_profile(BUDGETS[budget][2])
    two_s = settings(args, budget, mode, prompt, ranks=2)
    two = memory_fit.fit(
        shape, dataclasses.replace(two_s, strategy=prof.strategy), cap, prof.allow_cpu_offload
    )

    def view(p: memory_fit.Plan) -> dict:
        e = p.estimate
        return {
            "fits": p.fits,
            "settings": p.settings.describe(),
            "changed": list(p.changed),
            "peak_gib": round(e.peak_gib, 2),
            "total_gib": round(e.total_gib, 2),
            "phase": e.peak_phase,
            "breakdown_gib": e.breakdown(),
        }

    return {"prompt_tokens": prompt, 1: one, 2: two, "gpu1": view(one), "gpu2": view(two)}


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
    cmd = [*launch, "-m", "bench.ladder", "--child", str(paths.root), "--cap-gib", str(cap)]
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
    ranks (also bench/mem_probe.py, which runs a row's plan under its instruments)."""
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


KEY = ("shape", "budget", "mode", "gpus")


def wants_trl(args: argparse.Namespace, name: str, row: dict, elapsed: float) -> bool:
    """TRL beside a one-GPU row that ran, once, while the time budget lasts."""
    one_gpu = args.device == "cuda" and args.nproc == 1
    todo = row.get("measured") and "trl" not in row and elapsed < args.time_budget
    return bool(args.trl and one_gpu and name in COMMON_SHAPES and todo)


def same_settings(row: dict, plan) -> bool:  # noqa: ANN001
    """Whether ``row`` ran the settings ``plan`` resolves now (a field the row predates
    counts as its default)."""
    from grpo_hpc.memory import estimate as memory

    defaults = {
        f.name: f.default
        for f in dataclasses.fields(memory.Settings)
        if f.default is not dataclasses.MISSING
    }
    now = json.loads(json.dumps(dataclasses.asdict(plan.settings)))
    ran = row.get("run_settings") or {}
    return all(ran.get(k, defaults.get(k)) == v for k, v in now.items())


def _key(row: dict) -> tuple[str, str, str, int]:
    return row["shape"], row["budget"], row["mode"], row.get("gpus", 1)


def merge_rows(base: list[dict], others: list[list[dict]]) -> list[dict]:
    """``base``'s rows with those that each of ``others`` holds differently (pure). Each
    other is a copy of ``base`` that another ladder ran on (two 2-GPU ladders side by side
    on one 4-GPU machine, each on its own shapes): a row it changed is one it ran or
    re-decided. Each is compared with ``base`` itself, so that one copy's untouched rows
    never undo another's new ones; where two copies changed a row, the later one wins."""
    mine = {_key(r): r for r in base}
    changed = {_key(r): r for other in others for r in other if mine.get(_key(r)) != r}
    return [r for r in base if _key(r) not in changed] + list(changed.values())


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
    (bench/trl_baseline.py: HF generate, gradient checkpointing, micro-batches of 16);
    its median s/step and peak, or why it did not run to the end."""
    out = model.parent / f"trl-{name}-{budget}-{mode}.json"
    cmd = [sys.executable, "-m", "bench.trl_baseline", f"--shape={name}",
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


def main() -> None:
    fmt = argparse.RawDescriptionHelpFormatter
    p = argparse.ArgumentParser(description=__doc__, formatter_class=fmt)
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--shapes", nargs="+", default=list(SHAPES), help="names in bench/shapes")
    p.add_argument("--nproc", type=int, default=1, help="GPUs (ranks) per row: 1 or 2")
    p.add_argument("--budgets", nargs="+", default=list(BUDGETS), choices=list(BUDGETS))
    p.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--G", type=int, default=8)
    p.add_argument("--max-new", type=int, default=512)
    p.add_argument("--micro-tokens", type=int, default=4096)
    p.add_argument("--steps", type=int, default=3, help="steps per row (the first is warm-up)")
    p.add_argument("--row-timeout", type=float, default=150.0)
    p.add_argument(
        "--time-budget",
        type=float,
        default=420.0,
        help="start no row after this many seconds (with --row-timeout: under 10 minutes)",
    )
    p.add_argument("--redo", action="store_true", help="rerun rows already in --out")
    p.add_argument(
        "--trl",
        action="store_true",
        help="one GPU: also run TRL 1.16 in each row's budget (shapes of bench/common.py)",
    )
    p.add_argument("--out", type=Path, default=HERE / "results" / "ladder.json")
    p.add_argument(
        "--merge",
        type=Path,
        nargs="+",
        help="fold the rows these copies of --out changed into --out, and run nothing",
    )
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--cap-gib", type=float, default=0.0, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        sys.exit(child(args.child, args.cap_gib))
    if args.merge:
        result = json.loads(args.out.read_text())
        others = [json.loads(other.read_text())["rows"] for other in args.merge]
        result["rows"] = merge_rows(result["rows"], others)
        write_result(result, args.out)
        return
    result = json.loads(args.out.read_text()) if args.out.exists() and not args.redo else {}
    result.setdefault("rows", [])
    # A row that fitted or ran out of memory is settled; a timeout or an error is run again,
    # and so is a row marked stale (measured before a change to what it measures) or one
    # whose settings the estimator would now choose differently (see the loop).
    settled = {
        _key(r): r
        for r in result["rows"]
        if r.get("status") in ("fits", "oom") and not r.get("stale")
    }
    result["config"] = {k: v for k, v in vars(args).items() if k not in ("child", "cap_gib")}
    result["config"]["out"] = str(args.out)
    result["env"] = env_info()
    result["env"]["decode_bw"] = decode_bw()
    start = time.monotonic()
    with tempfile.TemporaryDirectory() as work:

        @functools.cache
        def model_dir(name: str) -> Path:
            """The shape saved once for TRL (it loads a model directory)."""
            out = Path(work) / f"model-{name}"
            build_model(out, name)
            return out

        for name in args.shapes:
            for budget in args.budgets:
                for mode in args.modes:
                    key = (name, budget, mode, args.nproc)
                    est = estimates(args, name, budget, mode)
                    if key in settled and same_settings(settled[key], est[args.nproc]):
                        row = settled[key]
                        if wants_trl(args, name, row, time.monotonic() - start):
                            row["trl"] = run_trl(args, name, budget, mode, model_dir(name))
                            write_result(result, args.out)
                            print(json.dumps({**{k: row[k] for k in KEY}, "trl": row["trl"]}))
                        continue
                    row = {"shape": name, "budget": budget, "mode": mode, "gpus": args.nproc}
                    row["device"] = args.device
                    row |= {"prompt_tokens": est["prompt_tokens"], "estimate_1gpu": est["gpu1"]}
                    row["estimate_2gpu"] = est["gpu2"]
                    plan = est[args.nproc]
                    if args.device == "cuda" and not plan.fits:
                        row |= {"status": "estimated: does not fit", "measured": False}
                    elif time.monotonic() - start > args.time_budget:
                        row |= {"status": "not run: ladder time budget spent", "measured": False}
                    else:
                        row |= run_row(args, name, budget, mode, plan, Path(work))
                        row["measured"] = True
                        row["run_settings"] = dataclasses.asdict(plan.settings)
                    if wants_trl(args, name, row, time.monotonic() - start):
                        row["trl"] = run_trl(args, name, budget, mode, model_dir(name))
                    result["rows"] = [r for r in result["rows"] if _key(r) != key] + [row]
                    write_result(result, args.out)
                    shown = (*KEY, "status", "peak_gib", "s_per_step", "trl")
                    print(json.dumps({k: row.get(k) for k in shown}), flush=True)


if __name__ == "__main__":
    main()
