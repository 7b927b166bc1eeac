#!/usr/bin/env python3
"""Checks the flag tables of docs/reference/services.md and shoalctl.md against `--help`.

Usage: check_flags.py REPO_ROOT BIN_DIR

Runs `shoal-coordinator`, `shoal-aggregator`, `shoal-peer` and `shoalctl` from BIN_DIR with
`--help` and fails (exit 1, one line per problem) when
- a flag a binary prints is in no table of its section of services.md (`## \\`shoal-peer\\`` and
  its subsections; `--help`, `--version` and the flags of "What every binary does alike" count
  for every service, and must exist in each);
- a table row (first column, e.g. `--listen HOST:PORT`) or a usage block of the section names a
  flag the binary does not have, or its default column disagrees with the "(default: X)" that
  `--help` prints (10m and `600s` agree, false and off too);
- shoalctl: a command of its help is not in the commands table of shoalctl.md or the other way
  round; a command's flags differ between the help and the page (the commands table, plus the
  table of the command's own section, e.g. `## \\`shoalctl local\\``); the global flags differ
  from the page's global flag table; a `shoalctl ...` usage block names a flag shoalctl lacks.
Standard library only; runs each binary once, in well under a second.
"""

import concurrent.futures
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import doclib  # noqa: E402

SERVICES_PAGE = "docs/reference/services.md"
SHOALCTL_PAGE = "docs/reference/shoalctl.md"
SERVICES = ["shoal-coordinator", "shoal-aggregator", "shoal-peer"]
# Tools whose flags the docs' command lines must use correctly too (their `--help` lists
# '  --flag' lines like the services').
TOOLS = ["shoal-train", "shoal-example-data", "shoal-peer-testing", "shoal-sim"]
COMMON_SECTION = "What every binary does alike"
FLAG = re.compile(r"--[a-z0-9][a-z0-9_-]*")


HELP_CACHE = {}


def run_help(bin_dir, binary, problems):
    """`binary --help`'s output (once per binary), or None after adding a problem."""
    if binary not in HELP_CACHE:
        HELP_CACHE[binary] = _run_help(bin_dir, binary, problems)
    return HELP_CACHE[binary]


def printed_flags(help_text):
    """The flags a service's or tool's `--help` lists: lines '  --flag ...'."""
    return set(re.findall(r"^ {2}(--[a-z0-9][a-z0-9_-]*)", help_text, re.M))


def _run_help(bin_dir, binary, problems):
    path = os.path.join(bin_dir, binary)
    if not os.access(path, os.X_OK):
        problems.append(f"{path}: not found (build it first)")
        return None
    try:
        done = subprocess.run([path, "--help"], capture_output=True, text=True, timeout=30,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        problems.append(f"{binary} --help: no answer within 30 s")
        return None
    if done.returncode != 0:
        problems.append(f"{binary} --help: exit code {done.returncode}: {done.stderr.strip()}")
        return None
    return done.stdout + done.stderr


def seconds(text):
    """'10m' -> 600.0; None when `text` is not a duration."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s|m|h)", text)
    return float(m.group(1)) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[m.group(2)] if m else None


def same_default(printed, documented):
    """Whether a default as `--help` prints it ("127.0.0.1:7000", 10m, false) and as the page's
    default column starts (`127.0.0.1:7000`, `600s`, off) are one value."""
    printed = printed.strip().strip('"')
    spans = doclib.code_spans(documented)
    first = spans[0] if documented.lstrip().startswith("`") else documented.split()[0]
    if printed in ("false", "true"):
        return first == {"false": "off", "true": "on"}[printed] or first == printed
    if seconds(printed) is not None and seconds(first) is not None:
        return seconds(printed) == seconds(first)
    return first == printed


def first_column_flags(table):
    """The flags the first column of a table's rows names, with their line numbers."""
    out = []
    for line, cells in table.rows:
        for span in doclib.code_spans(cells[0]):
            m = FLAG.match(span)
            if m:
                out.append((line, m.group(0)))
    return out


def usage_flags(block, command):
    """The flags of a usage block that starts with `command` or `$ command` (else none)."""
    words = block.text.split()
    if words[:1] == ["$"]:
        words = words[1:]
    if not words or words[0] != command:
        return []
    return FLAG.findall(block.text)


def check_services(root, bin_dir, problems):
    text = doclib.read(os.path.join(root, SERVICES_PAGE))
    sections = doclib.sections(text)
    common_text = sections.get(COMMON_SECTION)
    if common_text is None:
        problems.append(f"{SERVICES_PAGE}: no section \"{COMMON_SECTION}\"")
        common_text = ""
    # The bold items of the common section: **`--help`**, **`--tls-dir DIR` or `--insecure`**.
    common = set()
    for bold in re.findall(r"\*\*(.+?)\*\*", common_text):
        for span in doclib.code_spans(bold):
            m = FLAG.match(span)
            if m:
                common.add(m.group(0))
    if not {"--help", "--version"} <= common:
        problems.append(f"{SERVICES_PAGE}: \"{COMMON_SECTION}\" names no **`--help`** and "
                        "**`--version`**")
    tables = doclib.tables(text)
    for binary in SERVICES:
        help_text = run_help(bin_dir, binary, problems)
        if help_text is None:
            continue
        printed = printed_flags(help_text)
        defaults = dict(re.findall(r"^ {2}(--[a-z0-9][a-z0-9_-]*)[^\n]*\(default: ([^\n]*)\)$",
                                   help_text, re.M))
        if not printed:
            problems.append(f"{binary} --help: lists no flags (expected lines '  --flag ...')")
            continue
        title = f"`{binary}`"
        if title not in sections:
            problems.append(f"{SERVICES_PAGE}: no section ## {title}")
            continue
        documented = set(common)
        for table in tables:
            if title not in table.section or table.header[0].lower() != "flag":
                continue
            has_default = len(table.header) > 1 and table.header[1].lower() == "default"
            for line, flag in first_column_flags(table):
                documented.add(flag)
                if flag not in printed:
                    problems.append(f"{SERVICES_PAGE}:{line}: {binary} has no flag {flag} "
                                    f"(not in `{binary} --help`)")
                    continue
                cells = dict(table.rows)[line]
                default = defaults.get(flag)
                if has_default and default is not None and not same_default(default, cells[1]):
                    problems.append(f"{SERVICES_PAGE}:{line}: {flag}'s default is {cells[1]!r} "
                                    f"here, but `{binary} --help` says {default}")
        for block in doclib.blocks(sections[title]):
            for flag in usage_flags(block, binary):
                if flag not in printed:
                    problems.append(f"{SERVICES_PAGE}: the usage block of {title} names {flag}, "
                                    f"which `{binary} --help` does not list")
        for flag in sorted(common - printed):
            problems.append(f"{SERVICES_PAGE}: \"{COMMON_SECTION}\" names {flag} for every "
                            f"service, but `{binary} --help` does not list it")
        for flag in sorted(printed - documented):
            problems.append(f"{SERVICES_PAGE}: {binary} {flag} is not documented (no row in the "
                            f"tables of ## {title})")


def command_name(usage):
    """'model get NAME --out FILE' -> 'model get': the leading lower-case words."""
    words = []
    for word in usage.split():
        if not re.fullmatch(r"[a-z][a-z-]*", word):
            break
        words.append(word)
    return " ".join(words)


def parse_shoalctl_help(help_text, problems):
    """({command: set of flags}, set of global flags) from `shoalctl --help`."""
    commands, global_flags = {}, set()
    part = None
    current = None
    for line in help_text.split("\n"):
        if re.match(r"^commands:\s*$", line):
            part = "commands"
            continue
        if re.match(r"^global flags:\s*$", line):
            part = "global"
            continue
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        if part == "commands":
            if indent >= 20:
                continue  # the description column
            usage = re.split(r"\s{2,}", line.strip())[0]
            if indent <= 4:
                current = command_name(usage)
                if not current:
                    problems.append(f"shoalctl --help: cannot read the command of {line!r}")
                    continue
                commands[current] = set()
            if current is not None:
                commands[current].update(FLAG.findall(usage))
        elif part == "global":
            m = re.match(r"^ {1,4}(--[a-z0-9][a-z0-9_-]*)", line)
            if m:
                global_flags.add(m.group(1))
    if not commands:
        problems.append("shoalctl --help: no 'commands:' list")
    if not global_flags:
        problems.append("shoalctl --help: no 'global flags:' list")
    return commands, global_flags


def check_shoalctl(root, bin_dir, problems):
    help_text = run_help(bin_dir, "shoalctl", problems)
    if help_text is None:
        return
    commands, global_flags = parse_shoalctl_help(help_text, problems)
    all_flags = set(global_flags).union(*commands.values()) if commands else set(global_flags)
    text = doclib.read(os.path.join(root, SHOALCTL_PAGE))
    tables = doclib.tables(text)

    doc_global = set()
    doc_commands = {}
    for table in tables:
        head = table.header[0].lower()
        if head == "global flag":
            for line, flag in first_column_flags(table):
                doc_global.add(flag)
                if flag not in global_flags:
                    problems.append(f"{SHOALCTL_PAGE}:{line}: {flag} is not among the global "
                                    "flags of `shoalctl --help`")
        elif head == "command":
            for line, cells in table.rows:
                spans = doclib.code_spans(cells[0])
                if not spans:
                    continue
                name = command_name(spans[0])
                doc_commands[name] = (line, set(FLAG.findall(spans[0])))
    if not doc_global:
        problems.append(f"{SHOALCTL_PAGE}: no table with the header 'global flag'")
    if not doc_commands:
        problems.append(f"{SHOALCTL_PAGE}: no table with the header 'command'")
    # A command's own section (## `shoalctl local`) adds the flags of its table.
    for table in tables:
        if table.header[0].lower() != "flag" or not table.section:
            continue
        m = re.fullmatch(r"`shoalctl ([a-z -]+)`", table.section[-1])
        name = m.group(1).strip() if m else None
        if name not in doc_commands:
            problems.append(f"{SHOALCTL_PAGE}:{table.line}: a flag table under "
                            f"\"{table.section[-1]}\", which names no command of the commands "
                            "table")
            continue
        doc_commands[name][1].update(flag for _, flag in first_column_flags(table))

    for flag in sorted(global_flags - doc_global):
        problems.append(f"{SHOALCTL_PAGE}: the global flag {flag} of `shoalctl --help` has no "
                        "row in the global flag table")
    for name in sorted(set(commands) - set(doc_commands)):
        problems.append(f"{SHOALCTL_PAGE}: the command `{name}` of `shoalctl --help` has no row "
                        "in the commands table")
    for name, (line, flags) in sorted(doc_commands.items()):
        if name not in commands:
            problems.append(f"{SHOALCTL_PAGE}:{line}: `shoalctl --help` has no command `{name}`")
            continue
        own = flags - global_flags
        for flag in sorted(own - commands[name]):
            problems.append(f"{SHOALCTL_PAGE}:{line}: `{name}` has no flag {flag} in "
                            "`shoalctl --help`")
        for flag in sorted(commands[name] - flags - global_flags):
            problems.append(f"{SHOALCTL_PAGE}: the flag {flag} of `{name}` (`shoalctl --help`) "
                            "is not documented")
    for block in doclib.blocks(text):
        for flag in usage_flags(block, "shoalctl"):
            if flag not in all_flags:
                problems.append(f"{SHOALCTL_PAGE}:{block.line}: the usage block names {flag}, "
                                "which `shoalctl --help` does not list")


def command_lines(text):
    """(line number, command line) of a page: each line of its fenced blocks (a line ending in
    a backslash joined with the next) and each inline code span of its prose."""
    out = []
    for block in doclib.blocks(text):
        pending, start = "", None
        for offset, line in enumerate(block.body, 1):
            if start is None:
                start = block.line + offset
            if line.rstrip().endswith("\\"):
                pending += line.rstrip()[:-1] + " "
                continue
            out.append((start, pending + line))
            pending, start = "", None
        if start is not None:
            out.append((start, pending))
    for number, line in doclib.prose_lines(text):
        out.extend((number, span) for span in doclib.code_spans(line))
    return out


def check_command_lines(root, flags_of, problems):
    """Every `BINARY --flag` that README.md and docs/ write, in a block or in inline code, names
    a flag BINARY has (for the binaries in flags_of)."""
    pages = ["README.md"]
    for dirpath, _, files in sorted(os.walk(os.path.join(root, "docs"))):
        pages += [os.path.relpath(os.path.join(dirpath, f), root) for f in sorted(files)
                  if f.endswith(".md")]
    checked = 0
    for page in pages:
        for number, line in command_lines(doclib.read(os.path.join(root, page))):
            words = line.split()
            binary = None
            for word in words:
                if word in ("|", "||", "&&", ";", "&") or word.startswith("#"):
                    binary = None
                    continue
                name = os.path.basename(word)
                if name in flags_of:
                    binary = name
                    continue
                m = FLAG.match(word)
                if binary is None or not m or m.group(0) != word.split("=")[0].rstrip(",.;:"):
                    continue
                flag = m.group(0)
                checked += 1
                known = flags_of[binary]
                if flag not in known and not (flag.startswith("--no")
                                              and "--" + flag[4:] in known):
                    problems.append(f"{page}:{number}: `{' '.join(words)}`: {binary} has no flag "
                                    f"{flag}")
    return checked


def main():
    if len(sys.argv) != 3:
        print(__doc__.strip().split("\n")[2], file=sys.stderr)
        return 2
    root, bin_dir = sys.argv[1], sys.argv[2]
    problems = []
    # LibTorch makes shoal-peer and shoal-train take about a second to start: ask all at once.
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(SERVICES + TOOLS) + 1) as pool:
        for binary in SERVICES + TOOLS + ["shoalctl"]:
            pool.submit(run_help, bin_dir, binary, problems)
    check_services(root, bin_dir, problems)
    check_shoalctl(root, bin_dir, problems)
    flags_of = {}
    for binary in SERVICES + TOOLS:
        help_text = run_help(bin_dir, binary, problems)
        if help_text is not None:
            flags_of[binary] = printed_flags(help_text) | {"--help", "--version"}
    if "shoalctl" in HELP_CACHE and HELP_CACHE["shoalctl"] is not None:
        commands, global_flags = parse_shoalctl_help(HELP_CACHE["shoalctl"], problems)
        flags_of["shoalctl"] = set(global_flags).union(*commands.values()) | {"--help",
                                                                                "--version"}
    checked = check_command_lines(root, flags_of, problems)
    for p in problems:
        print(p)
    print(f"check_flags: {len(flags_of)} binaries' --help against {SERVICES_PAGE} and "
          f"{SHOALCTL_PAGE}, {checked} flags in command lines of the docs; "
          f"{len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
