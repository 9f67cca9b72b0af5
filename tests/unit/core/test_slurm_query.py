"""Parsing of sacct output and the job view built from it (pure; no Slurm needed)."""

from __future__ import annotations

from pathlib import Path

from grpo_hpc.core.runs import SlurmView, job_view
from grpo_hpc.core.slurm import JobRecord, parse_sacct, parse_submit_lines, parse_up_nodes


def test_parse_sacct_fields_and_states() -> None:
    text = (
        "11|CANCELLED by 0|0:15|00:00:33|1795279905\n"
        "12|PENDING|0:0|00:00:00|Unknown\n"
        "13|COMPLETED|0:0|1-02:03:04|1795280000\n"
        "garbage\n"
    )
    recs = parse_sacct(text)
    assert set(recs) == {"11", "12", "13"}
    assert recs["11"].state == "CANCELLED" and recs["11"].exit_code == 0
    assert recs["11"].elapsed_s == 33 and recs["11"].started_at == 1795279905.0
    assert recs["12"].started_at is None and recs["12"].active
    assert recs["13"].elapsed_s == 86400 + 2 * 3600 + 3 * 60 + 4
    assert recs["11"].nodes is None  # no NodeList column


def test_parse_sacct_node_list() -> None:
    text = (
        "21|RUNNING|0:0|00:01:00|1795279905|grpo-n[1-2]\n"
        "22|PENDING|0:0|00:00:00|Unknown|None assigned\n"
    )
    recs = parse_sacct(text)
    assert recs["21"].nodes == "grpo-n[1-2]" and recs["22"].nodes is None


def test_parse_submit_lines_keeps_only_this_runs_recent_jobs() -> None:
    d = Path("/logs/r/submitit")
    text = (
        "20|1000|sbatch /logs/r/submitit/.submission_file_a.sh\n"
        "21|1000|sbatch /logs/r2/submitit/.submission_file_b.sh\n"  # another run, same name
        "22|500|sbatch /logs/r/submitit/.submission_file_c.sh\n"  # before the intent
        "23|1001|sbatch --parsable /logs/r/submitit/.submission_file_d.sh\n"
    )
    assert parse_submit_lines(text, d, since=900) == ["20", "23"]
    squeue = "24|1002|/logs/r/submitit/.submission_file_e.sh\n"
    assert parse_submit_lines(squeue, d, since=900) == ["24"]


def test_ended_job_still_in_squeue_is_completing() -> None:
    entry = {"job_id": "11", "submitted_at": 1.0}
    rec = JobRecord("11", "CANCELLED", exit_code=0)
    assert job_view(entry, SlurmView({"11": rec}, {"11"}), []).state == "COMPLETING"
    assert job_view(entry, SlurmView({"11": rec}, set()), []).state == "CANCELLED"


def test_nodes_in_service_of_a_partition() -> None:
    """``sinfo -h -N -o %N|%t|%P``: a node down, drained or not responding (``*``) is not up;
    a node of two partitions counts once; None: the default partition (``*`` after it)."""
    text = "\n".join([
        "grpo-n1|idle|multi", "grpo-n2|down*|multi", "grpo-n3|mix|multi", "grpo-n4|drain|multi",
        "grpo-n5|idle*|multi", "grpo-n6|alloc|multi", "grpo-n6|alloc|other",
        "localhost|comp|debug*", "localhost|comp|debug*",
    ])  # fmt: skip
    assert parse_up_nodes(text, "multi") == 3
    assert parse_up_nodes(text, None) == 1
    assert parse_up_nodes(text, "gone") == 0
