# SPDX-License-Identifier: MIT
"""examples/python/transfer.py: two processes move a block through a real
broker and the receiver checks the bytes."""
import os
import subprocess
import sys

from conftest import SRC


def run_example(broker, *args):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.path.join(SRC, "python")
    return subprocess.run(
        [sys.executable, os.path.join(SRC, "examples", "python", "transfer.py"), broker.sock, *args],
        capture_output=True, text=True, timeout=60, env=env)


def test_transfer_example(broker):
    r = run_example(broker)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "bytes match" in r.stdout
    s = broker.stats()
    assert s["transfers_done"] == 1 and s["bytes"] == 4 << 20
    assert s["descriptors_refused"] == 0


def test_transfer_example_odd_size(broker):
    r = run_example(broker, str(12345))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "moved 12345 bytes" in r.stdout


def test_transfer_example_no_broker(tmp_path):
    class Gone:
        sock = str(tmp_path / "none.sock")
    r = run_example(Gone)
    assert r.returncode != 0
    assert "kvb_attach" in r.stderr


def test_overhead_script(broker):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.path.join(SRC, "python")
    r = subprocess.run(
        [sys.executable, os.path.join(SRC, "examples", "python", "overhead.py"), broker.sock, "200"],
        capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    for what in ("round trip of one 64 B write", "list of Desc", "reused desc_array", "empty poll()"):
        assert what in r.stdout
    assert broker.stats()["descriptors_completed"] == 200 + 2 * 20 * 64
