"""The docs stay true to the code: generated parts in sync, every page reachable, links live."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import markdown
import yaml

from trm_llm.settings_doc import env_example, markdown_table

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
README = ROOT / "README.md"
SETTINGS_PAGE = DOCS / "llm.md"

# [text](target) outside code; images and reference-style links are not used in these docs.
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
_FENCE = re.compile(r"^```.*?^```", re.DOTALL | re.MULTILINE)


def _links(text: str) -> list[str]:
    without_code = re.sub(r"`[^`\n]*`", "", _FENCE.sub("", text))
    return _LINK.findall(without_code)


def _anchors(page: Path) -> set[str]:
    """The heading ids mkdocs gives `page` (its `toc` extension, as configured in mkdocs.yml)."""
    md = markdown.Markdown(extensions=["toc", "tables", "fenced_code"])
    md.convert(page.read_text())

    def walk(tokens: list[dict[str, object]]) -> set[str]:
        found: set[str] = set()
        for token in tokens:
            found.add(str(token["id"]))
            found |= walk(token["children"])  # type: ignore[arg-type]
        return found

    return walk(md.toc_tokens)  # type: ignore[attr-defined]


def _nav_pages() -> list[str]:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    pages: list[str] = []

    def walk(entries: list[object]) -> None:
        for entry in entries:
            if isinstance(entry, str):
                pages.append(entry)
            elif isinstance(entry, dict):
                for value in entry.values():
                    walk(value if isinstance(value, list) else [value])

    walk(config["nav"])
    return pages


def _setup_commands() -> list[str]:
    """The README's set-up commands, extracted as `.ci/newcomer` extracts them."""
    text = README.read_text()
    block = text[text.index("<!-- setup-commands -->") : text.index("<!-- /setup-commands -->")]
    return [
        line for line in block.splitlines() if line.strip() and not line.startswith(("<!--", "```"))
    ]


def test_env_example_is_generated_from_llm_settings() -> None:
    assert (ROOT / ".env.example").read_text() == env_example()


def test_settings_table_is_generated_from_llm_settings() -> None:
    page = SETTINGS_PAGE.read_text()
    start = page.index("<!-- settings-table")
    start = page.index("\n", start) + 1
    end = page.index("<!-- /settings-table -->")
    assert page[start:end] == markdown_table()


def test_every_docs_page_is_in_the_nav_and_every_nav_entry_exists() -> None:
    on_disk = sorted(path.relative_to(DOCS).as_posix() for path in DOCS.rglob("*.md"))
    assert sorted(_nav_pages()) == on_disk


def test_every_relative_link_in_the_readme_resolves() -> None:
    broken = []
    for target in _links(README.read_text()):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        file = ROOT / path if path else README
        in_docs = file.suffix == ".md" and file.parent == DOCS
        if not file.is_file() or (anchor and in_docs and anchor not in _anchors(file)):
            broken.append(target)
    assert broken == []


def test_the_readme_links_to_every_docs_page() -> None:
    linked = {target.partition("#")[0] for target in _links(README.read_text())}
    assert sorted(f"docs/{page}" for page in _nav_pages() if f"docs/{page}" not in linked) == []


def test_the_setup_commands_are_make_targets() -> None:
    commands = _setup_commands()
    targets = set(re.findall(r"^([a-z][a-z-]*):", (ROOT / "Makefile").read_text(), re.MULTILINE))
    assert commands == ["make demo", "make test"]
    assert {command.removeprefix("make ") for command in commands} <= targets


def _mkdocs_build(project: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--site-dir", str(project / "site")],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_docs_build_and_a_broken_link_fails_the_build(tmp_path: Path) -> None:
    shutil.copy(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    shutil.copytree(DOCS, tmp_path / "docs")
    clean = _mkdocs_build(tmp_path)
    assert clean.returncode == 0, clean.stderr

    page = tmp_path / "docs" / "index.md"
    page.write_text(page.read_text() + "\n[gone](no-such-page.md) [lost](store.md#no-such-part)\n")
    broken = _mkdocs_build(tmp_path)
    assert broken.returncode != 0
    assert "no-such-page.md" in broken.stderr
    assert "no-such-part" in broken.stderr
