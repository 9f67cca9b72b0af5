"""Found by the fault campaign (bench/faults/run.py, disk_full): five failed resubmissions in
five one-second passes (``submission failed: [Errno 28] No space left on device``) STOPPED
the run for good, although the disk had room again seconds later. Failures must persist
(SUBMIT_ERROR_WINDOW_S) before the monitor gives up."""

from __future__ import annotations

from pathlib import Path

from grpo_hpc.core.errors import GrpoError
from grpo_hpc.core.fsutil import read_jsonl
from grpo_hpc.monitor.decision import ActionKind as K
from grpo_hpc.monitor.loop import MAX_SUBMIT_ERRORS, SUBMIT_ERROR_WINDOW_S, monitor_run
from tests.unit.monitor.test_monitor_decide import FAST, NOW, FakeSlurm, jobs_of, make_run, rec

ENOSPC = GrpoError("submission failed: [Errno 28] No space left on device")


def _stops(paths) -> list[dict]:  # noqa: ANN001
    return [e for e in read_jsonl(paths.events) if e.get("action") == "STOP"]


def test_monitor_full_disk_submission_errors(tmp_path: Path) -> None:
    s = FakeSlurm()
    run = make_run(tmp_path, "a", "100", "TIMEOUT", s, progress=rec(run="a", job_id="100"))
    s.fail_submit = ENOSPC
    for i in range(2 * MAX_SUBMIT_ERRORS):  # ten passes, a second apart: the disk is full
        out = monitor_run(run, FAST, lambda i=i: NOW + i, s.backend())
        assert out is not None and out.error and "No space left" in out.error
    assert not _stops(run), "a full disk for seconds must not stop the run"
    s.fail_submit = None  # room again
    out = monitor_run(run, FAST, lambda: NOW + 11, s.backend())
    assert out.new_job_id == "201" and jobs_of(run) == ["100", "201"]


def test_persistent_submission_errors_still_stop(tmp_path: Path) -> None:
    s = FakeSlurm()
    run = make_run(tmp_path, "a", "100", "TIMEOUT", s, progress=rec(run="a", job_id="100"))
    s.fail_submit = ENOSPC
    step = SUBMIT_ERROR_WINDOW_S / (MAX_SUBMIT_ERRORS - 1)
    for i in range(MAX_SUBMIT_ERRORS):
        monitor_run(run, FAST, lambda i=i: NOW + i * step, s.backend())
    [stop] = _stops(run)
    assert stop["class"] == "budget_exhausted" and "No space left" in stop["reason"]
    assert monitor_run(run, FAST, lambda: NOW + 10 * step, s.backend()) is None  # sticky
    assert K.STOP.value == stop["action"]
