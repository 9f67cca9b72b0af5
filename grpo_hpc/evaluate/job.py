"""``grpo-eval --profile P``: the same evaluation as a one-node job of a cluster profile.

The job runs ``grpo-eval ... --profile local`` on the compute node (the profile's setup
lines first: modules, environment), writes the result JSON to ``--out`` (made absolute:
the login and compute nodes share the filesystem, as they must for the runs directory),
and ``grpo-eval`` on the login node waits for it and prints the same summary line. The
job's sbatch script and logs are kept beside the result, in ``<out>.submitit/``. One GPU
is enough for an evaluation: the profile's node count is ignored (one node, one task).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from grpo_hpc.config.profiles import Profile, render_setup
from grpo_hpc.core.errors import ConfigError, ExitCode, GrpoError

HOPELESS_REASONS = frozenset(
    {
        "PartitionConfig",
        "PartitionNodeLimit",
        "PartitionTimeLimit",
        "BadConstraints",
        "InvalidQOS",
        "InvalidAccount",
        "QOSMaxGRESPerJob",
        "QOSMaxCpuPerJobLimit",
        "QOSMaxMemoryPerJob",
        "QOSMaxWallDurationPerJobLimit",
    }
)
"""squeue reasons a pending job never leaves without a change to the request: the
partition, QOS or account cannot give what the profile asks (GRES type, nodes, time)."""


def hopeless(reason: str | None) -> bool:
    """Whether a pending job's ``reason`` can clear by waiting (pure)."""
    return reason is not None and reason.split(",")[0].strip() in HOPELESS_REASONS


def job_argv(argv: list[str], out: Path) -> list[str]:
    """The compute node's ``grpo-eval`` arguments: the user's, without ``--profile`` (and
    ``--no-wait``), running locally there and writing to the absolute ``out`` (pure)."""
    kept, skip = [], False
    for i, a in enumerate(argv):
        if skip:
            skip = False
            continue
        if a in ("--profile", "--out"):
            skip = i + 1 < len(argv)
            continue
        if a.startswith(("--profile=", "--out=")) or a == "--no-wait":
            continue
        kept.append(a)
    return [*kept, "--profile", "local", "--out", str(out)]


def job_parameters(profile: Profile, name: str, setup: list[str]) -> dict[str, Any]:
    """submitit parameters of an evaluation job: the profile's, on one node (pure)."""
    from grpo_hpc.submit.plan import executor_parameters

    params = executor_parameters(profile, name, setup)
    params["nodes"] = 1
    return params


def submit(
    argv: list[str], profile: Profile, out: Path, wait: bool, run_job: Callable[[list[str]], int]
) -> int:
    """Submit the evaluation (``run_job``, the compute node's grpo-eval, pickled by submitit),
    then (``wait``) follow it to the end; the exit code."""
    import submitit

    from grpo_hpc.core import slurm as slurm_query

    if profile.executor != "slurm":
        raise ConfigError(f"--profile {profile.name} is not a Slurm profile: use --profile local")
    slurm_query.check_available()
    out = out.resolve()
    folder = out.with_name(out.name + ".submitit")
    setup = render_setup(profile, {"run_name": out.stem, "run_dir": str(out.parent)})
    executor = submitit.AutoExecutor(folder=folder / "%j", cluster="slurm")
    executor.update_parameters(**job_parameters(profile, f"eval-{out.stem}", setup))
    said: list[str] = []
    try:
        with _stderr_captured(said):  # sbatch writes its refusal to our stderr: our one line
            job = executor.submit(run_job, job_argv(argv, out))
    except Exception as e:  # noqa: BLE001 - sbatch's refusal (wrapped by submitit): one line
        why = _sbatch_error(e, "".join(said))
        raise ConfigError(f"the cluster refused the evaluation job: {why}") from None
    print(f"submitted evaluation job {job.job_id} ({profile.name}); result -> {out}", flush=True)
    if not wait:
        print(f"follow it with squeue -j {job.job_id}; its log: {folder / str(job.job_id)}")
        return ExitCode.OK
    return _follow(job, out)


@contextlib.contextmanager
def _stderr_captured(sink: list[str]) -> Iterator[None]:
    """File descriptor 2 sent to a temporary file while the block runs (a child's stderr
    too); what was written is appended to ``sink``."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            sink.append(tmp.read().decode(errors="replace"))


def _sbatch_error(e: BaseException, stderr: str) -> str:
    """sbatch's own last ``error:`` line, from its stderr or submitit's wrapped exception
    (pure)."""
    parts = [e, e.__cause__, e.__context__]
    text = "\n".join([str(x) for x in parts if x is not None] + [stderr])
    errors = [x.strip() for x in text.splitlines() if "error:" in x]
    lines = [x.strip() for x in text.splitlines() if x.strip()]
    return errors[-1] if errors else (lines[-1] if lines else type(e).__name__)


def _follow(job: Any, out: Path) -> int:
    """Wait for the job with a one-line state display; then the summary line (or why not)."""
    from grpo_hpc.core import slurm as slurm_query
    from grpo_hpc.evaluate.local import summary_line

    start, last = time.monotonic(), ""
    while not job.done():
        reason = slurm_query.pending_reason(str(job.job_id))
        if hopeless(reason):
            slurm_query.cancel(str(job.job_id))
            raise ConfigError(
                f"evaluation job {job.job_id} can never start ({reason}): the profile asks for "
                "what its partition, QOS or account cannot give (GRES type, nodes, time); "
                "it was cancelled"
            )
        state = f"job {job.job_id}: {job.state} ({time.monotonic() - start:.0f} s)"
        if sys.stdout.isatty():
            print("\r" + state.ljust(len(last)), end="", flush=True)
        elif state.split(" (")[0] != last.split(" (")[0]:
            print(state, flush=True)
        last = state
        time.sleep(2.0)
    if sys.stdout.isatty():
        print()
    try:
        job.result()
    except Exception as e:  # noqa: BLE001 - the job's own error, as one line
        lines = [x for x in str(e).strip().splitlines() if x.strip()]
        raise GrpoError(
            f"evaluation job {job.job_id} failed: {lines[-1] if lines else e} "
            f"(log: {job.paths.stderr})"
        ) from None
    print(summary_line(json.loads(out.read_text()), out))
    return ExitCode.OK
