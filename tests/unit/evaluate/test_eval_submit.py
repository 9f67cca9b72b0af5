"""grpo-eval --profile: the compute node's arguments and the pending reasons that cannot
clear (pure parts of grpo_hpc.evaluate.job)."""

from __future__ import annotations

from pathlib import Path

from grpo_hpc.evaluate.job import hopeless, job_argv


def test_job_runs_the_same_evaluation_locally_with_an_absolute_out() -> None:
    argv = ["/runs/a", "--profile", "supercloud", "--data", "gsm8k:test", "--out", "r.json"]
    assert job_argv([*argv, "--no-wait"], Path("/home/me/r.json")) == [
        "/runs/a",
        "--data",
        "gsm8k:test",
        "--profile",
        "local",
        "--out",
        "/home/me/r.json",
    ]
    assert job_argv(["/runs/a", "--profile=h100x2", "--out=x.json"], Path("/o.json")) == [
        "/runs/a",
        "--profile",
        "local",
        "--out",
        "/o.json",
    ]


def test_only_reasons_that_need_a_changed_request_are_hopeless() -> None:
    assert hopeless("PartitionConfig") and hopeless("QOSMaxGRESPerJob")
    assert not hopeless("Resources") and not hopeless("Priority") and not hopeless(None)
    assert not hopeless("ReqNodeNotAvail, Reserved for maintenance")  # clears by itself
