"""bench/memory/ladder.py's family rows (``--shapes families``): one shape per model family of
docs/models.md, each a bench/shapes config the estimator plans for a one-H100 row."""

from __future__ import annotations

import argparse
import json

from bench.memory import ladder
from bench.memory.ladder_plan import FAMILY_SHAPES, SHAPES_DIR


def test_families_expands_to_the_family_shapes() -> None:
    assert ladder.expand_shapes(["tiny", "families"]) == ["tiny", *FAMILY_SHAPES]
    assert ladder.expand_shapes(["qwen2.5-0.5b"]) == ["qwen2.5-0.5b"]


def test_one_shape_per_native_family_beside_qwen2() -> None:
    """Every model_type the native engine decodes from bench/shapes, but Qwen2 (the default
    rows), has a family row; the mixture of experts (HF generate) has none."""

    def mtype(name: str) -> str:
        return json.loads((SHAPES_DIR / name / "config.json").read_text())["model_type"]

    shapes = {p.parent.name for p in SHAPES_DIR.glob("*/config.json")}
    every = {mtype(n) for n in shapes} - {"qwen2", "qwen3_moe"}
    assert {mtype(n) for n in FAMILY_SHAPES} == every


def test_the_estimator_plans_every_family_row() -> None:
    """Each row's one-GPU plan under the h100 budget, as the ladder asks it before running
    (on a CPU the plan is fp32: the same shapes, counted larger)."""
    args = argparse.Namespace(device="cpu", prompts=8, G=8, max_new=512, micro_tokens=4096)
    for name in FAMILY_SHAPES:
        for mode in ("full", "lora"):
            est = ladder.estimates(args, name, "h100", mode)
            assert est["gpu1"]["peak_gib"] > 0, (name, mode)
