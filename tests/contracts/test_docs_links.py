"""The README is the front door and docs/ sits behind it: a link that points nowhere, or a page
no link reaches, is a page a reader never finds. Plain file reads, no database."""

import os
import re
import unicodedata
from collections import deque

from tests.support.paths import ROOT

README = ROOT / "README.md"

# Code is not prose: `rows[0][23:]` or a Markdown sample inside a fence is not a link.
FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.MULTILINE | re.DOTALL)
INLINE_CODE = re.compile(r"(`+).+?\1", re.DOTALL)
# [text](target "title") and ![alt](target); the target may be wrapped in <...>.
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_LINK = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)", re.MULTILINE)
HEADING = re.compile(r"^\s{0,3}#{1,6}\s+(.+?)\s*#*\s*$", re.MULTILINE)
EXTERNAL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")  # https:, mailto:, ...


def markdown_pages():
    return [README, ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").rglob("*.md"))]


def prose(text):
    return INLINE_CODE.sub("", FENCE.sub("", text))


def relative_links(page):
    """(target path, fragment) for every link that stays inside the repository."""
    text = prose(page.read_text(encoding="utf-8"))
    for target in INLINE_LINK.findall(text) + REFERENCE_LINK.findall(text):
        if EXTERNAL.match(target):
            continue
        path, _, fragment = target.partition("#")
        yield (page if not path else (page.parent / path).resolve()), fragment


def github_anchor(heading):
    """The id GitHub gives a heading: lower case, markup and punctuation dropped, spaces to
    hyphens (letters, digits, '-' and '_' stay)."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading: its text
    text = re.sub(r"[`*]", "", text).strip().lower()
    kept = "".join(
        ch
        for ch in text
        if ch in " -_" or unicodedata.category(ch)[0] in "LN"  # letters, digits
    )
    return kept.replace(" ", "-")


def anchors(page):
    """Every heading's anchor; a repeated heading gets -1, -2, ... as on GitHub."""
    seen, found = {}, set()
    for heading in HEADING.findall(FENCE.sub("", page.read_text(encoding="utf-8"))):
        anchor = github_anchor(heading)
        count = seen.get(anchor, 0)
        seen[anchor] = count + 1
        found.add(anchor if count == 0 else f"{anchor}-{count}")
    return found


def test_every_relative_link_resolves():
    broken = []
    for page in markdown_pages():
        where = page.relative_to(ROOT)
        for target, fragment in relative_links(page):
            if not target.exists():
                broken.append(f"{where}: {os.path.relpath(target, ROOT)} does not exist")
            elif fragment and target.suffix == ".md" and fragment not in anchors(target):
                broken.append(f"{where}: no heading #{fragment} in {target.relative_to(ROOT)}")
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_every_docs_page_is_reachable_from_the_readme():
    reached, queue = {README}, deque([README])
    while queue:
        for target, _ in relative_links(queue.popleft()):
            if target.suffix == ".md" and target.is_file() and target not in reached:
                reached.add(target)
                queue.append(target)
    orphans = [str(p.relative_to(ROOT)) for p in markdown_pages() if p not in reached]
    assert not orphans, "docs pages no link from README.md leads to:\n" + "\n".join(orphans)
