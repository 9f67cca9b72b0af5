"""The long-tail benchmark on a CPU: the engine-side correction that imposes lengths, on
its own tensors, and one real run of the tiny published shape with LoRA (what the
``lora8b`` stage runs) through the runner, synchronous and asynchronous, whose recorded
completion lengths are the drawn ones (row by row in the records, step by step in the
trainer's metrics and samples)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from bench.speed import length_dist as ld
from bench.speed.imposed_lengths import ImposingEngine

from ..slowdown import guard

REPO = Path(__file__).resolve().parents[2]
EOS, PAD, FILLER = 2, 0, 7


def _workspace(
    tokens: list[int],
    done: list[bool],
    rows_of: list[int],
    width: int = 6,
    room: list[int] | None = None,
):  # noqa: ANN202
    rows = len(tokens)
    return SimpleNamespace(
        tokens=torch.tensor(tokens),
        out=torch.full((rows, width), PAD),
        done=torch.tensor(done),
        rows_of=torch.tensor(rows_of),
        room=torch.tensor(room if room is not None else [width] * rows),
    )


def _engine(targets: list[int]) -> SimpleNamespace:
    return SimpleNamespace(target_bufs={8: torch.tensor(targets)}, eos=EOS, filler=FILLER)


def test_the_correction_forces_eos_at_the_target_and_nothing_earlier() -> None:
    # Column 2 was just chosen (a row of 3 tokens would end here). Root rows' targets:
    targets = [3, 5, 3, 9, 9, 9, 9, 9]
    # workspace compacted: its rows hold root rows 0, 1, 2, 3 (rows_of)
    ws = _workspace(
        tokens=[11, EOS, 12, PAD], done=[False, False, False, True], rows_of=[0, 1, 2, 3]
    )
    before = ws.done.clone()
    ImposingEngine._impose(_engine(targets), ws, torch.tensor([2]), before, 8)  # type: ignore[arg-type]
    # row 0: target 3 -> EOS; row 1: chose EOS before its target 5 -> filler, running;
    # row 2: target 3 -> EOS; row 3: already done, untouched
    assert ws.tokens.tolist() == [EOS, FILLER, EOS, PAD]
    assert ws.out[:, 2].tolist() == [EOS, FILLER, EOS, PAD]
    assert ws.done.tolist() == [True, False, True, True]
    # the same rows compacted into other slots read their own root row's target
    ws = _workspace(tokens=[11, 12], done=[False, False], rows_of=[3, 2])
    ImposingEngine._impose(_engine(targets), ws, torch.tensor([2]), ws.done.clone(), 8)  # type: ignore[arg-type]
    assert ws.tokens.tolist() == [11, EOS] and ws.done.tolist() == [False, True]


def test_the_correction_keeps_a_row_at_its_room_done_without_eos() -> None:
    """A continued row's room (the cap less its answer so far): at the room's last column
    it ends with no EOS (its target lies past the cap), and an EOS the sampler chose there
    is still replaced (the row ends, at the cap, as one drawn past it does)."""
    targets = [9, 9, 9, 9, 9, 9, 9, 9]
    ws = _workspace(tokens=[11, EOS, 12], done=[False] * 3, rows_of=[0, 1, 2], room=[3, 3, 6])
    ImposingEngine._impose(_engine(targets), ws, torch.tensor([2]), ws.done.clone(), 8)  # type: ignore[arg-type]
    assert ws.tokens.tolist() == [11, FILLER, 12]
    assert ws.done.tolist() == [True, True, False]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    from grpo_hpc.train.setup.models import LlamaShape, load_model_and_tokenizer, save_random_llama

    out = tmp_path_factory.mktemp("tiny") / "m"
    save_random_llama(out, LlamaShape(64, 2, 4, 2, 128), seed=1)
    model, tok = load_model_and_tokenizer(out, "sdpa", torch.device("cpu"))
    return model.eval(), tok


def test_a_partial_rows_target_follows_it_across_rounds(tiny: tuple, tmp_path: Path) -> None:
    """Two rounds of ``generate_rows`` as the partial pool calls them: round 1 draws each
    fresh row's target and is stopped at a host check; round 2 continues the rows still
    running (``answered``: their tokens so far), each of which then ends at its round-1
    target in total length (EOS there), or at the cap without EOS when drawn past it."""
    model, tok = tiny
    cap, every, g = 32, 8, 6

    class Engine(ImposingEngine):
        targets = [3, 12, 20, 29, 32, 33]  # 33: past the cap of 32 (runs to it, no EOS)
        seed, record = 11, tmp_path

    engine = Engine(model, tok, cap, 1.0, 1.0, 60, check_every=every, row_bucket=4)
    prompts = [tok(p, add_special_tokens=False).input_ids for p in ("1+1=", "22*3=")]
    one = engine.generate_rows(prompts, [g, g], stop_when=lambda ended, t: t >= every)
    first = [json.loads(x) for x in (tmp_path / "generations-rank0.jsonl").open()][-1]
    targets = first["drawn"]
    assert first["answered"] == [0] * 2 * g and first["sources"] == ["drawn"] * 2 * g
    assert targets == ld.draw(Engine.targets, 2 * g, 11, first["call"])
    assert one.completion_mask.shape[1] == every
    lengths = one.completion_mask.sum(1).tolist()
    assert lengths == [min(t, every) for t in targets]
    assert one.finished.tolist() == [t <= every for t in targets]
    running = [r for r, t in enumerate(targets) if t > every]
    assert len(running) >= 4 and any(targets[r] > cap for r in running), "degenerate draw"
    p = one.prompt_len
    cont = [prompts[r // g] + one.input_ids[r, p : p + every].tolist() for r in running]
    two = engine.generate_rows(cont, [1] * len(running), answered=[every] * len(running))
    second = [json.loads(x) for x in (tmp_path / "generations-rank0.jsonl").open()][-1]
    assert second["sources"] == ["carried"] * len(running)
    assert second["answered"] == [every] * len(running)
    assert second["drawn"] == [targets[r] for r in running]
    for row, r in enumerate(running):
        total = every + int(two.completion_mask[row].sum())
        assert total == min(targets[r], cap), (r, targets[r], total)
        assert bool(two.finished[row]) == (targets[r] <= cap)
    from bench.speed.longtail_analysis import partial_mismatches

    assert partial_mismatches(first) == [] and partial_mismatches(second) == []
    assert engine.carried == {}  # every carried target was taken
    # the same rows continued by a process that did not keep their targets: reported lost
    second["sources"][0] = "lost"
    assert partial_mismatches(second) != []


@pytest.mark.slow
def test_a_tiny_run_of_the_lora_stage_path_honours_every_imposed_length(tmp_path: Path) -> None:
    """What the `lora8b` stage runs, at the tiny published shape: weights built at load
    (``random:bench/shapes/...``), LoRA, synchronous and asynchronous; both finish and
    honour every drawn length, row by row in the records and step by step in the trainer's
    metrics and samples. (One run for what were two tests with the same setup, the other
    the recorded SmolLM2 distribution scaled to 64 tokens: that file's loading and scaling
    are tests/bench/test_longtail.py's; the distribution here has the edge cases.)"""
    # lengths 1 (forced at the first token), 2, 5, 17 (past one host check), 31, the cap
    # (EOS as the last token), and a row that hit the recorded cap (runs to 32, no EOS)
    dist = ld.LengthDist([1, 2, 5, 17, 31, 32, 32], 32, [False] * 6 + [True], {"test": "x"})
    ld.save(dist, tmp_path / "dist.json")
    out = tmp_path / "out"
    cmd = [
        sys.executable, "-m", "bench.speed.longtail", "--out", str(out), "--",
        "--model-dir", "random:bench/shapes/tiny", "--precision", "fp32", "--max-new", "32",
        "--prompts", "2", "--G", "4", "--steps", "3", "--seed", "5",
        "--length-dist", str(tmp_path / "dist.json"),
        "--override", "training.log_samples=8", "--override", "model.lora_rank=16",
    ]  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=guard(300))
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((out / "longtail.json").read_text())
    assert result["lengths"] == f"lengths imposed from {tmp_path / 'dist.json'}"
    targets = ld.scaled(dist, 32)
    drawn_by_run = []
    for k in (0, 1):
        calls = [json.loads(x) for x in (out / f"k{k}/generations/generations-rank0.jsonl").open()]
        calls = [c for c in calls if not c["greedy"]]
        assert [c["call"] for c in calls] == [0, 1, 2]
        for c in calls:  # the seeded draw, and every row's length is it
            assert c["drawn"] == ld.draw(targets, 8, seed=5, call=c["call"])
            assert c["lengths"] == [min(d, 32) for d in c["drawn"]]
            assert c["finished"] == [d <= 32 for d in c["drawn"]]
        drawn_by_run.append([c["drawn"] for c in calls])
        steps = [json.loads(x) for x in (out / f"k{k}/metrics.jsonl").open()]
        steps = [s for s in steps if "loss" in s]
        for s, c in zip(steps, calls, strict=True):  # the trainer's own count agrees
            assert s["gen_len/mean"] == pytest.approx(sum(c["lengths"]) / 8)
        samples = [json.loads(x) for x in (out / f"k{k}/samples.jsonl").open()]
        assert len(samples) == 6  # the first completion of each of 2 groups, 3 steps
        for smp in samples:  # as the trainer saw it: group i's first row is row 4 i
            c, mine = calls[smp["step"] - 1], [x for x in samples if x["step"] == smp["step"]]
            assert smp["tokens"] == min(c["drawn"][4 * mine.index(smp)], 32)
        run = result["runs"][k]
        assert run["lengths_mismatched"] == [] and run["tokens_per_gpu_s"] > 0
    assert drawn_by_run[0] == drawn_by_run[1]  # both runs met the same tail, step for step
    assert result["runs"][1]["wait_rollouts_s"] is not None
    assert [r["lengths_mismatched"] for r in result["runs"]] == [[], []]
    assert [r["steps"] for r in result["runs"]] == [3, 3]
    for k in (0, 1):
        config = (out / f"k{k}/config.yaml").read_text()
        assert "lora_rank: 16" in config and f"max_staleness: {k}" in config


@pytest.mark.slow
def test_a_partial_run_honours_every_imposed_length_across_rounds(tmp_path: Path) -> None:
    """The long-tail runner with a partial-rollout variant (``rollout.partial_pool=2``)
    alone (``--staleness`` with no value; the synchronous run's path is the test above's):
    each round's rows end at their drawn targets in total
    answer length (or the cap), the rows a round stopped are continued in later rounds
    with their targets carried (never drawn again), the trainer logs continued rows, and
    the analysis finds every length honoured. Mostly short rows with a tail past the host
    checks (16, 32, 48 of the cap of 64), so that rounds stop with rows still running."""
    lengths = [2, 4, 6, 8, 10, 12, 14, 15, 16, 30, 45, 64, 64]
    dist = ld.LengthDist(lengths, 64, [False] * 12 + [True], {"test": "x"})
    ld.save(dist, tmp_path / "dist.json")
    out = tmp_path / "out"
    cmd = [
        sys.executable, "-m", "bench.speed.longtail", "--out", str(out), "--staleness",
        "--variant", "partial=algo.max_staleness=2 rollout.partial_pool=2", "--",
        "--model-dir", "random:bench/shapes/tiny", "--precision", "fp32", "--max-new", "64",
        "--prompts", "2", "--G", "4", "--steps", "4", "--seed", "5",
        "--length-dist", str(tmp_path / "dist.json"),
    ]  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=guard(300))
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((out / "longtail.json").read_text())
    [run] = result["runs"]
    assert run["lengths_mismatched"] == [] and run["steps"] == 4 and run["tokens_per_gpu_s"] > 0
    calls = [json.loads(x) for x in (out / "partial/generations/generations-rank0.jsonl").open()]
    calls = [c for c in calls if not c["greedy"]]
    assert [c["call"] for c in calls] == list(range(len(calls)))
    cut: list[tuple[int, int]] = []  # (answer so far, target) of rows stopped by a round
    continued = 0
    for c in calls:
        cols = ("drawn", "answered", "lengths", "finished", "sources")
        for target, a, n, fin, source in zip(*(c[k] for k in cols), strict=True):
            if a:  # continued: the target its first round drew, carried to this round
                assert source == "carried" and (a, target) in cut
                cut.remove((a, target))
                continued += 1
            else:
                assert source == "drawn"
            total = a + n
            if fin:  # EOS at the target
                assert total == target <= 64
            elif total == 64:  # ran to the cap: drawn past it
                assert target > 64
            else:  # stopped by the round below its target: continued later
                assert total < min(target, 64)
                cut.append((total, target))
    assert continued >= 3, "few rows continued: the test proved little"
    steps = [json.loads(x) for x in (out / "partial/metrics.jsonl").open()]
    steps = [s for s in steps if "loss" in s]
    assert sum(s["partial/continued_rows"] for s in steps) >= 3
    assert "partial_pool: 2" in (out / "partial/config.yaml").read_text()


@pytest.mark.slow
def test_a_split_run_alone_counts_both_gpus_and_honours_its_lengths(
    tmp_path: Path,
) -> None:
    """The next multi-GPU call's split run on two CPU processes, alone (``--staleness``
    with no value; its synchronous yardstick, two DDP ranks of grpo_step, is the ladder's
    path, tests/e2e/test_ladder_cpu.py): the split placement with partial rollouts (a
    trainer and a generator process). The split run is counted over both processes (its
    metrics' ``world_size`` is the trainers', ``generators`` the rest), its generator's
    rounds honour every imposed length across rounds (the trainer generates nothing and is
    not held to it), and its longest-row wait is read from the generator's records."""
    lengths = [2, 4, 6, 8, 10, 12, 14, 15, 16, 30, 45, 64, 64]
    dist = ld.LengthDist(lengths, 64, [False] * 12 + [True], {"test": "x"})
    ld.save(dist, tmp_path / "dist.json")
    out = tmp_path / "out"
    split = "split=algo.max_staleness=2 rollout.partial_pool=2 rollout.placement=split"
    cmd = [
        sys.executable, "-m", "bench.speed.longtail", "--out", str(out), "--staleness",
        "--variant", split, "--",
        "--model-dir", "random:bench/shapes/tiny", "--precision", "fp32", "--max-new", "64",
        "--prompts", "2", "--G", "4", "--steps", "4", "--seed", "5", "--nproc", "2",
        "--length-dist", str(tmp_path / "dist.json"),
    ]  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=guard(300))
    assert proc.returncode == 0, proc.stderr[-3000:]
    [run] = json.loads((out / "longtail.json").read_text())["runs"]
    assert run["gpus"] == 2
    assert run["lengths_mismatched"] == [] and run["steps"] == 4
    assert run["tokens_per_gpu_s"] > 0 and run["longest_row_wait_s"] is not None
    records = out / "split/generations"
    assert [f.name for f in records.iterdir()] == ["generations-rank1.jsonl"]  # the generator
    steps = [json.loads(x) for x in (out / "split/metrics.jsonl").open()]
    steps = [s for s in steps if "loss" in s]
    assert all(s["world_size"] == 1 and s["generators"] == 1 for s in steps)
    assert sum(s["partial/continued_rows"] for s in steps) > 0


@pytest.mark.slow
def test_a_failed_run_is_kept_and_the_next_still_runs(tmp_path: Path) -> None:
    """A run that fails (here: a shape that does not exist, refused by grpo_step before
    torchrun starts, in grpo-submit's words) leaves its folder, its stderr and a FAILED mark;
    the other staleness still runs; the table says so; the exit is not 0."""
    out = tmp_path / "out"
    cmd = [
        sys.executable, "-m", "bench.speed.longtail", "--out", str(out), "--",
        "--model-dir", "random:bench/shapes/nosuch", "--precision", "fp32", "--max-new", "8",
        "--prompts", "2", "--G", "4", "--steps", "2",
    ]  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=guard(300))
    assert proc.returncode not in (0, None)
    for k in (0, 1):
        assert (out / f"k{k}/FAILED").read_text().startswith("exit ")
        log = (out / f"k{k}/grpo_step.log").read_text()
        assert "grpo_step: error: model.name_or_path 'bench/shapes/nosuch': no such" in log
    table = (out / "longtail.md").read_text()
    assert "max_staleness=0 (failed: exit" in table and "max_staleness=1 (failed: exit" in table
