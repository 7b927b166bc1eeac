#!/usr/bin/env python3
"""Checks the metrics table of docs/reference/metrics.md against the metrics the code registers.

Usage: check_metrics.py [REPO_ROOT]

The registered metrics are the `"shoal_..."` string literals of every file under services/ and
libs/ whose name contains "metrics" (the components' XxxMetrics structs, built with
prometheus::BuildCounter().Name("shoal_...") or libs/metrics/builders.h; a name kept in a
constant, kFailed[] = "shoal_...", counts the same). A literal that ends in `_` would be a prefix
that names are composed from: the check refuses it rather than guess, so teach it the
composition first. Fails (exit 1, one line per problem) when a registered metric is not in the
table, or the table names one that nothing registers.

The table's rows are "service[, mode] | metrics": each `name` in the second column, outside
parentheses, is shoal_<service>_<name>; `{label}` after a name is its labels, and a brace list
inside a name is shorthand, `fetches_{started,failed}_total` for fetches_started_total and
fetches_failed_total. Standard library only.
"""

import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import doclib  # noqa: E402

PAGE = "docs/reference/metrics.md"
SOURCE_DIRS = ["services", "libs"]
LITERAL = re.compile(r'"(shoal_[A-Za-z0-9_:]*)"')


def registered_metrics(root, problems):
    """{metric name: the first file that names it}."""
    names = {}
    files = 0
    for top in SOURCE_DIRS:
        for dirpath, _, filenames in sorted(os.walk(os.path.join(root, top))):
            for filename in sorted(filenames):
                if "metrics" not in filename or not filename.endswith((".cc", ".h")):
                    continue
                path = os.path.join(dirpath, filename)
                shown = os.path.relpath(path, root)
                files += 1
                for name in LITERAL.findall(doclib.read(path)):
                    if name.endswith("_"):
                        problems.append(f"{shown}: \"{name}\" looks like a prefix that metric "
                                        "names are composed from; tests/docs/check_metrics.py "
                                        "reads whole names only: teach it the composition")
                        continue
                    names.setdefault(name, shown)
    if files < 3:
        problems.append(f"found only {files} *metrics* files under {', '.join(SOURCE_DIRS)}")
    return names


def expand(name):
    """`a_{b,c}_d` -> [a_b_d, a_c_d] (one brace list)."""
    m = re.search(r"\{([^{}]*,[^{}]*)\}", name)
    if not m:
        return [name]
    out = []
    for choice in m.group(1).split(","):
        out.extend(expand(name[:m.start()] + choice.strip() + name[m.end():]))
    return out


def documented_metrics(text, problems):
    """{metric name: line}."""
    names = {}
    tables = [t for t in doclib.tables(text) if [c.lower() for c in t.header[:2]]
              == ["service", "metrics"]]
    if not tables:
        problems.append(f"{PAGE}: no table with the header | service | metrics |")
    for table in tables:
        for line, cells in table.rows:
            service = re.match(r"[a-z_]+", cells[0].strip())
            if not service:
                problems.append(f"{PAGE}:{line}: no service in the first column")
                continue
            for span in doclib.code_spans(doclib.without_parentheses(cells[1])):
                span = re.sub(r"\{[^{},]*\}$", "", span)  # the labels: name{reason}
                if not re.fullmatch(r"[a-z0-9_{},]+", span):
                    problems.append(f"{PAGE}:{line}: `{span}` is not a metric name")
                    continue
                for name in expand(span):
                    names.setdefault(f"shoal_{service.group(0)}_{name}", line)
    return names


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "..")
    problems = []
    registered = registered_metrics(root, problems)
    documented = documented_metrics(doclib.read(os.path.join(root, PAGE)), problems)
    for name, where in sorted(registered.items()):
        if name not in documented:
            problems.append(f"{PAGE}: {name} ({where}) is not in the table")
    for name, line in sorted(documented.items(), key=lambda x: x[1]):
        if name not in registered:
            problems.append(f"{PAGE}:{line}: {name} is documented, but no *metrics* file under "
                            f"{' or '.join(SOURCE_DIRS)} registers it")
    for p in problems:
        print(p)
    print(f"check_metrics: {len(registered)} metrics registered, {len(documented)} documented; "
          f"{len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
