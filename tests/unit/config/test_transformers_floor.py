"""The transformers the package declares (setup.cfg) is one whose layouts the native
engine reads: Gemma 3 keeps every layer type's rotary table in its one ``rotary_emb``
(transformers 5; 4.x kept the sliding layers' in ``rotary_emb_local``, which the native
engine would silently not read: grpo_hpc.train.rollout.native.architecture.rope_tables)."""

from __future__ import annotations

import configparser
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def _transformers_spec() -> str:
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    reqs = cfg["options"]["install_requires"].split("\n")
    return next(r.strip() for r in reqs if r.strip().startswith("transformers"))


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split("."))


def test_the_declared_floor_has_the_layouts_the_native_engine_reads() -> None:
    spec = _transformers_spec()
    floor = re.search(r">=\s*([\d.]+)", spec)
    assert floor is not None, spec
    assert _version(floor.group(1)) >= (5, 0), f"{spec}: 4.x keeps Gemma 3's rotary_emb_local"
    pinned = re.search(r"^transformers==([\d.]+)", (ROOT / "constraints-cpu.txt").read_text(), re.M)
    assert pinned is not None
    assert _version(pinned.group(1)) >= _version(floor.group(1))  # the tested one is allowed


def test_gemma3_of_the_tested_transformers_has_one_rotary_module_per_layer_type() -> None:
    """What the native engine's rope_tables reads: ``rotary_emb.rope_type`` a dict over the
    layer types, and no ``rotary_emb_local``."""
    from transformers import Gemma3TextConfig, Gemma3TextModel

    cfg = Gemma3TextConfig(
        vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, head_dim=8,
    )  # fmt: skip
    model = Gemma3TextModel(cfg)
    assert not hasattr(model, "rotary_emb_local")
    assert isinstance(model.rotary_emb.rope_type, dict)
    assert set(model.rotary_emb.rope_type) >= set(cfg.layer_types)
