"""torchrun target: ``torchrun ... -m grpo_hpc.train <run_dir>``.

Reads the run's resolved config, joins the process group, trains, and records how
it ended in progress.json (state, exit code, reason) before exiting with that code.
"""

from __future__ import annotations

from grpo_hpc.train.supervision import signals

signals.install_early()  # first: Slurm's warning may arrive while torch loads

import contextlib  # noqa: E402
import dataclasses  # noqa: E402
import os  # noqa: E402
import pickle  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402
import traceback  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import TYPE_CHECKING  # noqa: E402

from grpo_hpc.config.load import load_resolved  # noqa: E402
from grpo_hpc.core.errors import (  # noqa: E402
    ExitCode,
    GrpoError,
    RunDirBusyError,
    StoppedBeforeTrainingError,
)
from grpo_hpc.core.paths import RunPaths  # noqa: E402
from grpo_hpc.core.progress import (  # noqa: E402
    ProgressRecord,
    TrainState,
    read_progress,
    write_progress,
)
from grpo_hpc.train.distributed import cpu_binding  # noqa: E402
from grpo_hpc.train.supervision import gc_schedule  # noqa: E402

if TYPE_CHECKING:  # torch loads only after the early signal handlers (dist.init)
    from grpo_hpc.config.roles import Role
    from grpo_hpc.config.schema import Config
    from grpo_hpc.train.distributed.dist import DistInfo
    from grpo_hpc.train.rollout.progress import Progress
    from grpo_hpc.train.rollout.split import Link
    from grpo_hpc.train.supervision.liveness import Liveness
    from grpo_hpc.train.trainer import Trainer


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        sys.stderr.write("usage: torchrun ... -m grpo_hpc.train <run_dir>\n")
        return ExitCode.CONFIG_ERROR
    paths = RunPaths(Path(argv[0]).resolve())
    trainer = None
    pulse = None
    records = os.environ.get("RANK", "0") == "0"  # who writes progress.json before a trainer
    try:
        cfg = load_resolved(paths.config)
        _stop_if_signalled()
        if line := cpu_binding.bind(cfg.dist.bind_cpus):  # before torch starts its threads
            print(line, flush=True)
        with gc_schedule.imports_frozen():  # torch, the process group, transformers
            from grpo_hpc.config import roles
            from grpo_hpc.train.distributed import dist
            from grpo_hpc.train.rollout import progress

            info = dist.init(cfg.dist)
            role = roles.role_of(cfg, info.rank, info.world_size)
            records = role.records_progress
            work = progress.Progress() if role.name == roles.GENERATOR else None
            pulse = _watch_peers(cfg, paths, info, lambda: trainer, role, work)
            link = _split_link(cfg, info, role, pulse)
            from grpo_hpc.train.trainer import Trainer

        _stop_if_signalled()
        if link is not None and role.name == roles.GENERATOR:
            from grpo_hpc.train import generator

            code = generator.serve(link, paths.root, work)
        else:
            if link is not None:  # the trainers' ranks among themselves, in their group
                group = link.trainer_group
                info = dist.DistInfo(role.index, role.count, info.local_rank, info.device, group)
            trainer = Trainer(cfg, paths, info, stop_signal=signals.pending(), link=link)
            trainer.setup()
            code = trainer.run()
    except StoppedBeforeTrainingError as e:
        code = e.exit_code
        _record_failure(trainer, code, str(e), paths, TrainState.INTERRUPTED, records)
        sys.stderr.write(f"grpo_hpc.train: {e}\n")
    except GrpoError as e:
        code = e.exit_code
        if not isinstance(e, RunDirBusyError):  # progress.json is the other trainer's
            _record_failure(trainer, code, str(e), paths, records=records)
        sys.stderr.write(f"grpo_hpc.train: error: {e}\n")
    except Exception as e:  # noqa: BLE001 - a crash is recorded, then reported with its traceback
        if trainer is not None and _is_cuda_oom(e):
            code = ExitCode.OUT_OF_MEMORY
            reason, peak = _oom_outcome(trainer)
            trainer.tracker.update(
                TrainState.FAILED, exit_code=int(code), reason=reason, peak_gpu_gib=peak
            )
            sys.stderr.write(f"grpo_hpc.train: error: {reason}\n")
            return _finish(code)
        code = ExitCode.CRASH
        _record_failure(trainer, code, f"{type(e).__name__}: {e}", paths, records=records)
        traceback.print_exc()
    finally:
        rollouts = getattr(trainer, "rollouts", None)  # none when setup failed before it
        if rollouts is not None:
            rollouts.close()  # a split run: the generator stops with the trainer
        if pulse is not None:  # ending on our own: peers must not take it for a hang
            pulse.stop()
    return _finish(code)


def _split_link(cfg: Config, info: DistInfo, role: Role, pulse: Liveness | None) -> Link | None:
    """This process's end of a ``rollout.placement=split`` run (None for another run);
    refused (exit 2) where the split is not built (``config.validate.split_problem``);
    ``pulse``: this process's, where a trainer marks what it waits on."""
    if cfg.rollout.placement != "split":
        return None
    from grpo_hpc.config.validate import split_problem
    from grpo_hpc.core.errors import ConfigError
    from grpo_hpc.train.rollout import split

    problem = split_problem(cfg, info.world_size)
    if problem:
        raise ConfigError(problem)
    return split.connect(cfg, role, info.device, pulse.waiting_on if pulse is not None else None)


def _watch_peers(
    cfg: Config,
    paths: RunPaths,
    info: DistInfo,
    trainer: Callable[[], Trainer | None],
    role: Role,
    work: Progress | None = None,
) -> Liveness | None:
    """Start this rank's pulse and its watch on the others (grpo_hpc.train.supervision.liveness);
    None for one process or ``dist.peer_timeout_s=0``. ``work``: this rank's progress,
    written in its pulse (a generator's); a trainer waiting on a generator judges it."""
    from grpo_hpc.train.distributed import dist
    from grpo_hpc.train.rollout import progress
    from grpo_hpc.train.supervision import liveness

    timeout = cfg.dist.peer_timeout_s
    if info.world_size < 2 or timeout <= 0:
        return None
    launch = dist.launch_token(info)
    if info.is_main:
        liveness.clear_other_launches(paths.alive_dir, launch)

    def lost(ranks: list[int]) -> None:
        t = trainer()
        # the flight recorder first: which collective this rank waits in, kept in the run
        trace = dist.dump_flight_recorder(paths.nccl_trace, info.rank)
        waiting = liveness.waiting_in(_trace_entries(trace)) if trace is not None else None
        names = {r: pulse.name(r) for r in ranks}  # a split run's: the role, the host
        step = t.step if t is not None else 0
        reason = liveness.lost_reason(ranks, timeout, step, waiting, names)
        where = f" (flight recorder: {trace})" if trace is not None else ""
        end(ranks, reason, where)

    def stuck(rank: int, idle_s: float, what: str) -> None:
        reason = progress.stuck_reason(pulse.name(rank), idle_s, role.label, what)
        end([rank], reason, "")

    def end(ranks: list[int], reason: str, where: str) -> None:
        """Record ``reason``, end ``ranks`` where they run here, and leave (exit 4)."""
        t = trainer()
        code = ExitCode.STALLED
        if t is not None and t.info.is_main:  # the tracker's record: a heartbeat keeps it
            t.tracker.update(TrainState.FAILED, exit_code=int(code), reason=reason)
        else:  # rank 0 is the lost one (or not started): its record, marked failed
            rec = read_progress(paths.progress) or ProgressRecord(run=paths.name)
            rec = dataclasses.replace(
                rec, state=TrainState.FAILED, exit_code=int(code), reason=reason
            )
            write_progress(paths.progress, rec)
        sys.stderr.write(f"grpo_hpc.train: error: rank {info.rank}: {reason}{where}\n")
        sys.stderr.flush()
        for rank in ranks:  # a stopped or stuck peer here would hold torchrun 30 s more
            pid = pulse.local_pid(rank)
            if pid is not None:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
        os._exit(int(code))  # the main thread is blocked in a collective: leave now

    split = cfg.rollout.placement == "split"  # the pulse names the role where roles differ
    pulse = liveness.Liveness(
        paths.alive_dir / launch, info.rank, info.world_size, timeout, lost,
        role=role.label if split else None, progress=work,
        progress_timeout_s=cfg.rollout.progress_timeout_s if split else 0.0, on_stuck=stuck,
    )  # fmt: skip
    pulse.start()
    return pulse


def _trace_entries(trace: Path) -> list[dict]:
    """The entries of a flight-recorder dump (a pickle this rank just wrote itself)."""
    try:
        return list(pickle.loads(trace.read_bytes()).get("entries", []))
    except (OSError, pickle.UnpicklingError, AttributeError, EOFError):
        return []


def _finish(code: int) -> int:
    # The outcome is recorded: a late Slurm signal during interpreter shutdown (when
    # Python restores default handlers) must not turn it into a crash.
    for sig in (signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, signal.SIG_IGN)
    if code == ExitCode.OK:
        from grpo_hpc.train.distributed import dist

        dist.shutdown()  # on failure peers may be gone; exiting is what unblocks them
    return int(code)


def _is_cuda_oom(e: BaseException) -> bool:
    import torch

    return isinstance(e, torch.cuda.OutOfMemoryError)


def _oom_outcome(trainer: object) -> tuple[str, float | None]:
    """The one-line reason for a CUDA out-of-memory error (phase, step, peak, and settings
    the estimator says would fit this GPU) and the peak in GiB (None without CUDA)."""
    import torch

    from grpo_hpc.memory import plan as memory_plan
    from grpo_hpc.train.distributed import gpu

    cfg = trainer.cfg
    phase = trainer.tracker.record.state.value
    injected = cfg.faults.enabled and cfg.faults.oom_at_step == trainer.step
    if torch.cuda.is_available():
        peak = torch.cuda.max_memory_allocated() / memory_plan.GIB
        capacity = gpu.total_gib(trainer.info.device)  # an emulated GPU's: its cap
        if injected:  # the card the fault made of this one (faults.before_update)
            capacity = min(capacity, cfg.faults.oom_gpu_gb)
        seen = f"peak {peak:.1f} GiB allocated of {capacity:.3g} GiB"
    else:  # only an injected fault gets here (faults.oom_at_step)
        peak, capacity = None, cfg.faults.oom_gpu_gb
        seen = f"peak unknown (no CUDA device; injected on a {capacity:g} GiB GPU)"
    nodes = max(1, trainer.info.world_size // cfg.dist.nproc_per_node)
    advice = memory_plan.oom_advice(cfg, capacity, nodes)
    return f"CUDA out of memory while {phase} at step {trainer.step} ({seen}); {advice}", peak


def _stop_if_signalled() -> None:
    """Before the trainer exists no step has run in this attempt: exit 5 at once."""
    sig = signals.pending()
    if sig is not None:
        raise StoppedBeforeTrainingError(
            f"stopped on {signal.Signals(sig).name} during start-up, before any step of this "
            "attempt: nothing new to checkpoint; resubmit me"
        )


def _record_failure(
    trainer: object,
    code: int,
    reason: str,
    paths: RunPaths,
    state: TrainState = TrainState.FAILED,
    records: bool = True,
) -> None:
    """``records``: this process keeps progress.json when no trainer does (rank 0, or a
    split run's trainer 0: never a generator)."""
    if trainer is not None:
        trainer.tracker.update(state, exit_code=int(code), reason=reason)
    elif records:  # failed before the trainer existed
        rec = ProgressRecord(run=paths.name, state=state, exit_code=int(code), reason=reason)
        write_progress(paths.progress, rec)


if __name__ == "__main__":
    sys.exit(main())
