"""The documentation stays navigable: every relative link in README.md, ARCHITECTURE.md and
docs/*.md resolves to a file (and, with `#anchor`, to a heading of it, slugged as GitHub
slugs headings), every source path quoted in code spans exists, and the README stays short.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README_MAX_LINES = 350

_FENCE = re.compile(r"^(```|~~~)")
_CODE_SPAN = re.compile(r"(`+)(.+?)\1")
_LINK = re.compile(r"!?\[(?:[^\]\\]|\\.)*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
# A quoted path names a file or folder of the tree when it starts with one of these.
_TREE_ROOTS = ("astrai_batch/", "tests/", "scripts/", "docs/", "examples/")
_PACKAGE_ROOTS = ("cache/", "engine/", "io/", "jobs/", "bench/")


def doc_files() -> list[Path]:
    return [ROOT / "README.md", ROOT / "ARCHITECTURE.md", *sorted((ROOT / "docs").glob("*.md"))]


def prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks (links and headings there are not markdown)."""
    lines, fenced = [], False
    for line in text.splitlines():
        if _FENCE.match(line.strip()):
            fenced = not fenced
        lines.append("" if fenced or _FENCE.match(line.strip()) else line)
    return lines


def github_slug(heading: str) -> str:
    """GitHub's anchor for a heading: rendered text, lowercased, punctuation other than `-`
    and `_` dropped, each space a `-`."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link renders as its text
    text = re.sub(r"`+", "", text)
    text = re.sub(r"[*_]{1,3}(\S(?:.*?\S)?)[*_]{1,3}", r"\1", text)  # emphasis
    text = re.sub(r"<[^>]+>", "", text).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading's anchor; a repeated slug gets `-1`, `-2`, ... as on GitHub."""
    seen: dict[str, int] = {}
    result = set()
    for line in prose_lines(path.read_text(encoding="utf-8")):
        match = _HEADING.match(line)
        if not match:
            continue
        slug = github_slug(match.group(2))
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        result.add(slug if count == 0 else f"{slug}-{count}")
    return result


def links(path: Path) -> list[tuple[int, str]]:
    found = []
    for number, line in enumerate(prose_lines(path.read_text(encoding="utf-8")), start=1):
        without_code = _CODE_SPAN.sub("", line)
        found.extend((number, target) for target in _LINK.findall(without_code))
    return found


def broken_links(path: Path) -> list[str]:
    problems = []
    for number, target in links(path):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:, ...
            continue
        file_part, _, anchor = target.partition("#")
        linked = (path.parent / file_part).resolve() if file_part else path
        where = f"{path.relative_to(ROOT)}:{number}: {target}"
        if not linked.exists():
            problems.append(f"{where}: no such file")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            problems.append(f"{where}: no heading #{anchor} in {linked.name}")
    return problems


def missing_paths(path: Path) -> list[str]:
    """Quoted paths of this tree (`engine/runner/model_runner.py`, `tests/...`, `bench/workloads`
    for a module) that do not exist; package folders may be quoted without `astrai_batch/`."""
    problems = []
    for number, line in enumerate(prose_lines(path.read_text(encoding="utf-8")), start=1):
        for _, span in _CODE_SPAN.findall(line):
            if not re.fullmatch(r"[A-Za-z0-9_./-]+", span):
                continue
            if not span.startswith((*_TREE_ROOTS, *_PACKAGE_ROOTS)):
                continue  # `.OUTPUT.ckpt/`, `s3://...`, `cache.layout.KVLayout`: not a path
            bases = [ROOT, ROOT / "astrai_batch"] if span.startswith(_PACKAGE_ROOTS) else [ROOT]
            names = [span, f"{span}.py"] if not span.endswith(("/", ".py")) else [span]
            if not any((base / name).exists() for base in bases for name in names):
                problems.append(f"{path.relative_to(ROOT)}:{number}: `{span}` does not exist")
    return problems


@pytest.mark.parametrize("doc", doc_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(doc: Path) -> None:
    problems = broken_links(doc)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("doc", doc_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_quoted_source_path_exists(doc: Path) -> None:
    problems = missing_paths(doc)
    assert not problems, "\n".join(problems)


def test_readme_stays_short() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines (at most {README_MAX_LINES})"


def test_docs_folder_is_linked_from_the_readme() -> None:
    linked = {target.partition("#")[0] for _, target in links(ROOT / "README.md")}
    unlinked = [
        p.name for p in sorted((ROOT / "docs").glob("*.md")) if f"docs/{p.name}" not in linked
    ]
    assert unlinked == []


@pytest.mark.parametrize(
    ("heading", "slug"),
    [
        ("Batch-invariant numerics vs `--fast-numerics` (2026-12-03)",
         "batch-invariant-numerics-vs---fast-numerics-2026-12-03"),
        ("Checking a GPU machine: `scripts/gpu_check`", "checking-a-gpu-machine-scriptsgpu_check"),
        ("Planning a job: `astrai-batch plan`", "planning-a-job-astrai-batch-plan"),
        ("The engine's *front* and [links](x.md)", "the-engines-front-and-links"),
    ],
)  # fmt: skip
def test_github_slugs(heading: str, slug: str) -> None:
    assert github_slug(heading) == slug


def test_a_broken_link_and_anchor_are_found(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)
    (tmp_path / "a.md").write_text("# Title\n\n## Two words\n", encoding="utf-8")
    doc = tmp_path / "b.md"
    doc.write_text(
        "[ok](a.md) [ok](a.md#two-words) [ok](#here) [web](https://x.org/y)\n"
        "`[not a link](gone.md)`\n```\n[in a fence](gone.md)\n```\n"
        "## Here\n[gone](gone.md) [bad](a.md#three) [self](#nowhere)\n",
        encoding="utf-8",
    )
    assert broken_links(doc) == [
        "b.md:7: gone.md: no such file",
        "b.md:7: a.md#three: no heading #three in a.md",
        "b.md:7: #nowhere: no heading #nowhere in b.md",
    ]
