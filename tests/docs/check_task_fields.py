#!/usr/bin/env python3
"""Checks the field tables of docs/reference/task-file.md against the TaskSpec proto.

Usage: check_task_fields.py [REPO_ROOT]

Task files are TaskSpec (protos/shoal/common/v1/task.proto) by its field names: libs/task's
reader looks every key up with FindFieldByName, so the proto is the list of what a task file
may set. (The one form beyond it, `model: {torchscript: FILE}` for `model: torchscript` with
`torchscript: {file: FILE}`, is a value of `model`, not a key.) Fails (exit 1, one line per
problem) when
- a field of TaskSpec or of a message below it (dataset, optimizer, gossip and its
  flow_control, aggregation_options, async, torchscript) has no row in the tables;
- a row names a field the proto does not have;
- an enum field's row does not name each of its values as a task file writes them
  (`label-skew` for PARTITION_LABEL_SKEW).
The tables are those whose first column is `field` or `setting`, under the headings listed in
PREFIXES (a row's `format` under "A peer's own data" is `dataset.format`). In the first column,
`a.b` names a field, `x.*` points to the table of section x, and `.min` after `flow_control.initial`
is `flow_control.min`. Standard library only.
"""

import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import doclib  # noqa: E402

PAGE = "docs/reference/task-file.md"
PROTO = "protos/shoal/common/v1/task.proto"
ROOT_MESSAGE = "TaskSpec"

# The tables of PAGE and the path their first column is relative to.
PREFIXES = {
    "Every field, with its default": "",
    "Gossip settings": "gossip.",
    "A peer's own data": "dataset.",
}

# Enum values a field refuses although its enum has them (libs/task says why).
NOT_ACCEPTED = {
    "topk_values": {"topk"},  # the kept values' encoding: none, fp16 or int8 (ValidateCompression)
}

SCALARS = {"double", "float", "int32", "int64", "uint32", "uint64", "sint32", "sint64",
           "fixed32", "fixed64", "sfixed32", "sfixed64", "bool", "string", "bytes"}


def parse_proto(text):
    """({message: [(field name, type)]}, {enum: [value names]}) of a proto3 file (top-level and
    nested declarations, by simple name; oneof members count as the message's fields)."""
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"//[^\n]*", " ", text)
    tokens = re.findall(r"[A-Za-z_][A-Za-z0-9_.]*|\d+|[{}=;<>,\[\]]|\"[^\"]*\"", text)
    messages, enums = {}, {}
    stack = []  # ("message"|"enum"|"oneof"|"other", name)
    i = 0
    while i < len(tokens):
        t = tokens[i]
        if t in ("message", "enum", "oneof", "service") and i + 2 < len(tokens) \
                and tokens[i + 2] == "{":
            stack.append((t, tokens[i + 1]))
            if t == "message":
                messages[tokens[i + 1]] = []
            elif t == "enum":
                enums[tokens[i + 1]] = []
            i += 3
            continue
        if t == "}":
            if stack:
                stack.pop()
            i += 1
            continue
        if t == "{":  # an option's aggregate value
            stack.append(("other", ""))
            i += 1
            continue
        # One statement, up to its ';'.
        j = i
        while j < len(tokens) and tokens[j] not in (";", "{", "}"):
            j += 1
        if j < len(tokens) and tokens[j] == "{":  # e.g. an rpc with options
            stack.append(("other", ""))
            i = j + 1
            continue
        stmt = tokens[i:j]
        i = j + 1 if j < len(tokens) and tokens[j] == ";" else j
        if not stmt or not stack:
            continue
        kind = stack[-1][0]
        owner = stack[-1][1]
        if kind == "oneof":
            owner = next(name for k, name in reversed(stack) if k == "message")
            kind = "message"
        if stmt[0] in ("option", "reserved", "extensions", "syntax", "package", "import"):
            continue
        if kind == "enum" and len(stmt) >= 3 and stmt[1] == "=":
            enums[owner].append(stmt[0])
        elif kind == "message" and "=" in stmt:
            head = stmt[:stmt.index("=")]
            if head[0] == "map":
                messages[owner].append((head[-1], "map"))
                continue
            if head[0] in ("optional", "repeated", "required"):
                head = head[1:]
            if len(head) == 2:
                messages[owner].append((head[1], head[0].split(".")[-1]))
    return messages, enums


def friendly(enum_name, value):
    """What a task file writes for an enum value: the enum's prefix dropped, lower case, '-'
    for '_' (libs/task/task_file.cc: FriendlyEnumName)."""
    prefix = re.sub(r"(?<!^)([A-Z])", r"_\1", enum_name).upper() + "_"
    if value.startswith(prefix):
        value = value[len(prefix):]
    return value.lower().replace("_", "-")


def field_paths(messages, enums, problems):
    """{path: type} of every field below ROOT_MESSAGE, message fields included."""
    paths = {}

    def walk(message, prefix, seen):
        for name, kind in messages[message]:
            path = prefix + name
            paths[path] = kind
            if kind in messages:
                if kind in seen:
                    problems.append(f"{PROTO}: {path}: recursive message {kind}")
                    continue
                walk(kind, path + ".", seen | {kind})
            elif kind not in enums and kind not in SCALARS:
                problems.append(f"{PROTO}: {path}: type {kind} is not declared in this file "
                                "(teach check_task_fields.py its imports)")

    walk(ROOT_MESSAGE, "", {ROOT_MESSAGE})
    return paths


def documented_fields(page_text, problems):
    """[(line, path, row cells)] of every field a row of the tables names."""
    out = []
    tables = [t for t in doclib.tables(page_text)
              if t.header and t.header[0].strip("` ").lower() in ("field", "setting")]
    seen_sections = set()
    for table in tables:
        section = table.section[-1] if table.section else ""
        if section not in PREFIXES:
            problems.append(f"{PAGE}:{table.line}: a field table under \"{section}\": add the "
                            "section to PREFIXES in tests/docs/check_task_fields.py")
            continue
        seen_sections.add(section)
        prefix = PREFIXES[section]
        for line, cells in table.rows:
            previous = None
            for span in doclib.code_spans(doclib.without_parentheses(cells[0])):
                name = span.split()[0]
                if name.startswith("."):
                    if previous is None or "." not in previous:
                        problems.append(f"{PAGE}:{line}: `{name}` follows no `a.b` field")
                        continue
                    name = previous.rsplit(".", 1)[0] + name
                if not re.fullmatch(r"[a-z0-9_]+(\.[a-z0-9_]+)*(\.\*)?", name):
                    continue  # a value, e.g. `{torchscript: FILE}`
                previous = name
                out.append((line, prefix + name, cells))
    for section in PREFIXES:
        if section not in seen_sections:
            problems.append(f"{PAGE}: no field table under the heading \"{section}\"")
    return out


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "..")
    problems = []
    messages, enums = parse_proto(doclib.read(os.path.join(root, PROTO)))
    if ROOT_MESSAGE not in messages:
        print(f"{PROTO}: no message {ROOT_MESSAGE}")
        return 1
    paths = field_paths(messages, enums, problems)
    rows = documented_fields(doclib.read(os.path.join(root, PAGE)), problems)

    documented = set()
    for line, path, cells in rows:
        if path.endswith(".*"):
            base = path[:-2]
            if paths.get(base) not in messages:
                problems.append(f"{PAGE}:{line}: `{path}`: {base} is not a message field of "
                                f"{ROOT_MESSAGE}")
            continue
        if path not in paths:
            problems.append(f"{PAGE}:{line}: `{path}` is documented but {ROOT_MESSAGE} has no such "
                            f"field ({PROTO})")
            continue
        documented.add(path)
        kind = paths[path]
        if kind in enums:
            written = set(doclib.code_spans(" ".join(cells)))
            missing = [friendly(kind, v) for v in enums[kind]
                       if not v.endswith("_UNSPECIFIED")
                       and friendly(kind, v) not in NOT_ACCEPTED.get(path, set())
                       and friendly(kind, v) not in written]
            if missing:
                problems.append(f"{PAGE}:{line}: `{path}` ({kind}) does not name the values "
                                + ", ".join(f"`{v}`" for v in missing))

    for path, kind in sorted(paths.items()):
        if kind in messages:
            continue  # documented through its fields
        if path not in documented:
            problems.append(f"{PAGE}: {ROOT_MESSAGE}.{path} ({PROTO}) has no row in the field "
                            "tables")

    for p in problems:
        print(p)
    leaves = sum(1 for k in paths.values() if k not in messages)
    print(f"check_task_fields: {leaves} fields of {ROOT_MESSAGE} and its messages, "
          f"{len(documented)} documented; {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
