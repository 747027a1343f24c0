"""The documentation: the generated configuration page is current, the README is short, links resolve."""

from __future__ import annotations

import re
from pathlib import Path

from lipcast.server.config_doc import COMMAND, render_markdown

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
README_MAX_LINES = 150

FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
CODE_SPAN = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"!?\[[^\]\n]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
EXTERNAL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")  # http:, https:, mailto:, ...


def relative_links(markdown: str) -> list[str]:
    """The link and image targets of a Markdown text that name a file of this repository."""
    prose = CODE_SPAN.sub("", FENCE.sub("", markdown))
    targets = []
    for target in LINK.findall(prose):
        path = target.split("#", 1)[0]
        if path and not EXTERNAL.match(path):
            targets.append(path)
    return targets


def test_configuration_page_is_current() -> None:
    page = DOCS / "configuration.md"
    current = page.read_text(encoding="utf-8") if page.exists() else ""
    assert current == render_markdown(), f"docs/configuration.md is stale; regenerate it: {COMMAND}"


def test_configuration_page_names_every_flag() -> None:
    from lipcast.server.flags import build_parser

    page = render_markdown()
    for action in build_parser()._actions:
        for flag in action.option_strings:
            assert f"`{flag}" in page, flag


def test_readme_is_short() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, (
        f"README.md has {len(lines)} lines, at most {README_MAX_LINES}: move detail to docs/"
    )


def test_relative_links_point_to_files() -> None:
    pages = [README, *sorted(DOCS.glob("*.md"))]
    missing = []
    for page in pages:
        for target in relative_links(page.read_text(encoding="utf-8")):
            if not (page.parent / target).exists():
                missing.append(f"{page.relative_to(ROOT)}: {target}")
    assert not missing, "links to files that do not exist:\n" + "\n".join(missing)


def test_link_finder() -> None:
    text = (
        "[a](docs/a.md) ![b](b.png) [c](https://example.org) [d](#here) [e](e.md#part)\n"
        "`[f](not-a-link.md)`\n```\n[g](code.md)\n```\n"
    )
    assert relative_links(text) == ["docs/a.md", "b.png", "e.md"]
