"""The links of README.md and docs/*.md lead somewhere: every relative link or picture names a file
of the repository, and every ``#anchor`` is a heading of the page it points at (GitHub's rule for
heading anchors).  A page moved or a heading renamed cannot leave a dead link behind."""

import re
import sys
from pathlib import Path

import pytest

from doc_commands import doc_files

ROOT = Path(__file__).resolve().parents[1]
DOCS = [Path(path) for path in doc_files()]  # the pages the doc-command test reads
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def outside_code(text):
    """The lines of a Markdown text outside fenced code blocks, with inline code removed."""
    fence = False
    for number, line in enumerate(text.split("\n"), 1):
        if line.startswith("```"):
            fence = not fence
            continue
        if not fence:
            yield number, re.sub(r"`[^`]*`", "", line)


def heading_anchor(heading):
    """GitHub's anchor of a heading: lower case, punctuation but ``-`` and ``_`` dropped, spaces to ``-``."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path):
    fence, found = False, set()
    for line in path.read_text(encoding="utf-8").split("\n"):
        if line.startswith("```"):
            fence = not fence
        elif not fence and re.match(r"#{1,6} ", line):
            found.add(heading_anchor(line.lstrip("#")))
    return found


def dead_links(path):
    dead = []
    for number, line in outside_code(path.read_text(encoding="utf-8")):
        for target in LINK.findall(line):
            if re.match(r"[a-z]+:", target):          # https:, mailto:
                continue
            file, _, anchor = target.partition("#")
            linked = (path.parent / file).resolve() if file else path
            where = f"{path.relative_to(ROOT)}:{number}: {target}"
            if not linked.exists():
                dead.append(f"{where}: no file {file}")
            elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
                dead.append(f"{where}: no heading #{anchor} in {linked.relative_to(ROOT)}")
    return dead


def test_the_docs_are_there():
    names = {path.name for path in DOCS}
    assert {"README.md", "encodings.md", "floater.md", "translation.md", "bert.md", "analysis.md",
            "speed.md", "install.md", "results.md"} <= names


@pytest.mark.parametrize("path", DOCS, ids=lambda path: str(path.relative_to(ROOT)))
def test_every_link_leads_somewhere(path):
    assert dead_links(path) == []


def test_the_readme_links_every_page_of_docs():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    linked = {Path(target.partition("#")[0]).name for target in LINK.findall(readme)}
    pages = {path.name for path in DOCS[1:] if not path.name.startswith("benchmark")}
    assert pages - linked == set()


def test_a_dead_link_is_found(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    (tmp_path / "a.md").write_text("# A page\n\n## Its part\n\n[ok](#its-part) [ok](b.md) "
                                   "[gone](#no-such-part) [gone](c.md)\n`[code](d.md)`\n"
                                   "```\n[code](e.md)\n```\n", encoding="utf-8")
    (tmp_path / "b.md").write_text("# B\n", encoding="utf-8")
    dead = dead_links(tmp_path / "a.md")
    assert dead == ["a.md:5: #no-such-part: no heading #no-such-part in a.md", "a.md:5: c.md: no file c.md"]
