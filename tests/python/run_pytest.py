# SPDX-License-Identifier: MIT
"""Run pytest on the given arguments for ctest: exit 77 (skipped) when this
python3 has no pytest, or when every test it ran was skipped (a missing
numpy / torch, no GPU); else pytest's own exit status."""
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
rc = pytest.main(sys.argv[1:], plugins=[o])
if rc == 0 and o.passed == 0 and o.skipped:
    print("SKIP: every test skipped")
    sys.exit(77)
sys.exit(int(rc))
