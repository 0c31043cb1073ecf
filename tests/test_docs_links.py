"""The user documentation holds together: every relative link in README.md and docs/**/*.md
reaches a file (and, where it names one, a heading of that file), and the README's set-up
section presents exactly the two commands a fresh machine needs.

Real files, read as they are committed: a page moved or a heading renamed without its
links fails here, not in a reader's browser.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").rglob("*.md"))]
USER_GUIDES = ("first-pod", "the-loop", "verdicts", "counters-and-tools", "costs-and-lease",
               "fleets", "security", "agents")

# [text](target) outside code; an image's ![alt](target) is a link too.
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
_FENCE = re.compile(r"^(```|~~~)")
_SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks, inline code spans removed: a link written
    inside code is an example, not a link."""
    out, fenced = [], False
    for line in text.splitlines():
        if _FENCE.match(line.lstrip()):
            fenced = not fenced
            continue
        if not fenced:
            out.append(re.sub(r"`[^`]*`", "", line))
    return out


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, inline markup and punctuation dropped,
    spaces to hyphens (each space its own hyphen)."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every heading anchor of a page, with GitHub's -1, -2 suffixes for repeats."""
    seen: dict[str, int] = {}
    out: set[str] = set()
    fenced = False
    for line in page.read_text(encoding="utf-8").splitlines():
        if _FENCE.match(line.lstrip()):
            fenced = not fenced
            continue
        m = None if fenced else re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            base = slug(m.group(1))
            n = seen.get(base, 0)
            out.add(base if n == 0 else f"{base}-{n}")
            seen[base] = n + 1
    return out


def links(page: Path) -> list[str]:
    return [m.group(1) for line in prose_lines(page.read_text(encoding="utf-8"))
            for m in _LINK.finditer(line)]


def broken(page: Path) -> list[str]:
    """Each relative link of a page that reaches no file, or no heading of it."""
    bad = []
    for target in links(page):
        if _SCHEME.match(target):
            continue  # http(s), mailto: not checked here (no network)
        path_part, _, anchor = target.partition("#")
        dest = (page.parent / path_part).resolve() if path_part else page
        if not dest.exists():
            bad.append(f"{target}: no such file {dest}")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(f"{target}: {dest.name} has no heading #{anchor}")
    return bad


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    assert broken(page) == []


def test_the_checker_sees_a_broken_link_and_a_broken_anchor(tmp_path: Path) -> None:
    # Without this, a regex that matched nothing would pass every page above.
    (tmp_path / "there.md").write_text("# A heading, with `code`\n\n## Twice\n\n## Twice\n")
    page = tmp_path / "page.md"
    page.write_text("[ok](there.md) [ok](there.md#a-heading-with-code) [ok](there.md#twice-1)\n"
                    "[gone](missing.md) [no anchor](there.md#nope) [self](#nope)\n"
                    "`[in code](missing2.md)`\n```\n[fenced](missing3.md)\n```\n"
                    "[web](https://example.invalid/x)\n")
    assert [b.split(":")[0] for b in broken(page)] == ["missing.md", "there.md#nope", "#nope"]


def test_the_user_guides_exist_and_each_links_back_to_the_readme() -> None:
    readme_links = links(README)
    for name in USER_GUIDES:
        guide = ROOT / "docs" / "guide" / f"{name}.md"
        assert guide.is_file(), guide
        assert f"docs/guide/{name}.md" in readme_links, f"the README does not link {name}"
        assert any(t.split("#")[0] == "../../README.md" for t in links(guide)), guide


def setup_section(text: str) -> str:
    m = re.search(r"^## Set up\b.*?$(.*?)^## ", text, re.M | re.S)
    assert m, "README.md has no '## Set up' section followed by another section"
    return m.group(1)


def commands(section: str) -> list[str]:
    """The command lines of a section's fenced shell blocks (comments and blanks left out)."""
    blocks = re.findall(r"^```(?:sh|bash|console|shell)?\n(.*?)^```", section, re.M | re.S)
    return [line.strip() for block in blocks for line in block.splitlines()
            if line.strip() and not line.strip().startswith("#")]


def test_the_readme_set_up_is_exactly_two_commands() -> None:
    section = setup_section(README.read_text(encoding="utf-8"))
    assert commands(section) == ["scripts/run", "scripts/test"]
    # Nothing else is presented as a step: no numbered or bulleted list of things to do.
    assert not re.search(r"^\s*(\d+\.|[-*])\s", section, re.M)


def test_the_set_up_check_sees_a_third_command() -> None:
    text = ("## Set up\n\n```sh\nscripts/run\n```\n\n"
            "```sh\npip install x\nscripts/test\n```\n## Next\n")
    assert commands(setup_section(text)) == ["scripts/run", "pip install x", "scripts/test"]
