"""Memory and time probe: where the GPU memory and the time of a real GRPO step go, phase by phase.

Runs the real trainer (``grpo_hpc.train``) under torchrun with light instruments hooked in
from outside (nothing in the package changes), and writes per rank a small JSON:

- GPU memory (``torch.cuda.memory_allocated``, ``memory_reserved`` and the allocator's peak
  since the previous record) at phase boundaries: after load + shard + engine build,
  before and after each rollout's weight gather (``native.weights.refill``, timed), after
  the rollout, after the engine is released, before each micro-batch's forward, before
  its backward (the saved activations), after its backward (the peak inside it), before
  and after the optimizer step;
- the bytes of the local parameter shards, of the sharded gradients, of AdamW's state and
  of FSDP2's unsharded gradients kept between micro-batches (``unsharded_accumulated_grad``
  and unsharded ``.grad``, what ``set_requires_gradient_sync(False)`` accumulates);
- per step: generate, weight gather, update and optimizer step seconds (host clock; a
  device sync only around the gather and the optimizer step);
- with ``PROBE_HISTORY_STEP=N`` (1-based): on every rank, the allocator's history over step N's
  update (``torch.cuda.memory._record_memory_history``), replayed on the device into the
  blocks alive at the update's peak (or at the out-of-memory error), grouped by the code
  that allocated them (the innermost library frame and the innermost grpo_hpc frame):
  a small summary, not the pickle;
- with ``PROBE_PROFILE_STEP=N``: rank 0's update of step N under ``torch.profiler``, as GPU
  kernel time by kind (GEMM, attention, NCCL, optimizer, other), the GPU's busy share and
  the top kernels.

Switches that change the run (to measure a fix before it is made):

- ``PROBE_FSDP_SYNC_EACH=1``: under FSDP2, reduce-scatter after every micro-batch instead of
  accumulating unsharded gradients through ``set_requires_gradient_sync(False)`` (since
  b613001 the trainer itself does this, so the switch changes nothing there any more);
- ``PROBE_RESHARD_AFTER_FORWARD=0``: ``fully_shard(..., reshard_after_forward=False)``
  (layers stay gathered from forward to backward: no second all-gather).

Two ways in:

    # the 2-GPU ladder's plan for one shape, budget and mode (as bench/memory/ladder.py runs it)
    python -m bench.memory.probe ladder --shape qwen2.5-7b --nproc 2 --steps 2 --out DIR
    # any run bench/speed/grpo_step.py makes: add --probe (probe files go to $PROBE_OUT)
    PROBE_OUT=DIR python -m bench.speed.grpo_step ... --probe
    # CPU smoke (gloo, fp32, the tiny shape)
    python -m bench.memory.probe ladder --device cpu --shape tiny --nproc 2 --steps 2 --out /tmp/p
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bench.memory.probe_core import GIB, Probe, _env_int, _fsdp_params, _local_bytes
from bench.memory.probe_history import _LIBS, _short, _site, summarize_history
from bench.memory.probe_hooks import child, install
from bench.memory.probe_ladder_row import ladder_run, summarize_probes
from bench.memory.probe_merge import merge
from bench.memory.probe_profiler import _kind, _start_profiler, _stop_profiler

__all__ = [  # every name of the single-file module, for ``from bench.memory.probe import X``
    "GIB", "Probe", "_LIBS", "_env_int", "_fsdp_params", "_kind", "_local_bytes", "_short",
    "_site", "_start_profiler", "_stop_profiler", "child", "install", "ladder_run", "main",
    "merge", "summarize_history", "summarize_probes",
]  # fmt: skip


def main() -> None:
    argv = sys.argv[1:]
    if argv and argv[0] == "merge":
        p = argparse.ArgumentParser()
        p.add_argument("cmd")
        p.add_argument("--name", required=True)
        p.add_argument(
            "--step-json", type=Path, required=True, help="bench/speed/grpo_step.py's --out"
        )
        p.add_argument("--probe-dir", type=Path, required=True)
        p.add_argument("--into", type=Path, required=True)
        a = p.parse_args(argv)
        merge(a.name, a.step_json, a.probe_dir, a.into)
        return
    if argv and argv[0] == "child":
        p = argparse.ArgumentParser()
        p.add_argument("cmd")
        p.add_argument("run_dir")
        p.add_argument("--cap-gib", type=float, default=0.0)
        a = p.parse_args(argv)
        sys.exit(child(a.run_dir, a.cap_gib))
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("cmd", choices=["ladder"])
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--shape", default="qwen2.5-7b", help="a name in bench/shapes")
    p.add_argument("--budget", default="h100", choices=["h100", "supercloud"])
    p.add_argument("--mode", default="full", choices=["full", "lora"])
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--G", type=int, default=8)
    p.add_argument("--max-new", type=int, default=512)
    p.add_argument("--micro-tokens", type=int, default=4096)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--cpu-offload", action="store_true", help="the plan with FSDP2 CPU offload")
    p.add_argument("--timeout", type=float, default=300.0)
    p.add_argument("--out", type=Path, required=True, help="folder for the probe files")
    p.add_argument("--summary", type=Path, help="write the summary JSON here")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    result = ladder_run(args)
    text = json.dumps(result, indent=1)
    if args.summary:
        args.summary.write_text(text + "\n")
    brief = {k: result[k] for k in ("shape", "settings", "exit_code", "wall_s", "reason")}
    brief["estimate_peak_gib"] = result["estimate"]["peak_gib"]
    for rank, m in result["measured"].items():
        brief[rank] = {"overall_peak_gib": m["overall_peak_gib"], **m["median_after_step1"]}
    print(json.dumps(brief))


if __name__ == "__main__":
    main()
