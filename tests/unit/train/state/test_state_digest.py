"""State digests (grpo_hpc.train.state.state_digest): equal for a state and its round trip
through a real checkpoint save and load, different when one bit of any part differs."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from grpo_hpc.train.state import checkpoint, state_digest


def _model_and_opt(seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(4, 8)).square().mean().backward()
    opt.step()
    return model, opt


def test_a_state_and_its_round_trip_have_one_digest(tmp_path: Path) -> None:
    model, opt = _model_and_opt(0)
    data = {"step": 3, "sampler": {"epoch": 1, "pos": 17}}
    rng = checkpoint.rng_state()
    saved = state_digest.digest(model, opt, rng, data)
    torch.save({"m": model.state_dict(), "o": opt.state_dict()}, tmp_path / "ck.pt")

    torch.rand(5)  # the generators move on, as a run does after saving
    model2, opt2 = _model_and_opt(1)  # other weights and optimizer state
    assert (
        state_digest.digest(model2, opt2, checkpoint.rng_state(), data)["model"] != saved["model"]
    )
    loaded = torch.load(tmp_path / "ck.pt", weights_only=False)
    model2.load_state_dict(loaded["m"])
    opt2.load_state_dict(loaded["o"])
    checkpoint.set_rng_state(rng)
    resumed = state_digest.digest(model2, opt2, checkpoint.rng_state(), dict(data))
    assert state_digest.mismatches(saved, resumed) == []


def test_one_changed_bit_in_any_part_is_named(tmp_path: Path) -> None:
    model, opt = _model_and_opt(0)
    rng, data = checkpoint.rng_state(), {"step": 3, "sampler": {"pos": 17}}
    before = state_digest.digest(model, opt, rng, data)
    with torch.no_grad():
        w = model[0].weight.view(-1)
        w[0] = torch.nextafter(w[0], torch.tensor(1.0))  # one ulp
    p0 = next(iter(opt.state))
    opt.state[p0]["exp_avg"].view(-1)[0] += 1e-3
    after = state_digest.digest(model, opt, rng, {"step": 3, "sampler": {"pos": 18}})
    assert state_digest.mismatches(before, after) == ["data", "model", "optim"]


def test_compare_folder_pairs_each_resume_with_its_save(tmp_path: Path) -> None:
    same = {"model": "a", "optim": "b", "rng": "c", "data": "d"}
    a, b = "resume-20261126-101500-ab12cd34", "resume-20261126-102000-ef56ab78"
    for name, parts in [
        ("save-step4-rank0", same), (f"{a}-step4-rank0", same),
        ("save-step4-rank1", same), (f"{a}-step4-rank1", {**same, "rng": "x"}),
        (f"{b}-step6-rank0", same),  # its save was pruned or never written
    ]:  # fmt: skip
        state_digest.write(tmp_path, name, parts)
    n, bad = state_digest.compare_folder(tmp_path)
    assert n == 3
    assert bad == [
        "resume-20261126-101500-ab12cd34-step4-rank1.json: rng",
        "resume-20261126-102000-ef56ab78-step6-rank0.json: no save digest",
    ]
    assert json.loads((tmp_path / "save-step4-rank0.json").read_text()) == same
