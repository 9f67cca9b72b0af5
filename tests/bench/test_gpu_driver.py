"""bench/gpu.sh, the one driver of the GPU benchmarks: every subject it accepts has its stage
file under bench/gpu/, every stage file is valid bash, an unknown subject or stage is refused
by name, and every `bench/gpu.sh SUBJECT OUT STAGE` call the docs write names a stage that
exists (the stages run only on a lent GPU machine, so a renamed one would fail there first)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DRIVER = REPO / "bench/gpu.sh"
STAGE_DIR = REPO / "bench/gpu"
DOCS = [
    REPO / "README.md",
    REPO / "bench/README.md",
    REPO / "bench/GPU_REAL.md",
    *sorted(REPO.glob("bench/[a-z]*/README.md")),  # each subject's, probes/, results/
    *sorted((REPO / "docs").glob("*.md")),
]


def _subjects() -> list[str]:
    """The subjects of the driver's case statement."""
    m = re.search(r"^case \$subject in\n(.+?)\) ;;", DRIVER.read_text(), re.M | re.S)
    assert m, "bench/gpu.sh lost its case over the subject"
    return [s.strip() for s in m.group(1).split("|")]


def _stages(subject: str) -> set[str]:
    """The stage names a subject's file accepts: its case branches (four-space indent) and,
    for slurm, its stage functions."""
    text = (STAGE_DIR / f"{subject}.sh").read_text()
    stages = set()
    for pattern in re.findall(r"^    ([a-z0-9_| ]+)\)", text, re.M):
        stages.update(p.strip() for p in pattern.split("|"))
    stages.update(re.findall(r"^([a-z]+)\(\) \{", text, re.M))
    return stages


def test_every_subject_has_its_stage_file_and_no_file_is_orphaned():
    subjects = _subjects()
    assert subjects == sorted(set(subjects), key=subjects.index)  # no repeats
    files = {p.stem for p in STAGE_DIR.glob("*.sh")} - {"env"}
    assert set(subjects) == files


@pytest.mark.parametrize("path", [DRIVER, *sorted(STAGE_DIR.glob("*.sh"))], ids=lambda p: p.name)
def test_every_stage_file_parses(path):
    subprocess.run(["bash", "-n", str(path)], check=True)


def test_an_unknown_subject_is_refused_by_name(tmp_path):
    r = subprocess.run(
        ["bash", str(DRIVER), "nosuch", str(tmp_path)], cwd=REPO, capture_output=True, text=True
    )
    assert r.returncode == 2
    assert "unknown subject nosuch" in r.stderr


def test_an_unknown_stage_is_said_so(tmp_path):
    # A checkout of its own (bench/ only): the driver installs the wheels a GPU call
    # carries from ./.whl, and a developer's .whl (built for the GPU machine's Python) must
    # not decide this test.
    (tmp_path / "repo").mkdir()
    (tmp_path / "repo/bench").symlink_to(REPO / "bench")
    r = subprocess.run(
        ["bash", str(DRIVER), "memory", str(tmp_path / "out"), "nosuch"],
        cwd=tmp_path / "repo",
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert "unknown stage nosuch" in r.stdout


CALL = re.compile(r"bench/gpu\.sh\s+([a-z_]+)\s+(\S+)((?:\s+[a-z0-9_]+)*)")


def _code(text: str) -> list[str]:
    """The code of a markdown text: its fenced blocks' lines and its inline spans (which may
    wrap over lines), each with its whitespace runs made one space."""
    fenced = re.findall(r"^```[a-z]*\n(.*?)^```", text, re.M | re.S)
    spans = re.findall(r"`([^`]+)`", re.sub(r"^```.*?^```", "", text, flags=re.M | re.S))
    return [" ".join(line.split()) for block in fenced for line in block.splitlines()] + [
        " ".join(span.split()) for span in spans
    ]


def test_every_documented_call_names_a_stage_that_exists():
    subjects = set(_subjects())
    stageless = {"faults", "code", "export", "prep"}  # OUT and arguments, no stages
    bad = []
    calls = [
        (doc.name, c) for doc in DOCS for code in _code(doc.read_text()) for c in CALL.findall(code)
    ]
    for name, (subject, _out, rest) in calls:
        if subject not in subjects:
            bad.append(f"{name}: subject {subject}")
            continue
        if subject in stageless:
            continue
        stages = _stages(subject)
        bad += [f"{name}: {subject} {w}" for w in rest.split() if w not in stages]
    assert not bad, bad
