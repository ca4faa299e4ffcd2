"""Every relative link in the README and the docs resolves: the file exists, and a `#anchor`
names a heading of that file as GitHub spells its anchors.

GitHub's rule (github-slugger): the heading's text as rendered (links and images reduced to their
text), lower-cased, every character that is not a letter, a digit, `_`, `-` or a space dropped,
spaces turned into `-`; the second heading with the same slug gets `-1`, the third `-2`. Explicit
`<a id="...">` / `<a name="...">` anchors count too. Links inside code (fenced blocks, inline
backticks) are text, not links.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted(
    [ROOT / "README.md", *ROOT.glob("docs/*.md"), *ROOT.glob("bench/RESULTS*.md")],
    key=lambda p: str(p),
)

_FENCE = re.compile(r"^\s*(```|~~~)")
_INLINE_CODE = re.compile(r"(`+)(.+?)\1")
# [text](target "title") and ![alt](target); the target has no spaces (ours never do).
_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_REF_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$")
_HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
_HTML_ANCHOR = re.compile(r"<a\s+[^>]*(?:id|name)=\"([^\"]+)\"", re.IGNORECASE)


def prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks (a fenced line itself is dropped)."""
    lines, fenced = [], False
    for line in text.splitlines():
        if _FENCE.match(line):
            fenced = not fenced
            continue
        lines.append("" if fenced else line)
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's markdown text (before de-duplication)."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # links and images: their text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML tags
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every anchor a link may name in the markdown file `path`."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    for line in prose_lines(path.read_text(encoding="utf-8")):
        found.update(_HTML_ANCHOR.findall(line))
        heading = _HEADING.match(line)
        if not heading:
            continue
        base = slug(heading.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(path: Path) -> list[tuple[int, str]]:
    """(line number, target) of every link and image in the prose of `path`."""
    out = []
    for number, line in enumerate(prose_lines(path.read_text(encoding="utf-8")), start=1):
        line = _INLINE_CODE.sub("", line)
        out += [(number, target) for target in _LINK.findall(line)]
        ref = _REF_DEF.match(line)
        if ref:
            out.append((number, ref.group(1)))
    return out


def broken(path: Path, root: Path = ROOT) -> list[str]:
    """What is wrong with each relative link of `path` (a page under `root`), one line each."""
    problems = []
    for number, target in links(path):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.IGNORECASE):  # http:, mailto:, ...
            continue
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        where = f"{path.relative_to(root)}:{number}: {target}"
        if not dest.exists():
            problems.append(f"{where}: no such file {dest}")
        elif not dest.is_relative_to(root):
            problems.append(f"{where}: outside the repository")
        elif anchor and (dest.suffix != ".md" or anchor not in anchors(dest)):
            problems.append(f"{where}: no heading with the anchor #{anchor} in {dest.name}")
    return problems


def test_github_anchor_rule_by_hand() -> None:
    # What GitHub renders for headings of these pages: punctuation and symbols dropped, `_` and
    # Greek letters kept, each space one hyphen (so ": " leaves one, " — " two).
    assert slug("Rollout: the `hf` engine's own sampling loop against `generate`") == (
        "rollout-the-hf-engines-own-sampling-loop-against-generate"
    )
    assert slug("The first minute on a GPU: `make gpu-check`") == (
        "the-first-minute-on-a-gpu-make-gpu-check"
    )
    assert slug("`grpo` against `dapo` over six seeds") == "grpo-against-dapo-over-six-seeds"
    assert slug("Arms as Ray jobs (opt-in)") == "arms-as-ray-jobs-opt-in"
    assert slug("Δ parent × 2 ≤ 3") == "δ-parent--2--3"
    assert slug("clip_high and [the docs](docs/x.md)") == "clip_high-and-the-docs"


def test_anchors_deduplicate_and_skip_code(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        '# Title\n## Runs\n```bash\n# not a heading\n```\n## Runs\n<a id="kept"></a>\n',
        encoding="utf-8",
    )
    assert anchors(page) == {"title", "runs", "runs-1", "kept"}


def test_a_broken_link_is_reported_with_its_line(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# Here\n", encoding="utf-8")
    page = tmp_path / "page.md"
    page.write_text(
        "[ok](other.md#here) `[code](nowhere.md)`\n[bad](other.md#there)\n"
        "![img](missing.png) [web](https://example.com/x#y)\n",
        encoding="utf-8",
    )
    assert broken(page, root=tmp_path) == [
        "page.md:2: other.md#there: no heading with the anchor #there in other.md",
        f"page.md:3: missing.png: no such file {tmp_path / 'missing.png'}",
    ]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    problems = broken(page)
    assert not problems, "\n".join(problems)
