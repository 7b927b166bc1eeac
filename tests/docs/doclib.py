"""Reading Shoal's Markdown pages: sections, pipe tables, fenced blocks and code spans.

Shared by the documentation checks in tests/docs/ (standard library only). Only what the pages
use is understood: ATX headings, GitHub pipe tables, ``` fences (up to three spaces in).
"""

import re

FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})\s*([^`\s]*)")
HEADING = re.compile(r"^ {0,3}(#{1,6})[ \t]+(.*?)[ \t]*#*[ \t]*$")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")
TABLE_RULE = re.compile(r"^\s*\|?\s*:?-{3,}:?\s*(\|\s*:?-{3,}:?\s*)*\|?\s*$")


class Block:
    """A fenced code block: `line` is the fence's line number (from 1), `info` its info string,
    `before` the line just above the fence (stripped), `body` the lines inside."""

    def __init__(self, line, info, before, body):
        self.line = line
        self.info = info
        self.before = before
        self.body = body

    @property
    def text(self):
        return "".join(line + "\n" for line in self.body)


class Table:
    """A pipe table: `header` cells, then `rows`, each (line number, cells)."""

    def __init__(self, line, header, rows, section):
        self.line = line
        self.header = header
        self.rows = rows
        self.section = section  # the titles of the headings above it, outermost first


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def blocks(text):
    """Every fenced block of a page, in order."""
    lines = text.split("\n")
    out = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence = m.group(1)
        before = lines[i - 1].strip() if i > 0 else ""
        body = []
        j = i + 1
        while j < len(lines):
            close = FENCE.match(lines[j])
            if close and close.group(1)[0] == fence[0] and len(close.group(1)) >= len(fence) \
                    and lines[j].strip() == close.group(1):
                break
            body.append(lines[j])
            j += 1
        out.append(Block(i + 1, m.group(2), before, body))
        i = j + 1
    return out


def prose_lines(text):
    """(line number, line) for every line outside fenced blocks."""
    inside = set()
    for block in blocks(text):
        inside.update(range(block.line, block.line + len(block.body) + 2))
    return [(n, line) for n, line in enumerate(text.split("\n"), 1) if n not in inside]


def split_cells(row):
    """The cells of one table row; `\\|` inside a cell is a literal bar."""
    row = row.strip()
    if row.startswith("|"):
        row = row[1:]
    if row.endswith("|") and not row.endswith("\\|"):
        row = row[:-1]
    cells = re.split(r"(?<!\\)\|", row)
    return [cell.strip().replace("\\|", "|") for cell in cells]


def tables(text):
    """Every pipe table outside fenced blocks, with the headings it sits under."""
    lines = prose_lines(text)
    out = []
    headings = []  # (level, title)
    i = 0
    while i < len(lines):
        number, line = lines[i]
        h = HEADING.match(line)
        if h:
            level = len(h.group(1))
            headings = [x for x in headings if x[0] < level] + [(level, h.group(2))]
            i += 1
            continue
        if "|" in line and i + 1 < len(lines) and TABLE_RULE.match(lines[i + 1][1]) \
                and lines[i + 1][0] == number + 1:
            header = split_cells(line)
            rows = []
            j = i + 2
            while j < len(lines) and lines[j][1].strip().startswith("|"):
                rows.append((lines[j][0], split_cells(lines[j][1])))
                j += 1
            out.append(Table(number, header, rows, [t for _, t in headings]))
            i = j
            continue
        i += 1
    return out


def sections(text):
    """{heading title: the section's text up to the next heading of the same or a higher
    level}, for headings outside fenced blocks."""
    lines = text.split("\n")
    prose = {n for n, _ in prose_lines(text)}
    marks = []
    for n, line in enumerate(lines, 1):
        h = HEADING.match(line)
        if h and n in prose:
            marks.append((n, len(h.group(1)), h.group(2)))
    out = {}
    for k, (n, level, title) in enumerate(marks):
        end = len(lines) + 1
        for m, other, _ in marks[k + 1:]:
            if other <= level:
                end = m
                break
        out[title] = "\n".join(lines[n:end - 1])
    return out


def code_spans(text):
    """The contents of the `code spans` of a piece of prose, in order."""
    return [m.group(2).strip() for m in CODE_SPAN.finditer(text)]


def without_parentheses(text):
    """`text` without its parenthesised asides (nested ones too); parentheses inside code
    spans are kept as code."""
    out = []
    depth = 0
    code = False
    for ch in text:
        if ch == "`":
            code = not code
        elif not code and ch == "(":
            depth += 1
            continue
        elif not code and ch == ")" and depth > 0:
            depth -= 1
            continue
        if depth == 0:
            out.append(ch)
    return "".join(out)
