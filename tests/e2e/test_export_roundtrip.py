"""grpo-export round trips on real tiny runs trained by the real trainer: from_pretrained of
the export gives the trainer's log-probs exactly (fp32); the trainer writes final/ itself;
a LoRA run's merged export equals its adapter applied by PEFT; bad input gets one line,
exit 2 and nothing written."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from grpo_hpc.cli import export
from grpo_hpc.core.paths import RunPaths
from grpo_hpc.export.plan import PROVENANCE
from tests.conftest import run_cli
from tests.e2e.export_helpers import batch, load_export, logprobs, trainer_model
from tests.e2e.helpers import make_run, train, training


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[RunPaths, RunPaths]:
    """The plain run and the LoRA run, trained side by side (one process each, two cores;
    they share nothing)."""
    plain = make_run(
        tmp_path_factory.mktemp("runs"), "plain", "training.max_steps=2", "training.eval_every=2",
        "data.num_val=0",  # the trainer evaluates the test problems that grpo-eval scores
    )  # fmt: skip
    lora = make_run(
        tmp_path_factory.mktemp("runs"), "lora", "training.max_steps=2", "model.lora_rank=4"
    )
    with training(lora) as lora_result:
        result = train(plain)
        assert result.returncode == 0, result.stderr[-3000:]
        result = lora_result()
        assert result.returncode == 0, result.stderr[-3000:]
    return plain, lora


@pytest.fixture(scope="module")
def run(runs: tuple[RunPaths, RunPaths]) -> RunPaths:
    return runs[0]


@pytest.fixture(scope="module")
def lora_run(runs: tuple[RunPaths, RunPaths]) -> RunPaths:
    return runs[1]


def _export(capsys: pytest.CaptureFixture, *args: str) -> tuple[int, str, str]:
    code = export.main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def test_export_gives_the_trainers_logprobs_exactly(
    run: RunPaths, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    out = tmp_path / "hf"
    code, stdout, err = _export(capsys, run.root, out)
    assert code == 0, err
    assert "exported plain step 2" in stdout
    names = {p.name for p in out.iterdir()}
    assert {"model.safetensors", "config.json", "generation_config.json"} <= names
    assert {"tokenizer.json", "chat_template.jinja", PROVENANCE} <= names
    enc = batch(out)
    exported = logprobs(load_export(out), enc)
    assert torch.equal(exported, logprobs(trainer_model(run, 2), enc))
    # The chat template travels with the tokenizer.
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(out)
    msgs = [{"role": "user", "content": "hi"}]
    assert tok.apply_chat_template(msgs, tokenize=False) == "<|user|>hi\n"


def test_the_trainer_wrote_final_and_status_shows_it(run: RunPaths, tmp_path: Path) -> None:
    assert json.loads((run.final / PROVENANCE).read_text())["step"] == 2
    enc = batch(run.final)
    assert torch.equal(logprobs(load_export(run.final), enc), logprobs(trainer_model(run, 2), enc))
    status = run_cli(
        "grpo_hpc.cli.status:main", str(run.root), env={"GRPO_HPC_LOGS": str(tmp_path)}
    )
    assert status.returncode == 0, status.stderr
    assert f"final model: {run.final} (step 2" in status.stdout.replace("\n", "")
    # grpo-export RUN (no OUT) says where it is.
    again = run_cli("grpo_hpc.cli.export:main", str(run.root))
    assert again.returncode == 0 and str(run.final) in again.stdout


def test_bf16_sharded_export(run: RunPaths, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "bf16"
    code, _, err = _export(capsys, run.root, out, "--dtype", "bf16", "--max-shard-size", "60kB")
    assert code == 0, err
    index = json.loads((out / "model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    assert len(files) > 1 and all((out / f).is_file() for f in files)
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    full = load_file(run.final / "model.safetensors")
    for f in files:
        for name, t in load_file(out / f).items():
            assert t.dtype == torch.bfloat16 and torch.equal(t, full[name].to(torch.bfloat16))
    model = load_export(out)
    assert next(model.parameters()).dtype == torch.bfloat16


def test_dry_run_writes_nothing(
    run: RunPaths, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    code, stdout, err = _export(capsys, run.root, tmp_path / "x", "--dry-run")
    assert code == 0, err
    assert "would export plain step 2" in stdout and "model.safetensors" in stdout
    assert not any(tmp_path.iterdir())


def test_lora_merged_equals_the_adapter_applied(
    lora_run: RunPaths, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    merged, adapter = tmp_path / "merged", tmp_path / "adapter"
    assert _export(capsys, lora_run.root, merged)[0] == 0
    code, _, err = _export(capsys, lora_run.root, adapter, "--adapter")
    assert code == 0, err
    assert {"adapter_config.json", "adapter_model.safetensors"} <= {
        p.name for p in adapter.iterdir()
    }
    base = AutoModelForCausalLM.from_pretrained(lora_run.tiny_model, attn_implementation="sdpa")
    applied = PeftModel.from_pretrained(base, adapter).eval()
    enc = batch(merged)
    want = logprobs(applied, enc)
    got = logprobs(load_export(merged), enc)
    assert torch.allclose(got, want, atol=1e-5, rtol=0), (got - want).abs().max()
    # The adapter is the trained one: not a zero update of the base.
    plain = logprobs(
        AutoModelForCausalLM.from_pretrained(lora_run.tiny_model, attn_implementation="sdpa"), enc
    )
    assert not torch.allclose(got, plain, atol=1e-6)


# ---------------------------------------------------------------------------- bad input


def _refused(capsys: pytest.CaptureFixture, out: Path, *args: str) -> str:
    parent_before = sorted(p.name for p in out.parent.iterdir()) if out.parent.exists() else []
    code, stdout, err = _export(capsys, *args)
    assert code == 2, (stdout, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("grpo-export: error: "), err
    after = sorted(p.name for p in out.parent.iterdir()) if out.parent.exists() else []
    assert after == parent_before, "something was left behind"
    return lines[0]


def _copy(run: RunPaths, dst: Path) -> RunPaths:
    shutil.copytree(run.root, dst, symlinks=True)
    return RunPaths(dst)


def test_bad_input_one_line_exit_2_nothing_written(
    run: RunPaths, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    outs = tmp_path / "outs"
    outs.mkdir()
    out = outs / "hf"
    # A run that never trained: no checkpoint.
    fresh = make_run(tmp_path / "runs", "fresh")
    line = _refused(capsys, out, fresh.root, out)
    assert "no complete checkpoint" in line
    # An incomplete checkpoint asked for by step.
    broken = _copy(run, tmp_path / "runs" / "broken")
    (broken.checkpoint(2) / "COMPLETE").unlink()
    assert "incomplete" in _refused(capsys, out, broken.root, out, "--step", "2")
    # A checkpoint that fails verification (a flipped byte in model.pt).
    bad = _copy(run, tmp_path / "runs" / "bad")
    model_pt = bad.checkpoint(2) / "model.pt"
    data = bytearray(model_pt.read_bytes())
    data[-100] ^= 0xFF
    model_pt.write_bytes(bytes(data))
    assert "fails verification" in _refused(capsys, out, bad.root, out)
    # An existing OUT without --force: left as it was.
    out.mkdir()
    (out / "mine.txt").write_text("keep")
    assert "--force" in _refused(capsys, out, run.root, out)
    assert [p.name for p in out.iterdir()] == ["mine.txt"]
    out.joinpath("mine.txt").unlink()
    out.rmdir()
    # The run's model directory lost its tokenizer.
    notok = _copy(run, tmp_path / "runs" / "notok")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (notok.tiny_model / name).unlink()
    assert "tokenizer" in _refused(capsys, out, notok.root, out)
    # A bad shard size.
    assert "--max-shard-size" in _refused(capsys, out, run.root, out, "--max-shard-size", "lots")


def test_replace_with_force(run: RunPaths, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "hf"
    out.mkdir()
    (out / "old.txt").write_text("old")
    code, _, err = _export(capsys, run.root, out, "--force")
    assert code == 0, err
    assert not (out / "old.txt").exists() and (out / "model.safetensors").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]


# ---------------------------------------------------------------------------- grpo-eval


def test_grpo_eval_of_the_export_equals_the_trainers_last_eval(
    run: RunPaths, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    from grpo_hpc.cli import eval as evaluate
    from grpo_hpc.config.load import load_resolved
    from grpo_hpc.tasks import problems as data
    from grpo_hpc.train.evaluation import scoring
    from grpo_hpc.train.rollout import engines as rollout

    last = [
        m for m in map(json.loads, run.metrics.read_text().splitlines()) if "eval/accuracy" in m
    ]
    assert last and last[-1]["step"] == 2
    # The run (its final/), its final/ directory named, a copy without final/ (its
    # checkpoint is exported into a temporary directory and scored from there), a copy whose
    # final/ is a bf16 export (not the trainer's weights: the run is scored from its fp32
    # checkpoint instead), and an explicit fp32 export.
    bare = _copy(run, tmp_path / "bare")
    shutil.rmtree(bare.final)
    half = _copy(run, tmp_path / "half")
    assert export.main([str(half.root), str(half.final), "--dtype", "bf16", "--force"]) == 0
    assert json.loads((half.final / PROVENANCE).read_text())["world_size"] == 1
    fp32 = tmp_path / "fp32"
    assert export.main([str(run.root), str(fp32), "--dtype", "fp32"]) == 0
    capsys.readouterr()
    results = []
    named = (
        (run.root, "run.json"), (run.final, "final.json"), (bare.root, "bare.json"),
        (half.root, "half.json"), (fp32, "fp32.json"),
    )  # fmt: skip
    for model, name in named:
        code = evaluate.main([str(model), "--out", str(tmp_path / name)])
        stdout, err = capsys.readouterr()
        assert code == 0, err
        assert len(stdout.strip().splitlines()) == 1 and "accuracy" in stdout
        results.append(json.loads((tmp_path / name).read_text()))
    assert results[3]["model_dir"] != str(half.final.resolve())  # its fp32 checkpoint
    for r in results:
        assert r["accuracy"] == last[-1]["eval/accuracy"]
        assert r["accuracy_strict"] == last[-1]["eval/accuracy_strict"]
        assert r["problems"] == 8 and r["engine"] == "HFEngine" and r["step"] == 2
        assert r["weights_dtype"] == r["compute_dtype"] == "float32"
        assert r["batch"] == {"rows": 8, "ranks": 1}
    # Token for token what the trainer's evaluation generates with the trainer's model.
    cfg = load_resolved(run.config)
    evals = data.load_problems(cfg.data, cfg.training.seed)[1]
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(run.tiny_model, padding_side="left")
    opts = rollout.EngineOptions(cfg.rollout.max_new_tokens, 1.0, 1.0, 600.0)
    engine = rollout.build_engine(
        "hf", trainer_model(run, 2), tok, opts, tick=lambda: None, abort=lambda: False,
        autocast=__import__("contextlib").nullcontext,
    )  # fmt: skip
    prompts = [data.prompt_text(tok, p["question"], cfg.data.system_prompt) for p in evals]
    texts = scoring.generate_greedy(engine, prompts, 8)
    for r in results:
        assert [p["completions"][0] for p in r["per_problem"]] == texts
        assert [p["gold"] for p in r["per_problem"]] == [p["gold"] for p in evals]


def test_grpo_eval_pass_at_k_and_refusals(
    run: RunPaths, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    from grpo_hpc.cli import eval as evaluate

    out = tmp_path / "s.json"
    code = evaluate.main([str(run.final), "--data", "arithmetic", "--num", "3", "--samples", "4",
                          "--out", str(out)])  # fmt: skip
    assert code == 0, capsys.readouterr().err
    r = json.loads(out.read_text())
    assert r["samples"] == 4 and set(r["pass@k"]) == {"1", "2", "4"}
    assert all(len(p["completions"]) == 4 for p in r["per_problem"])
    for args, words in (
        (["--profile", "no-such-cluster"], "no-such-cluster"),
        (["--data", "nope"], "--data 'nope'"),
        (["--step", "2"], "--step is for a run"),
        (["--num", "0"], "--num must be at least 1"),
    ):
        code = evaluate.main([str(run.final), "--out", str(tmp_path / "x.json"), *args])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1 and words in err[0], err
        assert not (tmp_path / "x.json").exists()
