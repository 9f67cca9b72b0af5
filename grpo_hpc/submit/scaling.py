"""A step-time model for runs over several nodes (pure): one GPU's measured step, plus the
bytes DDP's and FSDP2's collectives move per step over the node's link. docs/scaling.md
derives it, calibrates it on the measured one-node runs and tabulates it.

Weak scaling: every GPU keeps its share of the batch, so its compute (generate + update)
stays what one GPU measured; what grows is communication. Per step and per GPU, with P
parameters, M micro-batches per rank, world W = nodes x g:

* DDP: one all-reduce of the fp32 gradients per step (the update accumulates without
  syncing: train/algo/update.py): 4P bytes, ring all-reduce.
* FSDP2 (``reshard_after_forward``, param dtype = compute dtype, fp32 reduction:
  train/distributed/dist.py): per micro-batch an all-gather of the parameters for the
  forward and another for the backward (2 bytes each in bf16/fp16) and a reduce-scatter of
  the fp32 gradients (4P); once per step the rollout's gather of the weights (2P).

* HSDP (not built: ``dist.strategy`` offers ddp and fsdp), for comparison: FSDP2's
  traffic inside each node, and across nodes only DDP's all-reduce of the gradients, once
  per step (each GPU all-reduces its shard with its peers on the other nodes).

A collective over W ranks costs its volume times (W-1)/W (all-gather, reduce-scatter; twice
that for an all-reduce) on the slowest path: inside a node the GPU's own link (NVLink or
PCIe), across nodes the node's network link, shared by its g GPUs (NCCL's hierarchical
algorithms move each byte across the network once per node). The network term uses
``nodes`` in place of W. No overlap with compute is assumed (an upper bound on the step;
the lower bound, fully hidden behind the update, is given beside it).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

GB = 1e9
DEFAULT_LINK_GBPS = 100.0
"""The link assumed where a profile gives no ``link_gbps``."""


@dataclass(frozen=True)
class NodeKind:
    """One kind of node: its GPUs and links."""

    name: str
    """How docs and --dry-run name it."""
    gpus: int
    """GPUs per node."""
    hbm_tb_s: float
    """One GPU's memory bandwidth, TB/s: decoding (generation) is bound by it."""
    tensor_tflops: float
    """One GPU's dense fp16/bf16 tensor throughput, TFLOP/s: the update is bound by it."""
    intra_gb_s: float
    """One GPU's bandwidth to its node's other GPUs for collectives, GB/s one way."""


NODE_KINDS = {
    "8xh100": NodeKind("8x H100 SXM (NVLink 4)", 8, 3.35, 989.0, 450.0),
    "8xa100": NodeKind("8x A100 SXM (NVLink 3)", 8, 2.04, 312.0, 300.0),
    "2xv100": NodeKind("2x V100 32GB (PCIe 3)", 2, 0.90, 112.0, 12.0),
}
"""Datasheet figures. The V100 nodes are taken as PCIe-connected (Supercloud's): with an
NVLink bridge the intra-node term shrinks, the network term does not change."""
CALIBRATED_ON = "8xh100"
"""The measured runs below ran on H100s (the 7B on H200s, counted as H100s: the same
tensor throughput, 4.8 TB/s memory: its generation is slightly favoured)."""


@dataclass(frozen=True)
class Measured:
    """One GPU's measured step of a model, from bench/results (weak scaling keeps it)."""

    params: float
    """Parameters."""
    generate_s: float
    """Generation per step on one GPU of CALIBRATED_ON."""
    update_s: float
    """Update per step on one GPU (forward, backward, optimizer)."""
    micro_batches: int
    """Micro-batches per rank per step (FSDP2 gathers and reduces once each)."""
    fsdp_compute: float = 1.0
    """FSDP2's compute over DDP's on one node where it was measured (per-layer collective
    launches, resharding), applied to FSDP2's compute everywhere."""
    source: str = ""
    """Where the figures are."""


MEASURED = {
    "0.5b": Measured(0.494e9, 0.464, 0.324, 1, 1.14,
                     "weak_scaling_h100x4_2026-11-27.md (1 GPU, call 7); FSDP2 1.14x: "
                     "fsdp2_vs_ddp_h100x4_2026-11-26.md"),
    "1.5b": Measured(1.54e9, 0.699, 0.814, 2, 1.04, "fsdp2_vs_ddp_h100x4_2026-11-26.md (1 GPU)"),
    "7b": Measured(7.6e9, 3.28, 8.67, 13, 1.0,
                   "mem_probe_7b_h200x2_2026-11-26.md (FSDP2, 2x H200, eager, 512 tokens)"),
}  # fmt: skip


def dense_bytes(params: float, strategy: str, micro_batches: int) -> float:
    """Bytes one GPU's collectives carry per step before the (W-1)/W factor (pure): DDP's
    all-reduce counted as twice its 4P, FSDP2's gathers (2P each) and reduce-scatters (4P)."""
    if strategy == "ddp":
        return 2 * 4 * params
    return micro_batches * (2 * 2 * params + 4 * params) + 2 * params


@dataclass(frozen=True)
class StepEstimate:
    """The model's step for one configuration."""

    strategy: str
    """ddp or fsdp."""
    nodes: int
    """Nodes."""
    compute_s: float
    """Generation + update on one GPU (what weak scaling keeps)."""
    comm_s: float
    """Communication per step (intra-node and network), none of it hidden."""
    network_s: float
    """The part of ``comm_s`` on the network between nodes."""

    @property
    def step_s(self) -> float:
        """The step without overlap (upper bound)."""
        return self.compute_s + self.comm_s

    @property
    def comm_share(self) -> float:
        """Communication's share of the step."""
        return self.comm_s / self.step_s

    @property
    def efficiency(self) -> float:
        """Weak-scaling efficiency against one GPU: compute / step."""
        return self.compute_s / self.step_s


def compute_s(m: Measured, kind: NodeKind, strategy: str) -> float:
    """One GPU's generate + update on ``kind``, scaled from the calibration hardware by
    memory bandwidth (generation) and tensor throughput (update) (pure)."""
    ref = NODE_KINDS[CALIBRATED_ON]
    gen = m.generate_s * ref.hbm_tb_s / kind.hbm_tb_s
    upd = m.update_s * ref.tensor_tflops / kind.tensor_tflops
    return (gen + upd) * (m.fsdp_compute if strategy == "fsdp" else 1.0)


def estimate(m: Measured, kind: NodeKind, nodes: int, link_gbps: float, strategy: str,
             link_efficiency: float = 0.8) -> StepEstimate:  # fmt: skip
    """The model's step for ``nodes`` nodes of ``kind`` on links of ``link_gbps`` Gb/s
    (``link_efficiency`` of the line rate reached by NCCL's transfers) (pure)."""
    inside = "fsdp" if strategy == "hsdp" else strategy
    across = "ddp" if strategy == "hsdp" else strategy
    g = kind.gpus
    intra = dense_bytes(m.params, inside, m.micro_batches) * (g - 1) / g / (kind.intra_gb_s * GB)
    net_bytes_s = link_gbps / 8 * GB * link_efficiency
    volume = dense_bytes(m.params, across, m.micro_batches)
    network = volume * (nodes - 1) / nodes / net_bytes_s
    return StepEstimate(strategy, nodes, compute_s(m, kind, inside), intra + network, network)


def pick(m: Measured, kind: NodeKind, nodes: int, link_gbps: float, ddp_fits: bool) -> StepEstimate:
    """The strategy the plan should pick (pure): DDP where the model fits replicated and its
    step is not slower, else FSDP2."""
    fsdp = estimate(m, kind, nodes, link_gbps, "fsdp")
    if not ddp_fits:
        return fsdp
    ddp = estimate(m, kind, nodes, link_gbps, "ddp")
    return ddp if ddp.step_s <= fsdp.step_s else fsdp


def node_kind_for(capability: tuple[int, int] | None, gpus_per_node: int) -> NodeKind | None:
    """The node kind of a profile's GPUs (by compute capability: 7.x V100, 8.x A100, 9.x
    and up H100), with its GPU count; None for a profile without GPUs (pure)."""
    if capability is None or gpus_per_node < 1:
        return None
    key = "2xv100" if capability[0] < 8 else "8xa100" if capability[0] == 8 else "8xh100"
    return dataclasses.replace(NODE_KINDS[key], gpus=gpus_per_node)


def for_params(params: float) -> tuple[str, Measured]:
    """The measured model nearest in size (log scale), its step scaled to ``params`` (a
    step's work is proportional to the parameters at a fixed batch) (pure)."""
    key = min(MEASURED, key=lambda k: abs(math.log(params / MEASURED[k].params)))
    m, r = MEASURED[key], params / MEASURED[key].params
    scaled = dataclasses.replace(m, params=params, generate_s=m.generate_s * r,
                                 update_s=m.update_s * r)  # fmt: skip
    return key, scaled


def scaling_line(params: float | None, capability: tuple[int, int] | None, gpus_per_node: int,
                 nodes: int, link_gbps: float | None, strategy: str) -> str:  # fmt: skip
    """The ``scaling:`` line of a multi-node ``--dry-run`` (pure)."""
    kind = node_kind_for(capability, gpus_per_node)
    if kind is None or params is None:
        what = (
            "the profile names no GPUs (gpu_capability)" if kind is None else "model size unknown"
        )
        return f"scaling: not estimated: {what}"
    link = link_gbps or DEFAULT_LINK_GBPS
    assumed = "" if link_gbps else " (no link_gbps in the profile: assumed)"
    key, m = for_params(params)
    e = estimate(m, kind, nodes, link, strategy)
    other = estimate(m, kind, nodes, link, "fsdp" if strategy == "ddp" else "ddp")
    return (
        f"scaling: {nodes} nodes x {kind.gpus} GPUs, {link:g} Gb/s{assumed}: {strategy} step "
        f"~{e.step_s:.2f} s, communication {e.comm_share:.0%} ({e.network_s:.2f} s on the "
        f"network); {other.strategy} ~{other.step_s:.2f} s ({other.comm_share:.0%}) "
        f"[model: docs/scaling.md, one GPU's step as measured at {key}, scaled to "
        f"{params / 1e9:.2f}B]"
    )


DOC_NODES = (1, 2, 4, 8, 16, 32, 64)
DOC_LINKS = (100.0, 200.0, 400.0)
DOC_TABLES = (
    ("0.5b", "8xh100", True), ("1.5b", "8xh100", True), ("7b", "8xh100", False),
    ("0.5b", "2xv100", True), ("1.5b", "2xv100", True), ("7b", "2xv100", False),
)  # fmt: skip
"""docs/scaling.md's tables: (measured model, node kind, whether DDP fits replicated)."""


def markdown_table(model: str, kind: str, ddp_fits: bool) -> str:
    """One of docs/scaling.md's tables (pure): per node count and link, the strategy the plan
    should pick, its step (no overlap) and communication's share; HSDP beside FSDP2 where
    DDP does not fit (tests/unit/submit/test_scaling_model.py checks the docs hold these)."""
    m, k = MEASURED[model], NODE_KINDS[kind]
    links = [f"{bw:g} Gb/s" for bw in DOC_LINKS]
    extra = [] if ddp_fits else [f"HSDP at {links[0]} (not built)"]
    lines = [f"| nodes x {k.gpus} | " + " | ".join(links + extra) + " |"]
    lines.append("|---" * (1 + len(links) + len(extra)) + "|")
    for n in DOC_NODES:
        cells = []
        for bw in DOC_LINKS:
            e = pick(m, k, n, bw, ddp_fits)
            cells.append(f"{e.strategy} {e.step_s:.2f} s ({e.comm_share:.0%})")
        if not ddp_fits:
            h = estimate(m, k, n, DOC_LINKS[0], "hsdp")
            cells.append(f"{h.step_s:.2f} s ({h.comm_share:.0%})")
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
