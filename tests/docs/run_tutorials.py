#!/usr/bin/env python3
"""Runs the command blocks of docs/tutorials/*.md that are marked runnable.

Usage: run_tutorials.py REPO_ROOT BIN_DIR [--list] [--keep]

A fenced block whose line above is exactly `<!-- runnable -->` (invisible on GitHub) is run,
saved to a file first: ```sh (or bash) blocks with `bash -euo pipefail`, ```python blocks with
/usr/bin/python3. The blocks of one page run in order, in one scratch directory of their own,
as a reader would run them from the clone:
- the working directory holds a copy of deploy/ and build/bin, a link to BIN_DIR (BIN_DIR is on
  PATH too); nothing else of the clone, and the source tree is never written;
- HOME and TMPDIR are empty directories of the run (write a reader's scratch files under ~);
- a block may name no address but 127.0.0.1 (checked before anything runs).
A block that exits non-zero or runs past BLOCK_TIMEOUT fails the run: its page and line, the
block and the tail of its output are printed, and the scratch directory is kept. Blocks that
train for minutes stay unmarked: the marked ones together are meant to take well under a
minute. --list prints the runnable blocks without running them; --keep keeps every scratch
directory. Standard library only.
"""

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import doclib  # noqa: E402

MARKER = "<!-- runnable -->"
PAGES = "docs/tutorials"
BLOCK_TIMEOUT = 180  # seconds
LANGUAGES = {"sh": "bash", "bash": "bash", "python": "python"}
ADDRESS = re.compile(r"\b\d{1,3}(?:\.\d{1,3}){3}\b|\blocalhost\b|\[::\d*\]|https?://")
OUTPUT_TAIL = 60  # lines


def runnable_blocks(root, problems):
    """{page: [Block]} of the marked blocks, after checking the markers and the addresses."""
    out = {}
    for name in sorted(os.listdir(os.path.join(root, PAGES))):
        if not name.endswith(".md"):
            continue
        page = os.path.join(PAGES, name)
        text = doclib.read(os.path.join(root, page))
        lines = text.split("\n")
        blocks = doclib.blocks(text)
        fences = {b.line for b in blocks}
        for number, line in enumerate(lines, 1):
            stripped = line.strip()
            if "runnable" in stripped and stripped.startswith("<!--") and stripped != MARKER:
                problems.append(f"{page}:{number}: write the marker exactly as {MARKER}")
            if stripped == MARKER and number + 1 not in fences:
                problems.append(f"{page}:{number}: {MARKER} must be the line just above a "
                                "``` fence")
        for block in blocks:
            if block.before != MARKER:
                continue
            where = f"{page}:{block.line}"
            if block.info not in LANGUAGES:
                problems.append(f"{where}: a runnable block must be ```sh, ```bash or ```python, "
                                f"not ```{block.info}")
                continue
            for m in ADDRESS.finditer(block.text):
                if m.group(0) != "127.0.0.1":
                    problems.append(f"{where}: a runnable block may address 127.0.0.1 only, "
                                    f"not {m.group(0)!r}")
            out.setdefault(page, []).append(block)
    return out


def scratch_for(root, bin_dir, page):
    """A fresh scratch directory laid out like a clone with a build: (dir, cwd, env)."""
    scratch = tempfile.mkdtemp(prefix="shoal-tutorial-" + os.path.basename(page)[:-3] + "-")
    cwd = os.path.join(scratch, "clone")
    shutil.copytree(os.path.join(root, "deploy"), os.path.join(cwd, "deploy"),
                    ignore=shutil.ignore_patterns("*.pt", "__pycache__"))
    os.makedirs(os.path.join(cwd, "build"))
    os.symlink(os.path.abspath(bin_dir), os.path.join(cwd, "build", "bin"))
    for d in ("home", "tmp"):
        os.makedirs(os.path.join(scratch, d))
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("SHOAL_") and k.lower() not in ("http_proxy", "https_proxy")}
    env.update({
        "HOME": os.path.join(scratch, "home"),
        "TMPDIR": os.path.join(scratch, "tmp"),
        "PATH": os.path.abspath(bin_dir) + os.pathsep + os.environ.get("PATH", "/usr/bin:/bin"),
        "no_proxy": "127.0.0.1",
    })
    return scratch, cwd, env


def run_block(block, scratch, cwd, env):
    """(exit code or None on timeout, output, seconds)."""
    # From a file, as a reader would save it (TorchScript reads a scripted class's source).
    script = os.path.join(scratch, f"block-{block.line}.{LANGUAGES[block.info]}")
    with open(script, "w", encoding="utf-8") as f:
        f.write(block.text)
    if LANGUAGES[block.info] == "bash":
        argv = ["bash", "-euo", "pipefail", script]
    else:
        python = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
        argv = [python, script]
    start = time.monotonic()
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=BLOCK_TIMEOUT)
        code = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        code = None
    # Whatever the block left running in its session (it started it; nothing else is there).
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    return code, output, time.monotonic() - start


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    flags = {a for a in sys.argv[1:] if a.startswith("--")}
    if len(args) != 2 or flags - {"--list", "--keep"}:
        print(__doc__.strip().split("\n")[2], file=sys.stderr)
        return 2
    root, bin_dir = args
    problems = []
    pages = runnable_blocks(root, problems)
    if not pages:
        problems.append(f"no runnable block in {PAGES}/*.md (the marker is {MARKER})")
    for p in problems:
        print(p)
    if problems:
        return 1
    if "--list" in flags:
        for page, blocks in pages.items():
            for block in blocks:
                print(f"--- {page}:{block.line} ({block.info})\n{block.text}", end="")
        return 0
    for tool in ("shoalctl",):
        if not os.access(os.path.join(bin_dir, tool), os.X_OK):
            print(f"{bin_dir}/{tool}: not found (build first)")
            return 1

    total = 0.0
    count = 0
    for page, blocks in pages.items():
        scratch, cwd, env = scratch_for(root, bin_dir, page)
        failed = False
        for block in blocks:
            code, output, seconds = run_block(block, scratch, cwd, env)
            total += seconds
            count += 1
            first = block.body[0].strip() if block.body else ""
            print(f"{page}:{block.line}: {seconds:5.1f} s  {first}"
                  + (" ..." if len(block.body) > 1 else ""))
            if code != 0:
                why = f"ran past {BLOCK_TIMEOUT} s" if code is None else f"exit code {code}"
                tail = output.rstrip("\n").split("\n")[-OUTPUT_TAIL:]
                print(f"FAILED {page}:{block.line}: {why}\n--- the block:\n{block.text}"
                      f"--- its output (last {OUTPUT_TAIL} lines):\n" + "\n".join(tail))
                print(f"--- kept {scratch} (the clone copy, home/ and tmp/)")
                failed = True
                break
        if failed:
            return 1
        if "--keep" in flags:
            print(f"kept {scratch}")
        else:
            shutil.rmtree(scratch, ignore_errors=True)
    print(f"run_tutorials: {count} runnable block(s) of {len(pages)} tutorial(s) passed in "
          f"{total:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
