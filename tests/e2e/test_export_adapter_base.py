"""A LoRA adapter exported with ``grpo-export RUN OUT --adapter`` from a run on the built-in
``tiny`` model names a base model PEFT loads: the run's own ``tiny_model/`` as
an absolute path, not the alias. A user loads it the documented way, offline and from
another directory, with the base read from ``adapter_config.json``, and gets the merged
export's logits."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from grpo_hpc.cli.export import main as export_main
from grpo_hpc.core.paths import RunPaths
from tests.e2e.export_helpers import TEXTS
from tests.e2e.helpers import make_run, train
from tests.slowdown import guard

pytestmark = pytest.mark.slow

# What a user runs later, on a node without internet, knowing nothing but the adapter's
# directory: the base comes from adapter_config.json.
LOAD = """
import json, sys
import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer

adapter, merged, texts = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
base = json.load(open(f"{adapter}/adapter_config.json"))["base_model_name_or_path"]
kw = dict(attn_implementation="sdpa")
model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base, **kw), adapter)
want = AutoModelForCausalLM.from_pretrained(merged, **kw).eval()
enc = AutoTokenizer.from_pretrained(merged)(
    texts, return_tensors="pt", padding=True, add_special_tokens=False
)
plain = AutoModelForCausalLM.from_pretrained(base, **kw).eval()
with torch.no_grad():
    got, ref, untrained = (m.eval()(**enc).logits for m in (model, want, plain))
mask = enc["attention_mask"].bool()
diff = (got - ref).abs()[mask].max().item()
trained = (ref - untrained).abs()[mask].max().item()
print(json.dumps({"base": base, "max_logit_diff": diff, "trained_vs_base": trained}))
"""


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory: pytest.TempPathFactory) -> RunPaths:
    run = make_run(
        tmp_path_factory.mktemp("runs"), "lora", "training.max_steps=2", "model.lora_rank=4"
    )
    result = train(run)
    assert result.returncode == 0, result.stderr[-3000:]
    return run


def test_tiny_adapter_loads_with_peft_from_its_config(
    lora_run: RunPaths, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    merged, adapter = tmp_path / "merged", tmp_path / "adapter"
    assert export_main([str(lora_run.root), str(merged)]) == 0
    assert export_main([str(lora_run.root), str(adapter), "--adapter"]) == 0
    capsys.readouterr()
    written = json.loads((adapter / "adapter_config.json").read_text())
    base = written["base_model_name_or_path"]
    assert base == str(lora_run.tiny_model.resolve()) and Path(base).is_absolute()
    # The provenance keeps the config's own name for the model.
    assert json.loads((adapter / "grpo_export.json").read_text())["base_model"] == "tiny"

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONPATH": ""}
    env["OMP_NUM_THREADS"] = "1"
    proc = subprocess.run(
        [sys.executable, "-c", LOAD, str(adapter), str(merged), json.dumps(TEXTS)],
        capture_output=True,
        text=True,
        cwd=elsewhere,  # not the repository, not the run: the path must stand on its own
        env=env,
        timeout=guard(300),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["base"] == base
    # PEFT's adapter on the named base is the merged export (fp32: rounding only).
    assert out["max_logit_diff"] < 1e-5, out
    # ... and it is the trained adapter, not a zero update of the base.
    assert out["trained_vs_base"] > 1e-4, out
