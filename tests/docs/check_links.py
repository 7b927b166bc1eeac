#!/usr/bin/env python3
"""Checks the internal links of Shoal's documentation.

Usage: check_links.py [REPO_ROOT]

Reads README.md, STYLE.md and docs/**/*.md and fails (exit 1, one line per problem) when
- a relative link names a file or directory that does not exist,
- a link's #anchor names no heading of the page it points to (GitHub's slugs),
- the text cites an internal work item ("issue 12", "§3", "#12"): readers cannot see those.
Links into fenced code blocks and inline code are ignored; http(s) and mailto links are not
fetched. Standard library only.
"""

import os
import re
import sys
import unicodedata

FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
HEADING = re.compile(r"^ {0,3}(#{1,6})[ \t]+(.*?)[ \t]*#*[ \t]*$")
HTML_ANCHOR = re.compile(r"""<a\s+(?:name|id)\s*=\s*["']([^"']+)["']""", re.IGNORECASE)
CODE_SPAN = re.compile(r"(`+)(.+?)\1")
# [text](target "title") and ![alt](target); the text may hold one level of brackets.
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_DEF = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$")
EXTERNAL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")
# Internal work items: the same pattern as `grep -rnE "issue [0-9]+|§[0-9]"`, case-insensitive,
# and "#12" standing alone in prose.
WORK_ITEM = re.compile(r"issue [0-9]+|§ ?[0-9]", re.IGNORECASE)
HASH_NUMBER = re.compile(r"(?:^|[\s(\[,;])#[0-9]+\b")


def slug(text):
    """GitHub's anchor for a heading's text (github-slugger)."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)  # links keep their text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    text = text.replace("`", "").replace("*", "")
    out = []
    for ch in text.lower():
        cat = unicodedata.category(ch)
        if ch in "- " or cat[0] in "LNM" or cat == "Pc":
            out.append(ch)
    return "".join(out).replace(" ", "-")


def lines_outside_code(text):
    """(line number, line, in_code) for every line; fenced blocks are in_code."""
    fence = None
    for number, line in enumerate(text.split("\n"), 1):
        m = FENCE.match(line)
        if fence is None:
            if m:
                fence = m.group(1)
                yield number, line, True
            else:
                yield number, line, False
        else:
            yield number, line, True
            if m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence) \
                    and line.strip() == m.group(1):
                fence = None


class Page:
    def __init__(self, path):
        self.path = path
        with open(path, encoding="utf-8") as f:
            self.text = f.read()
        self.anchors = set()
        counts = {}
        for _, line, in_code in lines_outside_code(self.text):
            if in_code:
                continue
            m = HEADING.match(line)
            if m:
                base = slug(m.group(2))
                n = counts.get(base, 0)
                counts[base] = n + 1
                self.anchors.add(base if n == 0 else f"{base}-{n}")
            for a in HTML_ANCHOR.findall(line):
                self.anchors.add(a)


def markdown_files(root):
    files = []
    for top in ("README.md", "STYLE.md"):
        path = os.path.join(root, top)
        if os.path.isfile(path):
            files.append(path)
    docs = os.path.join(root, "docs")
    for dirpath, dirnames, filenames in os.walk(docs):
        dirnames.sort()
        for name in sorted(filenames):
            if name.endswith(".md"):
                files.append(os.path.join(dirpath, name))
    return files


def check(root):
    root = os.path.abspath(root)
    pages = {}

    def page(path):
        path = os.path.normpath(path)
        if path not in pages:
            pages[path] = Page(path)
        return pages[path]

    problems = []
    links = 0
    files = markdown_files(root)
    for path in files:
        rel = os.path.relpath(path, root)
        source = page(path)
        for number, line, in_code in lines_outside_code(source.text):
            where = f"{rel}:{number}"
            if WORK_ITEM.search(line):
                problems.append(f"{where}: cites an internal work item: {line.strip()}")
            if in_code:
                continue
            prose = CODE_SPAN.sub("", line)
            targets = [m.group(1) for m in INLINE_LINK.finditer(prose)]
            m = REFERENCE_DEF.match(prose)
            if m:
                targets.append(m.group(1))
            if HASH_NUMBER.search(INLINE_LINK.sub("", prose)):
                problems.append(f"{where}: cites an internal work item (#N): {line.strip()}")
            for target in targets:
                if not target or EXTERNAL.match(target):
                    continue
                links += 1
                file_part, _, anchor = target.partition("#")
                if file_part:
                    if file_part.startswith("/"):
                        resolved = os.path.join(root, file_part.lstrip("/"))
                    else:
                        resolved = os.path.join(os.path.dirname(path), file_part)
                    resolved = os.path.normpath(resolved)
                    if not os.path.exists(resolved):
                        problems.append(f"{where}: no such file: {target}")
                        continue
                else:
                    resolved = path
                if anchor:
                    if not resolved.endswith(".md") or not os.path.isfile(resolved):
                        continue  # anchors into other files are not ours to check
                    if anchor not in page(resolved).anchors:
                        problems.append(f"{where}: no heading #{anchor} in "
                                        f"{os.path.relpath(resolved, root)}: {target}")
    return files, links, problems


def main(argv):
    root = argv[1] if len(argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "..")
    files, links, problems = check(root)
    for p in problems:
        print(p)
    if not files:
        print(f"no README.md or docs/ under {os.path.abspath(root)}")
        return 1
    print(f"{len(files)} pages, {links} internal links, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
