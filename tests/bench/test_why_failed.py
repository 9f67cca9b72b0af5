"""bench.common.why_failed on what torchrun really printed when its rank failed
(tests/fixtures/torchrun_failed_stderr.txt: ``torchrun --standalone --nproc-per-node=1 -m
grpo_hpc.train /tmp/no-such-run``, torch 2.13, recorded 2026-12-02, paths shortened)."""

from __future__ import annotations

from pathlib import Path

from bench.common import why_failed

RECORDED = (Path(__file__).parents[1] / "fixtures" / "torchrun_failed_stderr.txt").read_text()


def test_the_cause_is_the_ranks_own_words_not_torchruns_report() -> None:
    text = why_failed(RECORDED, "progress.json: failed, exit 2: no config")
    lines = text.splitlines()
    assert lines[0] == "progress.json: failed, exit 2: no config"
    assert lines[1].startswith("grpo_hpc.train: error: cannot read config")
    assert "exitcode  : 2" in lines[-1]
    # torchrun's own traceback and its report's boilerplate are left out
    assert "launch_agent" not in text and "To enable traceback" not in text


def test_stderr_without_a_torchrun_report_is_kept_as_it_is() -> None:
    assert why_failed("Traceback ...\nValueError: bad\n") == "Traceback ...\nValueError: bad"
    assert why_failed("x" * 5000, keep=10) == "x" * 10
