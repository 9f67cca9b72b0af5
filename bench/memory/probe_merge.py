"""One ``bench/speed/grpo_step.py --probe`` run (its result and its probe files) added to a
results file under a name."""

from __future__ import annotations

import json
from pathlib import Path

from bench.memory.probe_ladder_row import summarize_probes


def merge(name: str, step_json: Path, probe_dir: Path, into: Path) -> None:
    """Add one bench/speed/grpo_step.py run (its result and its probe files) to ``into`` under
    ``name``; a run that wrote no result is recorded with what its probe saw."""
    doc = json.loads(into.read_text()) if into.exists() else {"runs": {}}
    step = json.loads(step_json.read_text()) if step_json.exists() else {"failed": True}
    probes = [json.loads(f.read_text()) for f in sorted(probe_dir.glob("probe_rank*.json"))]
    for p in probes:  # keep the file small: the per-record list is summarised
        p["records"] = [r for r in p["records"] if r.get("step", 0) in (0, 2)]
    step.pop("lengths", None)
    doc["runs"][name] = {"grpo_step": step, "probe": summarize_probes(probes)}
    into.write_text(json.dumps(doc, indent=1) + "\n")
    meds = {k: v["median_after_step1"] for k, v in doc["runs"][name]["probe"].items()}
    print(name, json.dumps(meds))
