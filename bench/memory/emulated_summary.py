"""The summary of a run under ``GRPO_HPC_EMULATE_GPU`` (bench/gpu/real.sh's stage
``supercloud``): what the trainer resolved (from its [Device], [Speed] and [Kernels] lines),
its peak memory against the emulated cap, s/step, and reward and held-out accuracy first
against last. The figures are read from the run directory; :func:`summarize` is pure.

    python -m bench.memory.emulated_summary /tmp/runs/supercloud-emulated-smollm2 OUT/summary.json
"""

from __future__ import annotations

import json
import re
import statistics
import sys
from pathlib import Path

SETTINGS = {
    # name: (line prefix, pattern; group 1 is the value)
    "emulated": ("[Device]", r"GRPO_HPC_EMULATE_GPU=(\S+?):? "),
    "real_gpu": ("[Device]", r"on the real (.+?) \(compute capability"),
    "precision": ("[Kernels]", r"dist\.precision=(\w+)"),
    "update_attention": ("[Kernels]", r"update attention (\S+);"),
    "decode": ("[Kernels]", r"; (native decode: [^(]+?|HF generate)(?: \(|$)"),
    "capability": ("[Kernels]", r"\(compute capability (\d+\.\d+)\)"),
    "compile": ("[Speed]", r"dist\.compile=(\w+)"),
    "packing": ("[Speed]", r"algo\.packing=(\w+)"),
    "micro_batch_tokens": ("[Speed]", r"algo\.micro_batch_tokens=(\d+)"),
    "engine": ("[Speed]", r"(rollout: .+)$"),
}
"""What the summary reads from the trainer's lines (grpo_hpc/train/distributed/gpu.py,
config/speed.py's describe, setup/autos.py's kernels_line)."""


def resolved(lines: list[str]) -> dict:
    """The settings the trainer said it resolved (pure); a value it did not say is None."""
    out: dict = {}
    for name, (prefix, pattern) in SETTINGS.items():
        said = next((line for line in lines if line.startswith(prefix)), "")
        m = re.search(pattern, said)
        out[name] = m.group(1).strip() if m else None
    kernels = next((line for line in lines if line.startswith("[Kernels]")), "")
    out["grad_scaler"] = "with the grad scaler" in kernels if kernels else None
    return out


def _mean(rows: list[dict], key: str) -> float | None:
    values = [r[key] for r in rows if key in r]
    return round(statistics.mean(values), 4) if values else None


def summarize(
    rows: list[dict], lines: list[str], cap_gib: float | None, config: dict | None = None
) -> dict:
    """``rows``: metrics.jsonl; ``lines``: the training log; ``cap_gib``: the emulated
    memory; ``config``: what the submission resolved (:func:`submitted`) (pure)."""
    steps = [r for r in rows if "time/step" in r]
    timed = steps[1:] or steps  # the first step compiles and warms up
    peak = max((r["gpu_mem_gb"] for r in steps if "gpu_mem_gb" in r), default=None)

    def med(key: str) -> float | None:
        values = [r[key] for r in timed if key in r]
        return round(statistics.median(values), 3) if values else None

    return {
        "resolved": resolved(lines),
        "submitted": config,
        "lines": [line for line in lines if line.startswith(("[Device]", "[Speed]", "[Kernels]"))],
        "steps": len(steps),
        "peak_gib": round(peak, 2) if peak is not None else None,
        "cap_gib": cap_gib,
        "within_cap": peak <= cap_gib if peak is not None and cap_gib else None,
        "median_s": {k: med(k) for k in ("time/step", "time/generate", "time/train")},
        "eval_accuracy": {str(r["step"]): r["eval/accuracy"] for r in rows if "eval/accuracy" in r},
        "reward_mean_first5": _mean(steps[:5], "reward/mean"),
        "reward_mean_last5": _mean(steps[-5:], "reward/mean"),
        "correct_first5": _mean(steps[:5], "reward/correctness"),
        "correct_last5": _mean(steps[-5:], "reward/correctness"),
        "gen_len_first_last": [steps[0].get("gen_len/mean"), steps[-1].get("gen_len/mean")]
        if steps
        else None,
    }


def submitted(cfg) -> dict:  # noqa: ANN001 - a grpo_hpc Config
    """The settings grpo-submit wrote into config.yaml (``auto`` where the trainer decides)."""
    return {
        "precision": cfg.dist.precision,
        "strategy": cfg.dist.strategy,
        "attn_implementation": cfg.model.attn_implementation,
        "compile": cfg.dist.compile,
        "packing": cfg.algo.packing,
        "micro_batch_tokens": cfg.algo.micro_batch_tokens,
        "gradient_checkpointing": cfg.model.gradient_checkpointing,
        "engine": cfg.rollout.engine,
    }


def main(argv: list[str]) -> int:
    run, out = Path(argv[0]), Path(argv[1])
    from grpo_hpc.config.load import load_resolved
    from grpo_hpc.core.paths import RunPaths
    from grpo_hpc.core.progress import read_progress
    from grpo_hpc.train.distributed import gpu

    paths = RunPaths(run)
    rows = []
    if paths.metrics.exists():
        rows = [json.loads(x) for x in paths.metrics.read_text().splitlines() if x.strip()]
    log = paths.training_log
    lines = log.read_text(errors="replace").splitlines() if log.exists() else []
    emulated = gpu.emulation() or gpu.parse_emulation(resolved(lines)["emulated"])
    config = submitted(load_resolved(paths.config)) if paths.config.exists() else None
    summary = summarize(rows, lines, emulated.gib if emulated else None, config)
    rec = read_progress(paths.progress)
    summary["state"] = rec.state.value if rec else None
    summary["reason"] = rec.reason if rec else None
    out.write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
