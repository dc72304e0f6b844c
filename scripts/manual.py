"""The manual: README.md, then the reference pages under docs/ by name. What checks the manual reads every page
through this (tests/test_readme.py, the examples' code shown verbatim), as copier's task
(scripts/new_project.py) cuts a left-out example out of each of these pages, so a section may move between pages
without a checker losing it. Only the standard library."""

import re
from pathlib import Path


def pages(root: Path) -> list[Path]:
    """README.md, then docs/*.md by name."""
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def text(root: Path) -> str:
    """Every page, one after the other."""
    return "\n".join(page.read_text() for page in pages(root))


def headings(page: str) -> list[tuple[int, int, str]]:
    """Each heading of a page's text, outside code blocks (a shell comment is no heading): (offset, level, title)."""
    found, offset, fenced = [], 0, False
    for line in page.splitlines(keepends=True):
        fenced ^= line.startswith("```")
        if not fenced and (heading := re.match(r"(#+) (.+)", line)):
            found.append((offset, len(heading.group(1)), heading.group(2).strip()))
        offset += len(line)
    return found


def sections(page: str, deepest: int = 6) -> list[tuple[str, str]]:
    """The page cut at every heading of level ``deepest`` or above: (title, text from the heading on); what comes
    before the first heading has the title ""."""
    cuts = [(offset, title) for offset, level, title in headings(page) if level <= deepest]
    starts = [(0, ""), *cuts] if not cuts or cuts[0][0] > 0 else cuts
    ends = [offset for offset, _ in starts[1:]] + [len(page)]
    return [(title, page[start:end]) for (start, title), end in zip(starts, ends, strict=True)]


def section_bounds(page: str, title: str) -> tuple[int, int] | None:
    """Where the section headed ``title`` runs in a page's text, at whatever level it stands: from its heading to
    the next heading of its level or above, or the page's end. None: the page has no such heading."""
    found = headings(page)
    for i, (start, level, heading) in enumerate(found):
        if heading == title:
            end = next((offset for offset, deeper, _ in found[i + 1 :] if deeper <= level), len(page))
            return start, end
    return None


def section(root: Path, title: str) -> tuple[Path, str]:
    """The page that holds the section headed ``title``, and the section's text."""
    for page in pages(root):
        content = page.read_text()
        if bounds := section_bounds(content, title):
            return page, content[bounds[0] : bounds[1]]
    raise LookupError(f"no page of the manual ({', '.join(p.name for p in pages(root))}) has a section {title!r}")
