"""The README and docs/ tell the truth about the repository: the README's file tree names
exactly the packages that exist, every relative link and every quoted bench path in the
README, docs/ and the bench's own guides points at a file that exists, and the README stays
a user guide of at most 200 lines."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
BENCH_DOCS = [
    ROOT / "bench/README.md",
    *sorted(ROOT.glob("bench/[a-z]*/README.md")),  # each subject's, probes/, results/, shapes/
    ROOT / "bench/GPU_REAL.md",
    ROOT / "bench/results/LOG.md",
    *sorted((ROOT / "bench/results").glob("LOG-*.md")),  # the log's files, one per subject
]
CHECKED = [README, *DOCS, *BENCH_DOCS]
"""The files whose links and quoted bench paths must resolve: where a reader finds a figure."""
MAX_README_LINES = 200

LINK_RE = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")
FENCE_RE = re.compile(r"^(```|~~~)")
TREE_LINE_RE = re.compile(r"^( *)(\S+/)(?:\s|$)")


def readme_tree() -> list[str]:
    """The README's file tree: the fenced block under "## Repository layout", as paths
    (``grpo_hpc/train/algo``) built from each entry's indentation (two spaces a level)."""
    text = README.read_text(encoding="utf-8")
    section = text.split("\n## Repository layout\n", 1)
    assert len(section) == 2, "README.md has no '## Repository layout' section"
    block = re.search(r"^```[^\n]*\n(.*?)^```", section[1], re.S | re.M)
    assert block, "the '## Repository layout' section has no fenced file tree"
    stack: list[str] = []
    paths = []
    for line in block.group(1).splitlines():
        m = TREE_LINE_RE.match(line)
        if not m:
            continue
        indent, name = len(m.group(1)), m.group(2).rstrip("/")
        assert indent % 2 == 0, f"odd indentation in the README's tree: {line!r}"
        depth = indent // 2
        assert depth <= len(stack), f"the README's tree skips a level at {line!r}"
        stack[depth:] = [name]
        paths.append("/".join(stack))
    return paths


def packages_on_disk() -> set[str]:
    """Every package under grpo_hpc/ (a directory with an ``__init__.py``), nested ones too."""
    pkg = ROOT / "grpo_hpc"
    return {
        str(p.parent.relative_to(ROOT))
        for p in pkg.rglob("__init__.py")
        if p.parent != pkg and "__pycache__" not in p.parts
    }


def test_readme_tree_names_exactly_the_packages() -> None:
    tree = readme_tree()
    in_tree = {p for p in tree if p.startswith("grpo_hpc/")}
    assert in_tree == packages_on_disk()
    assert len(tree) == len(set(tree)), "an entry appears twice in the README's tree"


def test_readme_tree_top_folders_exist() -> None:
    tops = [p for p in readme_tree() if "/" not in p]
    assert "grpo_hpc" in tops
    missing = [t for t in tops if not (ROOT / t).is_dir()]
    assert missing == []
    for top in ("configs", "templates", "slurm", "bench", "tests", "docs", "scripts"):
        assert top in tops, f"the README's tree does not name {top}/"


def relative_links(md: Path) -> list[str]:
    """The targets of the markdown links and images of a file that point inside the
    repository (no scheme, not a bare #anchor), outside fenced code blocks."""
    targets, fenced = [], False
    for line in md.read_text(encoding="utf-8").splitlines():
        if FENCE_RE.match(line.strip()):
            fenced = not fenced
            continue
        if fenced:
            continue
        line = re.sub(r"`[^`]*`", "", line)  # inline code is not a link
        for m in LINK_RE.finditer(line):
            target = m.group(1) or m.group(2)
            if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I) or target.startswith("#"):
                continue
            targets.append(target)
    return targets


def test_every_relative_link_points_at_a_file() -> None:
    """The bench's guides (bench/README.md, results/README.md, LOG.md, ...) are checked too:
    the README and docs cite the measurements and the dated history there."""
    broken = []
    for md in CHECKED:
        for target in relative_links(md):
            path = target.split("#", 1)[0]
            if path and not (md.parent / path).resolve().exists():
                broken.append(f"{md.relative_to(ROOT)}: {target}")
    assert not broken, "links to missing files:\n" + "\n".join(broken)


def anchors(md: Path) -> set[str]:
    """The anchors GitHub gives a markdown file's headings (lowercase, punctuation dropped,
    spaces to hyphens)."""
    found, fenced = set(), False
    for line in md.read_text(encoding="utf-8").splitlines():
        if FENCE_RE.match(line.strip()):
            fenced = not fenced
        elif not fenced and (m := re.match(r"^#{1,6}\s+(.*?)\s*$", line)):
            found.add(re.sub(r"[^\w\- ]", "", m.group(1).lower()).replace(" ", "-"))
    return found


def test_every_anchor_into_the_docs_exists() -> None:
    """A link to a section of a checked file names a heading that is there."""
    broken = []
    for md in CHECKED:
        for target in relative_links(md):
            path, _, anchor = target.partition("#")
            dest = (md.parent / path).resolve() if path else md
            if anchor and dest in set(CHECKED) and anchor not in anchors(dest):
                broken.append(f"{md.relative_to(ROOT)}: {target}")
    assert not broken, "links to missing sections:\n" + "\n".join(broken)


def test_links_are_found() -> None:
    """The link finder sees the README's links (a finder that sees none passes anything)."""
    links = relative_links(README)
    assert "docs/configs.md" in links
    assert "bench/README.md" in links
    assert "bench/results/LOG.md" in links


def test_readme_is_a_short_user_guide() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= MAX_README_LINES, f"README.md has {len(lines)} lines"
    assert "bash scripts/test.sh" in README.read_text(encoding="utf-8")  # .ci/run calls it


QUOTED_RE = re.compile(r"`((?:\.\./)*(?:bench|results|archive)/[^`\s]*)`")
"""A backtick-quoted path into the bench: ``bench/...`` anywhere; ``results/...`` (from
bench/) and ``archive/...`` (from bench/results/) as the bench's own guides write them."""


def _expand_braces(path: str) -> list[str]:
    """``a_{x,y}.json`` -> ``a_x.json``, ``a_y.json`` (nested and repeated groups too)."""
    m = re.search(r"\{([^{}]*)\}", path)
    if not m:
        return [path]
    return [
        p
        for alt in m.group(1).split(",")
        for p in _expand_braces(path[: m.start()] + alt + path[m.end() :])
    ]


def _placeholder(path: str) -> bool:
    """A path written with a placeholder (``OUT``, ``S``, ``<name>``, ``$OUT``, ``...``)."""
    return (
        any(c in path for c in "<>$")
        or "..." in path
        or any(
            re.fullmatch(r"[A-Z][A-Z_0-9]*", part.split(".")[0]) and part not in KNOWN_CAPS
            for part in path.split("/")
        )
    )


KNOWN_CAPS = {"README.md", "LOG.md", "GPU_REAL.md", "ARCHITECTURE.md", "ALGORITHM.md"}


def quoted_bench_paths(md: Path) -> list[tuple[str, list[Path]]]:
    """Each quoted bench path of a file with the files it names: a ``bench/`` path from the
    repository root, ``results/`` from bench/, ``archive/`` from bench/results/, ``../`` from
    the file itself; braces expanded, globs matched."""
    found = []
    for quoted in QUOTED_RE.findall(md.read_text(encoding="utf-8")):
        path = quoted.rstrip(".,;:)")
        if _placeholder(path):
            continue
        if path.startswith("../"):
            base = md.parent
        else:
            base = {"bench": ROOT, "results": ROOT / "bench", "archive": ROOT / "bench/results"}[
                path.split("/", 1)[0]
            ]
        matches = []
        for p in _expand_braces(path):
            hits = sorted(base.glob(p)) if "*" in p else [base / p]
            matches.append(hits[0] if hits and hits[0].exists() else base / p)
        found.append((quoted, matches))
    return found


def test_every_quoted_bench_path_exists() -> None:
    """A figure cited as `bench/results/x.json` (or `results/x.json` in bench/README.md,
    `archive/x.json` in results/LOG.md) names a file there: braces name files that all
    exist, a glob matches at least one."""
    missing = [
        f"{md.relative_to(ROOT)}: `{quoted}` ({p.relative_to(ROOT)})"
        for md in CHECKED
        for quoted, paths in quoted_bench_paths(md)
        for p in paths
        if not p.exists()
    ]
    assert not missing, "quoted bench paths that name no file:\n" + "\n".join(missing)


def test_quoted_paths_are_found() -> None:
    """The finder sees quoted paths where the bench's guides have them."""
    quoted = {q for q, _ in quoted_bench_paths(ROOT / "bench/README.md")}
    assert any(q.startswith("results/") for q in quoted)
    assert _expand_braces("a_{x,y}_{1,2}.json") == [
        "a_x_1.json",
        "a_x_2.json",
        "a_y_1.json",
        "a_y_2.json",
    ]
    assert _placeholder("bench/results/OUT/x.json") and not _placeholder("bench/results/LOG.md")


def test_results_readme_lists_exactly_the_current_files() -> None:
    """bench/results/ holds the latest result of each maintained benchmark and nothing else
    at its top (superseded runs go to archive/): its README's "Current results" table names
    every file and folder there, and each name it gives exists."""
    results = ROOT / "bench/results"
    text = (results / "README.md").read_text(encoding="utf-8")
    table = text.split("## Current results", 1)[1].split("\n## ", 1)[0]
    listed = {
        p.rstrip("/")
        for row in table.splitlines()
        if row.startswith("| `")
        for quoted in re.findall(r"`([^`]+)`", row.split("|")[1])
        for p in _expand_braces(quoted)
    }
    logs = {p.name for p in results.glob("LOG*.md")}  # the dated history, not results
    on_disk = {p.name for p in results.iterdir()} - {"README.md", "archive"} - logs
    assert sorted(on_disk - listed) == [], "in bench/results/ but not in its README"
    assert sorted(listed - on_disk) == [], "in the README but not in bench/results/"
