"""The code reward: a completion's program, after the task's setup and followed by its
tests, run in the sandbox (:mod:`sandbox`), all or nothing; many at once on threads.
The training reward, its streamed part (:mod:`streaming`) and the held-out pass@k all
score code here."""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from grpo_hpc.train.rewards import sandbox

_FENCE_RE = re.compile(r"^```[ \t]*([\w+-]*)[ \t]*\n(.*?)^```", re.M | re.S)


def extract_code(completion: str) -> str:
    """The program in a completion: its ```python fenced blocks joined (untagged fences if
    none are tagged, an unclosed ```python block if truncated), else the whole text."""
    blocks = _FENCE_RE.findall(completion)
    tagged = [body for lang, body in blocks if lang.lower() in ("python", "py", "python3")]
    chosen = tagged or [body for lang, body in blocks if not lang]
    if chosen:
        return "\n".join(chosen)
    _, sep, rest = completion.partition("```python\n")
    return rest if sep else completion


CODE_TIMEOUT_S = 5.0
"""Wall-clock limit of one code-reward program (its setup, code and every test)."""
CODE_MEMORY_MB = 512
"""Address-space limit of one code-reward program."""


def code_reward(
    completion: str,
    tests: list[str],
    timeout_s: float = CODE_TIMEOUT_S,
    memory_mb: int = CODE_MEMORY_MB,
    setup: str = "",
) -> float:
    """1.0 if ``setup`` (trusted: a task's imports and helpers), then the extracted code,
    then every test line run cleanly in the sandbox.

    All-or-nothing on purpose: it is what pass@1 measures, GRPO already gets a graded signal
    from the spread within a group, and partial credit pays for special-casing the visible
    asserts one by one. No tests, or no code, scores 0.
    """
    code = extract_code(completion)
    if not tests or not code.strip():
        return 0.0
    program = f"{setup}\n\n{code}" if setup.strip() else code
    return 1.0 if sandbox.run_python(program, timeout_s, memory_mb, checks=tests).ok else 0.0


@functools.cache
def announce_sandbox() -> str:
    """Say once per process, in the training log, which sandbox runs the code reward
    (after it proved itself: see :func:`sandbox.proven_isolation`)."""
    iso = sandbox.proven_isolation()
    print(f"[Sandbox] code reward runs in {iso.name}: {iso.detail}", flush=True)
    return iso.name


def code_workers() -> int:
    """Sandboxes run at once: one per CPU this process may use, at most 8."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, min(8, cpus or 1))


CodeJob = tuple[str, tuple[str, ...], str]
"""What a code reward is computed from: (completion, test lines, setup)."""


def code_job(completion: str, sample: dict) -> CodeJob:
    """The code reward's inputs for one completion (pure)."""
    return completion, tuple(sample.get("tests") or ()), str(sample.get("setup") or "")


def run_code_job(job: CodeJob) -> float:
    """:func:`code_reward` of a :data:`CodeJob`."""
    completion, tests, setup = job
    return code_reward(completion, list(tests), setup=setup)


def code_scores(
    completions: Sequence[str],
    samples: Sequence[dict],
    workers: int = 0,
    known: dict[CodeJob, float] | None = None,
) -> list[float]:
    """:func:`code_reward` of each completion against its sample's ``tests`` and ``setup``,
    ``workers`` sandboxes at a time (0: :func:`code_workers`); the ones in ``known`` (run
    while the rollout decoded) are not run again. The training reward and the held-out
    pass@k both score code here."""
    announce_sandbox()
    known = known or {}
    jobs = [code_job(c, s) for c, s in zip(completions, samples, strict=True)]
    todo = [job for job in dict.fromkeys(jobs) if job not in known]
    # Sandboxes mostly wait on their child, so threads give real parallelism.
    with ThreadPoolExecutor(max_workers=workers or code_workers()) as pool:
        done = dict(zip(todo, pool.map(run_code_job, todo), strict=True))
    return [known[job] if job in known else done[job] for job in jobs]
