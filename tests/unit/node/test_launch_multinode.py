"""The per-node torchrun command and the rendezvous address of a multi-node job (pure)."""

from __future__ import annotations

import pytest

from grpo_hpc.node.launch import NodeContext, rendezvous_host, rendezvous_port, torchrun_command


def test_one_node_is_standalone() -> None:
    cmd = torchrun_command("/runs/r", 2, NodeContext(job_id="7"), python="py")
    assert cmd[:5] == ["py", "-m", "torch.distributed.run", "--nproc-per-node=2", "--standalone"]
    assert not any(a.startswith("--rdzv") for a in cmd)


def test_nodes_meet_at_the_first_node_by_job_id() -> None:
    ctx = NodeContext(nnodes=2, node_rank=1, master_addr="10.0.0.5", job_id="123")
    cmd = torchrun_command("/runs/r", 1, ctx, python="py")
    port = rendezvous_port("123")
    assert "--nnodes=2" in cmd and "--rdzv-backend=c10d" in cmd
    assert f"--rdzv-endpoint=10.0.0.5:{port}" in cmd and "--rdzv-id=123" in cmd
    assert "--standalone" not in cmd
    # c10d numbers the nodes itself; torchrun would only warn about --node-rank.
    assert not any(a.startswith("--node-rank") for a in cmd)
    assert cmd[-3:] == ["-m", "grpo_hpc.train", "/runs/r"]


def test_rendezvous_port_differs_between_jobs_and_stays_in_range() -> None:
    ports = {rendezvous_port(str(j)) for j in range(100, 200)}
    assert len(ports) == 100 and all(29500 <= p < 49500 for p in ports)


def test_first_node_is_resolved_inside_the_job() -> None:
    assert rendezvous_host("localhost") == "127.0.0.1"


def test_unresolvable_first_node_says_what_to_fix() -> None:
    with pytest.raises(RuntimeError, match="cannot resolve the first node 'no-such-node.invalid'"):
        rendezvous_host("no-such-node.invalid")
