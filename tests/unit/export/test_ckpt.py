"""grpo-ckpt: manifests, verification and listing on synthetic checkpoint directories."""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import warnings
from pathlib import Path

import pytest
from rich.console import Console

from grpo_hpc.cli.ckpt import main
from grpo_hpc.core.manifest import CheckpointIncompleteError, verify_checkpoint, write_manifest
from grpo_hpc.core.paths import RunPaths
from grpo_hpc.export.checkpoints import build_list_table, fmt_bytes, list_checkpoints


def make_ckpt(paths: RunPaths, step: int, complete: bool = True, manifest: bool = True) -> Path:
    d = paths.checkpoint(step)
    (d / "optim").mkdir(parents=True)
    (d / "model.safetensors").write_bytes(b"weights" * 100)
    (d / "optim" / "rank0.pt").write_bytes(b"adam" * 50)
    (d / "trainer_state.json").write_text(json.dumps({"step": step}))
    if manifest:
        write_manifest(d)
    if complete:
        (d / "COMPLETE").touch()
    return d


@pytest.fixture
def run(tmp_path: Path) -> RunPaths:
    paths = RunPaths(tmp_path / "r")
    paths.root.mkdir()
    return paths


def test_write_manifest_records_sizes_and_hashes(run: RunPaths) -> None:
    d = make_ckpt(run, 10, complete=False, manifest=False)
    (d / "COMPLETE").touch()  # the marker and the manifest itself are never listed
    m = write_manifest(d)
    assert m["step"] == 10 and sorted(m["files"]) == [
        "model.safetensors",
        "optim/rank0.pt",
        "trainer_state.json",
    ]
    entry = m["files"]["model.safetensors"]
    assert entry == {"size": 700, "sha256": hashlib.sha256(b"weights" * 100).hexdigest()}
    assert json.loads((d / "manifest.json").read_text()) == m
    tmp = run.checkpoint_tmp(20)
    tmp.mkdir(parents=True)
    (tmp / "a.bin").write_bytes(b"x")
    assert write_manifest(tmp)["step"] == 20  # the trainer writes it before the rename
    assert verify_checkpoint(d) == []


def test_verify_reports_each_kind_of_damage(run: RunPaths) -> None:
    assert verify_checkpoint(make_ckpt(run, 1, manifest=False)) == ["no manifest.json"]
    d = make_ckpt(run, 2)
    (d / "optim" / "rank0.pt").unlink()
    assert verify_checkpoint(d) == ["optim/rank0.pt: missing"]
    d = make_ckpt(run, 3)
    (d / "model.safetensors").write_bytes(b"short")
    assert verify_checkpoint(d) == ["model.safetensors: size 5 != 700 in the manifest"]
    d = make_ckpt(run, 4)
    (d / "model.safetensors").write_bytes(b"WEIGHTS" * 100)  # same size, other bytes
    assert verify_checkpoint(d) == ["model.safetensors: sha256 differs from the manifest"]
    d = make_ckpt(run, 5)
    (d / "manifest.json").write_text("{not json")
    assert verify_checkpoint(d)[0].startswith("unreadable manifest.json")
    d = make_ckpt(run, 6)
    m = json.loads((d / "manifest.json").read_text())
    m["step"] = 7
    m["files"]["../escape"] = {"size": 1, "sha256": "x"}
    m["files"]["odd"] = {"size": 1}
    (d / "manifest.json").write_text(json.dumps(m))
    assert verify_checkpoint(d) == [
        "manifest.json says step 7, directory is step 6",
        "../escape: path escapes the checkpoint directory",
        "odd: manifest entry lacks size/sha256",
    ]
    (d / "manifest.json").write_text(json.dumps({"step": 6, "files": {}}))
    assert verify_checkpoint(d) == ["manifest.json lists no files"]
    (d / "manifest.json").write_text("[]")
    assert verify_checkpoint(d) == ["manifest.json has no 'files' mapping"]


def test_list_checkpoints_and_table(run: RunPaths) -> None:
    make_ckpt(run, 10)
    make_ckpt(run, 20, complete=False)
    make_ckpt(run, 5, manifest=False)
    infos = list_checkpoints(run)
    assert [(c.step, c.complete, c.manifest) for c in infos] == [
        (5, True, False),
        (10, True, True),
        (20, False, True),
    ]
    assert infos[0].size_bytes == 700 + 200 + len(json.dumps({"step": 5}))
    console = Console(file=io.StringIO(), width=120, color_system=None)
    console.print(build_list_table("r", infos))
    text = console.file.getvalue()
    assert "checkpoints of r: 3" in text and "STEP" in text and "COMPLETE" in text
    row20 = next(line for line in text.splitlines() if line.strip().startswith("20"))
    assert "NO" in row20 and " - " in row20  # no format in a manifest not written by the trainer
    assert (fmt_bytes(5), fmt_bytes(2048), fmt_bytes(3 * 1024**3)) == ("5 B", "2.0 KiB", "3.0 GiB")


def test_a_checkpoint_pruned_while_listed_is_left_out(
    run: RunPaths, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``grpo-ckpt list`` on a live run: a checkpoint the trainer prunes after the listing
    of the directory is left out, not a FileNotFoundError; one file of another pruned under
    ``verify`` is missing."""
    make_ckpt(run, 10)
    make_ckpt(run, 20)
    listed = run.checkpoint_steps(complete_only=False)
    monkeypatch.setattr(RunPaths, "checkpoint_steps", lambda self, complete_only=True: listed)
    shutil.rmtree(run.checkpoint(10))  # pruned after the listing
    assert [c.step for c in list_checkpoints(run)] == [20]
    real = Path.is_file
    gone = run.checkpoint(20) / "model.safetensors"
    gone.unlink()  # seen by a look, gone at the size check
    monkeypatch.setattr(Path, "is_file", lambda p: p == gone or real(p))
    assert "model.safetensors: missing" in verify_checkpoint(run.checkpoint(20))


def test_cli_list_and_verify(run: RunPaths, capsys: pytest.CaptureFixture) -> None:
    logs = ["--logs", str(run.root.parent)]
    make_ckpt(run, 10)
    make_ckpt(run, 20, complete=False)
    assert main(["verify", "r", *logs]) == 0
    out = capsys.readouterr().out
    assert "step-10: ok" in out and "step-20: incomplete" in out
    assert main(["list", "r", "--json", *logs]) == 0
    assert [c["step"] for c in json.loads(capsys.readouterr().out)] == [10, 20]
    assert main(["list", str(run.root)]) == 0  # a path instead of a name
    assert "checkpoints of r: 2" in capsys.readouterr().out
    bad = make_ckpt(run, 30)
    (bad / "model.safetensors").write_bytes(b"")
    assert main(["verify", "r", *logs]) == 1
    assert "step-30: BAD: model.safetensors: size 0 != 700" in capsys.readouterr().out
    assert main(["verify", "r", "--step", "10", *logs]) == 0
    assert main(["verify", "r", "--step", "99", *logs]) == 2
    assert main(["verify", "nope", *logs]) == 2
    with pytest.raises(SystemExit) as exc:  # argparse usage errors exit 2 directly
        main([])
    assert exc.value.code == 2


def test_run_without_checkpoints(run: RunPaths, capsys: pytest.CaptureFixture) -> None:
    assert main(["verify", "r", "--logs", str(run.root.parent)]) == 0
    assert "no complete checkpoints" in capsys.readouterr().out
    assert list_checkpoints(run) == []


# ------------------------------------------------------------- trainer formats (real DCP)


def trainer_ckpt(run: RunPaths, fmt: str, world: int = 1) -> Path:
    """A checkpoint laid out as the trainer writes it: gathered (model.pt, optim.pt) or
    sharded (a real torch.distributed.checkpoint directory, saved in this one process)."""
    import torch
    import torch.distributed.checkpoint as dcp

    d = run.checkpoint(2)
    d.mkdir(parents=True)
    state = {"model": {"w": torch.arange(64.0)}, "optim": {"m": torch.ones(8)}}
    if fmt == "sharded":
        with warnings.catch_warnings():  # "no process group: saving in a single process"
            warnings.simplefilter("ignore", UserWarning)
            dcp.save(state, storage_writer=dcp.FileSystemWriter(d / "dcp"))
    else:
        torch.save(state["model"], d / "model.pt")
        torch.save(state["optim"], d / "optim.pt")
    torch.save({"step": 2, "world_size": world}, d / "trainer.pt")
    for r in range(world):
        torch.save({"torch": torch.get_rng_state()}, d / f"rng-rank{r}.pt")
    write_manifest(d, extra={"format": fmt, "world_size": world})
    (d / "COMPLETE").touch()
    return d


@pytest.mark.parametrize("fmt", ["gathered", "sharded"])
def test_both_trainer_formats_verify(run: RunPaths, fmt: str) -> None:
    d = trainer_ckpt(run, fmt, world=2)
    assert json.loads((d / "manifest.json").read_text())["format"] == fmt
    assert verify_checkpoint(d) == []
    assert main(["verify", str(run.root)]) == 0
    (info,) = list_checkpoints(run)
    assert info.format == {"gathered": "gathered", "sharded": "sharded x2"}[fmt]
    console = Console(file=io.StringIO(), width=120, color_system=None)
    console.print(build_list_table("r", [info]))
    assert info.format in console.file.getvalue() and "FORMAT" in console.file.getvalue()


def _short_manifest(d: Path, **extra: object) -> None:
    """A manifest consistent with the files, yet short of what its format needs (the
    trainer's write_manifest refuses to write one: tests/unit/core/test_ckpt_complete.py)."""
    m = write_manifest(d)
    (d / "manifest.json").write_text(json.dumps({**m, **extra}))


def test_gathered_without_optimizer_state_is_bad(run: RunPaths) -> None:
    d = trainer_ckpt(run, "gathered")
    (d / "optim.pt").unlink()
    _short_manifest(d, format="gathered", world_size=1)
    assert verify_checkpoint(d) == ["optim.pt: missing (gathered checkpoint of 1 ranks)"]
    with pytest.raises(CheckpointIncompleteError, match="optim.pt: not in manifest.json"):
        write_manifest(d, extra={"format": "gathered", "world_size": 1})


def test_rng_state_of_every_rank_is_required(run: RunPaths) -> None:
    d = trainer_ckpt(run, "sharded", world=1)
    _short_manifest(d, format="sharded", world_size=2)
    assert verify_checkpoint(d) == ["rng-rank1.pt: missing (sharded checkpoint of 2 ranks)"]


def test_truncated_shard_is_caught_through_dcp_metadata(run: RunPaths) -> None:
    d = trainer_ckpt(run, "sharded")
    (shard,) = (d / "dcp").glob("*.distcp")
    shard.write_bytes(shard.read_bytes()[:10])
    write_manifest(d, extra={"format": "sharded", "world_size": 1})  # manifest agrees...
    rel = f"dcp/{shard.name}"
    assert verify_checkpoint(d) == [f"{rel}: shorter than dcp/.metadata says"]  # ...DCP not
    shard.unlink()
    write_manifest(d, extra={"format": "sharded", "world_size": 1})
    assert verify_checkpoint(d) == [f"{rel}: named by dcp/.metadata but not in the manifest"]


def test_unknown_format_is_reported(run: RunPaths) -> None:
    d = trainer_ckpt(run, "gathered")
    write_manifest(d, extra={"format": "zipped", "world_size": 1})
    assert verify_checkpoint(d) == ["manifest.json: unknown format 'zipped' (gathered or sharded)"]


def test_digests_of_many_files_at_once_match_one_by_one(tmp_path: Path) -> None:
    """file_digests hashes files on threads side by side: the same (size, sha256) per file
    as hashing each alone, and a damaged file among several intact ones is still named."""
    from grpo_hpc.core.manifest import file_digest, file_digests

    paths = []
    for k in range(6):
        p = tmp_path / f"f{k}.bin"
        p.write_bytes(bytes([k]) * (3 * (1 << 20) + k))  # over the 1 MiB read chunk
        paths.append(p)
    assert file_digests(paths) == {p: file_digest(p) for p in paths}
    assert file_digests([]) == {}
    assert file_digests(paths[:1]) == {paths[0]: file_digest(paths[0])}
    d = tmp_path / "step-9"
    d.mkdir()
    for k in range(5):
        (d / f"shard{k}.bin").write_bytes(bytes([k]) * 4096)
    write_manifest(d)
    (d / "shard3.bin").write_bytes(bytes([7]) * 4096)  # same size, other bytes
    assert verify_checkpoint(d) == ["shard3.bin: sha256 differs from the manifest"]
