"""What the trainer tells the outside world: progress.json, metrics.jsonl, W&B, console.

Only rank 0 writes. Heartbeats are throttled (a write every ``min_interval_s``)
because generation calls ``heartbeat()`` once per token. progress.json, the metrics and
samples lines and the console lines are written from a thread of its own
(:class:`ProgressWriter`): a step never waits on the filesystem for them.

While the trainer loads (state LOADING: the model read, wrapped, the engine built, a
checkpoint resumed) nothing in the loop beats, and loading a 7B-70B model from a busy
shared filesystem can take longer than the monitor's heartbeat timeout. So a thread beats
then (:meth:`Tracker.beat_while_loading`), every ``training.setup_heartbeat_s``, through
this tracker's own record and writer (one writer of progress.json). What that beat proves
is only that the process is alive and still loading: a read stuck on the filesystem or a
rank waiting for a hung peer leaves the thread running. A hung load is caught by the
monitor's ``step0_timeout`` (the only limit it applies to LOADING:
``grpo_hpc.monitor.decision.stall_limits``), a dead process by its job ending. The thread
never beats for any other state: it stops at the first state change out of LOADING (the
step-0 evaluation's or the first step's generation, both of which the engine's per-token
tick covers), when setup fails, and at :meth:`Tracker.finish`.
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from grpo_hpc.config.schema import Config
from grpo_hpc.core.fsutil import atomic_write_text, jsonl_line
from grpo_hpc.core.paths import RunPaths
from grpo_hpc.core.progress import ProgressRecord, ProgressWriter, TrainState, read_progress

if TYPE_CHECKING:
    import torch


@dataclass
class Tracker:
    paths: RunPaths
    cfg: Config
    is_main: bool
    min_interval_s: float = 2.0
    record: ProgressRecord = field(init=False)
    _last_write: float = 0.0
    _wandb: Any = None
    _writer: ProgressWriter | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    """Held while the record is changed and queued: the loading beat's thread and the
    trainer's never queue a half-updated record."""
    _beat: tuple[threading.Event, threading.Thread] | None = None
    """The loading beat's stop event and thread, while it runs."""
    _beat_error: BaseException | None = None
    """A write that failed in the loading beat's thread, raised by the next update."""

    def __post_init__(self) -> None:
        previous = read_progress(self.paths.progress)
        job_id = os.environ.get("GRPO_HPC_JOB_ID") or os.environ.get("SLURM_JOB_ID")
        self.record = ProgressRecord(
            run=self.paths.name,
            attempt=previous.attempt + 1 if previous else 0,
            job_id=job_id,
            max_steps=self.cfg.training.max_steps,
            restarts=previous.restarts if previous else 0,
            last_checkpoint=self.paths.latest_checkpoint(),
        )

    # ---------------------------------------------------------------- progress
    def update(self, state: TrainState | None = None, **fields: Any) -> None:
        """Set fields and write progress now (state changes are never throttled). A state
        other than LOADING ends the loading beat."""
        with self._lock:
            if state is not None:
                self.record.state = state
            for k, v in fields.items():
                setattr(self.record, k, v)
            self._write()
        if self.record.state is not TrainState.LOADING:
            self.stop_loading_beat()

    def heartbeat(self) -> None:
        if time.time() - self._last_write >= self.min_interval_s:
            with self._lock:
                self._write()

    def beat_while_loading(self, every_s: float) -> None:
        """Rank 0: write the heartbeat every ``every_s`` seconds from a daemon thread for
        as long as the record's state is LOADING (module docstring: what it proves, and
        what catches a hung load). Stopped by the first update to another state, by
        :meth:`stop_loading_beat` and by :meth:`finish`."""
        if not self.is_main or self._beat is not None:
            return
        if every_s <= 0:
            raise ValueError(f"loading heartbeat interval must be > 0 s, not {every_s}")
        stop = threading.Event()

        def beat() -> None:
            while not stop.wait(every_s):
                with self._lock:
                    if stop.is_set() or self.record.state is not TrainState.LOADING:
                        return
                    try:
                        self._write()
                    except BaseException as e:  # noqa: BLE001 - raised in the trainer's thread
                        self._beat_error = e
                        return

        thread = threading.Thread(target=beat, name="grpo-loading-beat", daemon=True)
        self._beat = (stop, thread)
        thread.start()

    def stop_loading_beat(self) -> None:
        """End the loading beat (if it runs) and wait for its thread: once this returns, it
        writes nothing more."""
        beat, self._beat = self._beat, None
        if beat is None:
            return
        stop, thread = beat
        stop.set()
        if thread is not threading.current_thread():
            thread.join()

    def _write(self) -> None:
        if not self.is_main:
            return
        if self._beat_error is not None:  # set by the beat's thread as it ends: never seen there
            error, self._beat_error = self._beat_error, None
            raise error
        now = time.time()
        self.record.heartbeat = now
        self._io().put(self.record)  # returns at once unless the state is terminal
        self._last_write = now

    def _io(self) -> ProgressWriter:
        if self._writer is None:
            self._writer = ProgressWriter(self.paths.progress)
        return self._writer

    def _emit(self, path: Path | None, row: dict | None = None, text: str = "") -> None:
        """Queue a JSONL row for ``path`` (stamped with the time) or a console line
        (``path`` None), behind everything queued before it."""
        line = jsonl_line({"time": time.time(), **row}) if row is not None else text + "\n"
        self._io().append(path, line)

    def flush(self) -> None:
        """Wait until every record and line is written (rank 0; no-op elsewhere)."""
        if self._writer is not None:
            self._writer.flush()

    # ---------------------------------------------------------------- metrics
    def log_step(self, metrics: dict[str, float]) -> None:
        if not self.is_main:
            return
        clean = {
            k: (v if isinstance(v, (int, str)) or math.isfinite(v) else None)
            for k, v in metrics.items()
        }
        self._emit(self.paths.metrics, clean)
        if self._wandb is not None:
            self._wandb.log(
                {k: v for k, v in clean.items() if v is not None}, step=int(metrics["step"])
            )
        self._emit(None, text=console_line(metrics))

    def log_samples(self, rows: list[dict]) -> None:
        """Append a step's sample completions (:func:`step_samples`) to samples.jsonl."""
        if not self.is_main:
            return
        for row in rows:
            self._emit(self.paths.samples, row)

    def log_eval(
        self, step: int, accuracy: float, correct: int, total: int, strict: float, seconds: float
    ) -> None:
        """``accuracy``: judged as the run's correctness reward judges; ``strict``: with an
        answer convention required (the same figure when the run requires one)."""
        if not self.is_main:
            return
        row = {"eval/accuracy": accuracy, "eval/accuracy_strict": strict, "eval/seconds": seconds}
        self._emit(self.paths.metrics, {"step": step, **row})
        if self._wandb is not None:
            self._wandb.log(row, step=step)
        self._emit(
            None,
            text=f"[Eval] step {step}: greedy accuracy {accuracy:.3f} ({correct}/{total}), "
            f"with an answer line {strict:.3f} ({seconds:.0f} s)",
        )

    def log_eval_samples(self, step: int, rows: list[dict]) -> None:
        """An evaluation's completions, scored (``eval_samples/step_N.jsonl``, rewritten
        whole: a resumed run that evaluates the step again replaces it), and a W&B table."""
        if not self.is_main:
            return
        text = "".join(jsonl_line(r) for r in rows)
        atomic_write_text(self.paths.eval_samples_at(step), text, sync=False)
        if self._wandb is not None and rows:
            import wandb

            cols = [k for k in rows[0] if k != "step"]
            table = wandb.Table(columns=cols, data=[[r[k] for k in cols] for r in rows])
            self._wandb.log({"eval/samples": table}, step=step)

    def log_save(self, step: int, seconds: dict[str, float]) -> None:
        """A checkpoint's time, in parts (:class:`grpo_hpc.train.state.checkpoint.SaveClock`):
        one ``ckpt/*`` row in metrics.jsonl and one console line (rank 0's own times)."""
        if not self.is_main:
            return
        total = sum(seconds.values())
        self._emit(
            self.paths.metrics,
            {"step": step, "ckpt/seconds": total, **{f"ckpt/{k}_s": v for k, v in seconds.items()}},
        )
        parts = ", ".join(f"{k} {v:.1f} s" for k, v in seconds.items() if v >= 0.05)
        self._emit(None, text=f"[Checkpoint] step {step} saved in {total:.1f} s ({parts})")

    def log_pass_at_k(
        self, step: int, rates: dict[int, float], passed: int, total: int, seconds: float
    ) -> None:
        """Held-out code evaluation: ``rates`` maps k to pass@k over the problems;
        ``passed`` of ``total`` judged completions ran every test."""
        if not self.is_main:
            return
        row: dict[str, float] = {f"eval/pass@{k}": v for k, v in sorted(rates.items())}
        row["eval/seconds"] = seconds
        self._emit(self.paths.metrics, {"step": step, **row})
        if self._wandb is not None:
            self._wandb.log(row, step=step)
        shown = ", ".join(f"pass@{k} {v:.3f}" for k, v in sorted(rates.items()))
        self._emit(
            None,
            text=f"[Eval] step {step}: held-out {shown} ({passed}/{total} completions passed "
            f"every test, {seconds:.0f} s)",
        )

    def start_wandb(self) -> None:
        """One W&B run per training run across attempts: the id is stored in the run dir."""
        if not self.is_main or self.cfg.wandb.mode == "disabled":
            return
        try:
            import wandb
        except ImportError:
            print("wandb not installed: metrics go to metrics.jsonl only", file=sys.stderr)
            return
        id_file = self.paths.wandb_id
        if not id_file.is_file():
            atomic_write_text(id_file, uuid.uuid4().hex[:12] + "\n")
        self._wandb = wandb.init(
            project=self.cfg.wandb.project,
            name=self.paths.name,
            id=id_file.read_text().strip(),
            resume="allow",
            mode=self.cfg.wandb.mode,
            dir=str(self.paths.root),
            config=dataclasses.asdict(self.cfg),
        )

    def finish(self) -> None:
        """The end of the run's loop: the loading beat stopped, every queued line written,
        W&B closed."""
        self.stop_loading_beat()
        self.flush()
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None


def step_metrics(
    step: int,
    cfg: Config,
    sums: list[float],
    component_names: list[str],
    world_size: int,
    generated: float = 0.0,
) -> dict[str, float]:
    """Metrics of one step from globally summed values (pure): ``sums`` holds
    [reward total, completions, generated tokens, generation seconds summed over ranks,
    sum of squared rewards, then one total per reward component]. ``generated``: the
    completions those tokens belong to, when dynamic sampling generated more rounds than
    the step kept (0: the kept completions are all there were)."""
    n = max(sums[1], 1)
    mean = sums[0] / n
    m: dict[str, float] = {
        "step": step,
        "max_steps": cfg.training.max_steps,
        "prompts": cfg.rollout.prompts_per_step,
        "group_size": cfg.rollout.num_generations,
        "completions": int(sums[1]),
        "reward/mean": mean,
        "reward/std": math.sqrt(max(sums[4] / n - mean * mean, 0.0)),
        "tokens_per_s": sums[2] / max(sums[3] / world_size, 1e-9),
        "gen_len/mean": sums[2] / (generated or n),
        "world_size": world_size,
    }
    if cfg.rollout.placement == "split":  # world_size counts the trainers; the job has these too
        m["generators"] = cfg.rollout.generators
    for name, total in zip(component_names, sums[5:], strict=True):
        m[f"reward/{name.rsplit(':', 1)[-1]}"] = total / n
    return m


WARMUP_STEPS = 2
"""Steps in which torch.compile is expected to build its graphs (the first rollout's shapes
and the first update's)."""


def compiled_graphs() -> int:
    """Graphs torch.compile has built in this process so far (Dynamo's own counter; 0 when
    nothing is compiled). A count that still grows after warm-up is recompilation: each
    costs seconds, and a step that recompiles is not a step like its neighbours."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def recompile_reasons() -> list[str]:
    """Why Dynamo recompiled in this process so far, oldest first: the function and the
    guard that failed (``forward (models.py:88): tensor 'x' size mismatch at index 0``).
    Read from Dynamo's own record of guard failures, so a run's log says which shape or
    value made it compile again, not only that it did."""
    from torch._dynamo.utils import guard_failures

    return [
        f"{code.co_name} ({Path(code.co_filename).name}:{code.co_firstlineno}): {reason}"
        for code, reasons in list(guard_failures.items())
        for reason in reasons
    ]


def gpu_memory_metrics(device: torch.device) -> dict[str, float]:
    """This process's GPU memory figures of the step (none on a CPU): the peak allocated,
    and the times the caching allocator had to free its cache and retry a cudaMalloc. Each
    retry is a device-wide sync, so a count that grows step by step means memory is nearly
    full and the step runs slower than its kernels (reading them does not sync the GPU).
    ``gpu_reserved_gb``: what the caching allocator holds from the device; one that still
    grows after warm-up is a step paying for new device memory (real 2-GPU runs: the update's time
    drifted down over real runs, 1.0 s early to 0.76 s late). A count of segments stood in
    for it until two real runs showed it 0 throughout: under ``expandable_segments`` (the
    ``h100x2`` profile's allocator setting) memory grows by mapping pages into one
    segment, not by new segments."""
    if device.type != "cuda":
        return {}
    import torch

    stats = torch.cuda.memory_stats()
    return {
        "gpu_mem_gb": torch.cuda.max_memory_allocated() / 2**30,
        "gpu_alloc_retries": stats.get("num_alloc_retries", 0),
        "gpu_reserved_gb": torch.cuda.memory_reserved() / 2**30,
    }


def recompile_line(
    step: int, before: int, after: int, why: Sequence[str] = (), rank: int | None = None
) -> str | None:
    """The training log's line when a step after warm-up built new graphs in this process
    (pure); ``why``: this step's new :func:`recompile_reasons` (the first two are named);
    ``rank``: named when the job has several (each prints its own)."""
    if step <= WARMUP_STEPS or after <= before:
        return None
    who = f" (rank {rank})" if rank is not None else ""
    line = (
        f"[Compile] step {step}{who}: torch.compile built {after - before} new graph(s) "
        f"({after} in all): a recompilation; this step's time is not the steady one"
    )
    if why:
        named = "; ".join(r[:240] for r in why[:2])
        more = f" (+{len(why) - 2} more)" if len(why) > 2 else ""
        line += f"; why: {named}{more}"
    return line


def console_line(m: dict[str, float]) -> str:
    """``[Step 3/20] [Generate] 4x8=32 (3.1s) [Reward] mean=0.41 ...`` (pure)."""

    def f(key: str, fmt: str = ".3f") -> str:
        v = m.get(key)
        return (
            "-" if v is None or (isinstance(v, float) and not math.isfinite(v)) else format(v, fmt)
        )

    return (
        f"[Step {int(m['step'])}/{int(m['max_steps'])}] "
        f"[Generate] {int(m['prompts'])}x{int(m['group_size'])}={int(m['completions'])} "
        f"({f('time/generate', '.1f')}s, {f('tokens_per_s', '.0f')} tok/s) "
        f"[Reward] mean={f('reward/mean')} correct={f('reward/correctness')} "
        + (f"code={f('reward/code')} " if "reward/code" in m else "")
        + f"[Train] loss={f('loss', '.4f')} kl={f('kl', '.4f')} clip={f('clip_frac', '.2f')} "
        f"gnorm={f('grad_norm', '.2f')} [Time] {f('time/step', '.1f')}s"
    )


def step_samples(step: int, scored: list[Any], n: int) -> list[dict]:
    """Up to ``n`` completions of a step, the first of each group, the first groups first
    (``scored``: the step's :class:`~grpo_hpc.train.algo.batching.Scored` rollouts). Pure."""
    rows: list[dict] = []
    for s in scored:
        g = s.rewards.shape[1]
        for group, question in enumerate(s.questions):
            if len(rows) >= n:
                return rows
            i = group * g
            finished = s.batch.finished
            rows.append(
                {
                    "step": step,
                    "question": question,
                    "completion": s.batch.texts[i],
                    "reward": float(s.rewards[group, 0]),
                    "tokens": int(s.batch.completion_mask[i].sum()),
                    "finished": None if finished is None else bool(finished[i]),
                }
            )
    return rows
