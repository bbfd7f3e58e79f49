# SPDX-License-Identifier: MIT
"""Run pytest on the given arguments for ctest: exit 77 (skipped) when this
python3 has no pytest, or when every test it ran was skipped (a missing
numpy / torch, no GPU); else pytest's own exit status. A test that runs
longer than 150 s dumps every thread's stack (faulthandler_timeout)."""
import sys

try:
    import pytest
except ImportError:
    print(f"SKIP: {sys.executable} has no pytest (Debian: python3-pytest)")
    sys.exit(77)


class Outcomes:
    def __init__(self):
        self.passed = 0
        self.skipped = 0

    def pytest_runtest_logreport(self, report):
        if report.when == "call" and report.passed:
            self.passed += 1
        elif report.skipped:
            self.skipped += 1


o = Outcomes()
args = sys.argv[1:]
if not any("faulthandler_timeout" in a for a in args):
    # a test that runs past this dumps every thread's stack to stderr (in
    # ctest's log), so a hang says where it is
    args = ["-o", "faulthandler_timeout=150"] + args
rc = pytest.main(args, plugins=[o])
if rc == 0 and o.passed == 0 and o.skipped:
    print("SKIP: every test skipped")
    sys.exit(77)
sys.exit(int(rc))
