"""clients/python as shipped: its checked-in generated modules (shoal_client/_gen) match a fresh
run of clients/python/generate.sh over protos/, and `pip install --no-build-isolation --no-deps`
installs it offline into a scratch venv (--system-site-packages, for Debian's grpcio, protobuf
and numpy) in which `import shoal_client` works.

Usage: /usr/bin/python3 client_package_test.py SOURCE_DIR
"""

import filecmp
import os
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

SOURCE = os.path.abspath(sys.argv[1])
PACKAGE = os.path.join(SOURCE, "clients", "python")


def files(root):
    """Relative paths of the files under root, __pycache__ left out."""
    found = set()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        found.update(os.path.relpath(os.path.join(dirpath, f), root) for f in filenames)
    return found


class ClientPackageTest(unittest.TestCase):
    def test_generated_modules_match_the_protos(self):
        checked_in = os.path.join(PACKAGE, "shoal_client", "_gen")
        with tempfile.TemporaryDirectory() as fresh:
            subprocess.run([os.path.join(PACKAGE, "generate.sh"), fresh], check=True)
            self.assertEqual(files(checked_in), files(fresh))
            stale = [f for f in sorted(files(fresh))
                     if not filecmp.cmp(os.path.join(fresh, f), os.path.join(checked_in, f),
                                        shallow=False)]
            self.assertEqual(stale, [], "run clients/python/generate.sh and commit the result")

    def test_installs_offline_and_imports(self):
        # As the README installs it: a venv that sees Debian's packages (bookworm's own Python
        # is externally managed, PEP 668), pip without build isolation and without downloads.
        with tempfile.TemporaryDirectory() as scratch:
            # A copy, so the build leaves nothing (build/, *.egg-info) in the checkout. The
            # venv runs Debian's pip from the system site (no copy of pip: quicker).
            source = shutil.copytree(PACKAGE, os.path.join(scratch, "src"),
                                     ignore=shutil.ignore_patterns("__pycache__", "build",
                                                                   "*.egg-info"))
            venv = os.path.join(scratch, "venv")
            subprocess.run([sys.executable, "-m", "venv", "--system-site-packages",
                            "--without-pip", venv], check=True)
            python = os.path.join(venv, "bin", "python")
            subprocess.run([python, "-m", "pip", "install", "--quiet", "--no-index",
                            "--disable-pip-version-check", "--no-build-isolation", "--no-deps",
                            source], check=True)
            code = ("import shoal_client, sys; "
                    "assert shoal_client.__file__.startswith(sys.argv[1]), shoal_client.__file__; "
                    "text, _ = shoal_client.task_file_text({'name': 'x'}); "
                    "assert text == '{\"name\": \"x\"}', text")
            subprocess.run([python, "-c", code, venv], check=True, cwd=scratch)

if __name__ == "__main__":
    start = time.monotonic()
    result = unittest.main(argv=[sys.argv[0], "-v"], exit=False).result
    print(f"client_package_test: {time.monotonic() - start:.1f} s")
    sys.exit(0 if result.wasSuccessful() else 1)
