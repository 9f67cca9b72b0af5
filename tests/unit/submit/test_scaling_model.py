"""The multi-node step-time model (grpo_hpc/submit/scaling.py, docs/scaling.md): its
volumes by hand, its calibration against the measured one-node runs, its choices, and the
``scaling:`` line of a multi-node ``grpo-submit --dry-run``."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from grpo_hpc.config.load import build_config
from grpo_hpc.memory.plan import model_shape
from grpo_hpc.submit.scaling import (
    DOC_TABLES,
    MEASURED,
    NODE_KINDS,
    dense_bytes,
    estimate,
    for_params,
    markdown_table,
    node_kind_for,
    pick,
    scaling_line,
)
from tests.conftest import REPO

H100, V100 = NODE_KINDS["8xh100"], NODE_KINDS["2xv100"]


def test_volumes_per_step_by_hand() -> None:
    p = 1e9
    assert dense_bytes(p, "ddp", 7) == 8e9  # one all-reduce of fp32 grads, whatever M
    # M x (bf16 gather forward + again backward + fp32 reduce-scatter) + the rollout's gather
    assert dense_bytes(p, "fsdp", 1) == 2e9 + 2e9 + 4e9 + 2e9
    assert dense_bytes(p, "fsdp", 3) == 3 * 8e9 + 2e9


def test_two_h100_nodes_on_100_gbps_by_hand() -> None:
    m = MEASURED["0.5b"]
    e = estimate(m, H100, 2, 100, "ddp")
    network = 8 * m.params * (1 / 2) / (100 / 8 * 1e9 * 0.8)  # half the volume crosses, 80 %
    intra = 8 * m.params * (7 / 8) / 450e9
    assert e.network_s == pytest.approx(network) and e.comm_s == pytest.approx(network + intra)
    assert e.compute_s == pytest.approx(m.generate_s + m.update_s)
    assert e.step_s == pytest.approx(e.compute_s + e.comm_s)


def test_one_node_matches_the_measured_weak_scaling_on_four_h100s() -> None:
    """0.5B DDP on 4 H100s of one node measured 99-101 % of one GPU's step
    (bench/results/weak_scaling_h100x4_2026-11-27.md): the model gives 99 % or more."""
    four = dataclasses.replace(H100, gpus=4)
    e = estimate(MEASURED["0.5b"], four, 1, 100, "ddp")
    assert e.network_s == 0 and 0.99 <= e.efficiency < 1.0


def test_more_nodes_cost_more_and_faster_links_less() -> None:
    m = MEASURED["1.5b"]
    shares = [estimate(m, H100, n, 100, "ddp").comm_share for n in (1, 2, 8, 64)]
    assert shares == sorted(shares) and shares[-1] - shares[-2] < 0.05  # (n-1)/n saturates
    steps = [estimate(m, H100, 8, bw, "ddp").step_s for bw in (100, 200, 400)]
    assert steps == sorted(steps, reverse=True)


def test_the_plan_picks_ddp_where_it_fits_and_hsdp_would_beat_fsdp2_across_nodes() -> None:
    m = MEASURED["7b"]
    assert pick(MEASURED["0.5b"], H100, 8, 100, ddp_fits=True).strategy == "ddp"
    assert pick(m, H100, 8, 100, ddp_fits=False).strategy == "fsdp"  # 7B: 16 B/param > 80 GB
    fsdp, hsdp = (estimate(m, H100, 8, 100, s) for s in ("fsdp", "hsdp"))
    assert hsdp.network_s < fsdp.network_s / 4  # FSDP2's per-micro-batch gathers cross nodes


def test_v100_compute_is_scaled_by_the_datasheets() -> None:
    m = MEASURED["0.5b"]
    v = estimate(m, V100, 1, 100, "ddp").compute_s
    assert v == pytest.approx(m.generate_s * 3.35 / 0.90 + m.update_s * 989 / 112)


def test_node_kind_and_nearest_measurement() -> None:
    assert node_kind_for((7, 0), 2) == V100 and node_kind_for(None, 2) is None
    assert node_kind_for((9, 0), 2).gpus == 2
    key, m = for_params(0.135e9)
    assert key == "0.5b" and m.update_s == pytest.approx(MEASURED["0.5b"].update_s * 0.135 / 0.494)
    assert for_params(7e9)[0] == "7b" and for_params(1.3e9)[0] == "1.5b"
    line = scaling_line(None, (9, 0), 8, 2, None, "ddp")
    assert line == "scaling: not estimated: model size unknown"


def test_dry_run_of_a_multi_node_plan_prints_the_communication_share(tmp_path: Path) -> None:
    profile = yaml.safe_load((REPO / "templates" / "h100x2.yaml").read_text())
    profile |= {"nodes": 4, "link_gbps": 200}
    path = tmp_path / "h100x2x4.yaml"
    path.write_text(yaml.safe_dump(profile))
    args = ["--profile", str(path), "--config", "demo", "--dry-run", "--name", "d"]
    cmd = [sys.executable, "-m", "grpo_hpc.cli.submit", *args, "--logs", str(tmp_path / "logs")]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=120).stdout
    (line,) = [x for x in out.splitlines() if x.startswith("scaling:")]
    shape = model_shape(build_config("demo").model)  # SmolLM2-135M
    assert shape is not None and 0.1e9 < shape.params < 0.2e9
    assert line == scaling_line(shape.params, (9, 0), 2, 4, 200, "ddp"), line
    assert line.startswith("scaling: 4 nodes x 2 GPUs, 200 Gb/s: ddp step ~")


def test_the_docs_tables_are_the_models_own() -> None:
    text = (REPO / "docs" / "scaling.md").read_text()
    for model, kind, fits in DOC_TABLES:
        assert markdown_table(model, kind, fits) in text, (model, kind)
