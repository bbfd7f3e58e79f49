# SPDX-License-Identifier: MIT
"""Finding libkvbroker ($KVBROKER_LIB, the package's own prefix, the system
loader; an error naming every place tried) and installing the package:
`cmake --install` into a prefix and `pip install ./python`, each then
moving bytes through a broker. Each case runs in a fresh python3 (the
library is loaded once per process)."""
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile

import pytest

from conftest import SRC

LIB = os.environ.get("KVBROKER_LIB", "")
BUILD = os.environ.get("KVB_BUILD_DIR", "")
PY = os.environ.get("KVB_TEST_PYTHON") or sys.executable

# attach, move 64 KiB through the broker at argv[1], print where the library came from
PROBE = r"""
import sys, kvbroker
print("LIB", kvbroker.library_path())
if len(sys.argv) > 1:
    with kvbroker.Client(sys.argv[1]) as c:
        a, b = c.alloc(65536), c.alloc(65536)
        a.buffer[:] = bytes(range(256)) * 256
        h = c.open("tx-probe")
        c.submit_write([kvbroker.Desc(transfer=h, region=a.id, peer_region=b.id, len=65536, tag=1)])
        c.seal(h, 1, tag=2)
        assert all(x.ok for x in c.wait_min(2, timeout_ms=10000))
        assert bytes(b.buffer) == bytes(a.buffer)
        print("MOVED")
"""


def system_has_lib() -> bool:
    r = subprocess.run([PY, "-c", "import ctypes; ctypes.CDLL('libkvbroker.so.0')"],
                       capture_output=True, env={"PATH": os.environ.get("PATH", "")})
    return r.returncode == 0


def probe(pythonpath, env_lib=None, *args):
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": pythonpath,
           "PYTHONDONTWRITEBYTECODE": "1"}
    if env_lib is not None:
        env["KVBROKER_LIB"] = env_lib
    return subprocess.run([PY, "-c", PROBE, *args], capture_output=True, text=True,
                          timeout=60, env=env)


@pytest.fixture
def tmp():
    d = tempfile.mkdtemp(prefix="kvbp-lib-", dir="/tmp")
    yield d
    shutil.rmtree(d, ignore_errors=True)


def need_lib():
    if not LIB or not os.path.exists(LIB):
        pytest.skip("KVBROKER_LIB names no built library")


def test_env_file(broker):
    need_lib()
    r = probe(os.path.join(SRC, "python"), LIB, broker.sock)
    assert r.returncode == 0, r.stderr
    assert f"LIB {LIB}" in r.stdout and "MOVED" in r.stdout


def test_env_directory():
    need_lib()
    d = os.path.dirname(LIB)
    r = probe(os.path.join(SRC, "python"), d)
    assert r.returncode == 0, r.stderr
    assert f"LIB {os.path.join(d, 'libkvbroker.so.0')}" in r.stdout


def test_not_found_lists_every_place(tmp):
    if system_has_lib():
        pytest.skip("a libkvbroker is installed system-wide: the lookup would find it")
    bogus = os.path.join(tmp, "nothere.so")
    r = probe(os.path.join(SRC, "python"), bogus, "/nonexistent.sock")
    assert r.returncode != 0
    assert "LibraryNotFound" in r.stderr
    assert f"{bogus} ($KVBROKER_LIB): no such file" in r.stderr
    assert "libkvbroker.so.0 (system loader)" in r.stderr
    assert "libkvbroker.so (system loader)" in r.stderr
    assert "set KVBROKER_LIB" in r.stderr


def test_not_a_library(tmp):
    if system_has_lib():
        pytest.skip("a libkvbroker is installed system-wide: the lookup would find it")
    junk = os.path.join(tmp, "libjunk.so")
    with open(junk, "w") as f:
        f.write("not an ELF file\n" * 256)
    r = probe(os.path.join(SRC, "python"), junk)
    assert r.returncode != 0
    assert f"{junk} ($KVBROKER_LIB):" in r.stderr and "invalid ELF header" in r.stderr
    # another shared library: loads, but has no kvb_* functions
    libm = None
    for d in ("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64", "/usr/lib"):
        if os.path.exists(os.path.join(d, "libm.so.6")):
            libm = os.path.join(d, "libm.so.6")
            break
    if libm:
        r = probe(os.path.join(SRC, "python"), libm)
        assert r.returncode != 0
        assert "not libkvbroker (no kvb_default_socket" in r.stderr


@pytest.mark.parametrize("libdir", ["lib", "multiarch", "lib64"])
def test_package_prefix(tmp, broker, libdir):
    """A package in <prefix>/lib/python3/dist-packages finds <prefix>/<libdir>."""
    need_lib()
    if libdir == "multiarch":
        ma = sysconfig.get_config_var("MULTIARCH")
        if not ma:
            pytest.skip("this python has no MULTIARCH")
        libdir = os.path.join("lib", ma)
    prefix = os.path.join(tmp, "prefix")
    site = os.path.join(prefix, "lib", "python3", "dist-packages")
    shutil.copytree(os.path.join(SRC, "python", "kvbroker"), os.path.join(site, "kvbroker"),
                    ignore=shutil.ignore_patterns("__pycache__"))
    os.makedirs(os.path.join(prefix, libdir), exist_ok=True)
    shutil.copy(os.path.realpath(LIB), os.path.join(prefix, libdir, "libkvbroker.so.0"))
    r = probe(site, None, broker.sock)
    assert r.returncode == 0, r.stderr
    assert f"LIB {os.path.join(prefix, libdir, 'libkvbroker.so.0')}" in r.stdout
    assert "MOVED" in r.stdout


def test_cmake_install(tmp):
    """`cmake --install` puts package, library and broker under one prefix:
    the installed package finds the installed library by itself."""
    if not BUILD or not shutil.which("cmake"):
        pytest.skip("no build directory or cmake")
    prefix = os.path.join(tmp, "p")
    r = subprocess.run(["cmake", "--install", BUILD, "--prefix", prefix],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    inits = [os.path.join(d, "__init__.py") for d, _, f in os.walk(prefix)
             if d.endswith(os.sep + "kvbroker") and "__init__.py" in f]
    assert len(inits) == 1, inits
    site = os.path.dirname(os.path.dirname(inits[0]))
    assert site.startswith(os.path.join(prefix, "lib", "python3"))
    assert site.endswith("dist-packages")
    for f in ("_lib.py", "client.py", "errors.py", "types.py", "py.typed"):
        assert os.path.exists(os.path.join(site, "kvbroker", f)), f
    sock = os.path.join(tmp, "b.sock")
    log = open(os.path.join(tmp, "broker.log"), "wb")
    bp = subprocess.Popen([os.path.join(prefix, "bin", "kvbroker"), "--socket", sock],
                          stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        for _ in range(400):
            if os.path.exists(sock):
                break
            bp.poll()
            assert bp.returncode is None, open(log.name).read()
            import time
            time.sleep(0.025)
        r = probe(site, None, sock)
        assert r.returncode == 0, r.stderr
        assert r.stdout.split("\n")[0].startswith(f"LIB {prefix}{os.sep}lib")
        assert "MOVED" in r.stdout
    finally:
        bp.terminate()
        bp.wait(10)
        log.close()


def test_pip_install(tmp, broker):
    """`pip install --no-build-isolation --no-deps ./python` works offline
    (setuptools only); the installed package runs with $KVBROKER_LIB."""
    need_lib()
    if subprocess.run([PY, "-m", "pip", "--version"], capture_output=True).returncode:
        pytest.skip(f"{PY} has no pip")
    if subprocess.run([PY, "-c", "import setuptools"], capture_output=True).returncode:
        pytest.skip(f"{PY} has no setuptools")
    src = os.path.join(tmp, "src")  # a copy: the build writes next to the sources
    shutil.copytree(os.path.join(SRC, "python"), src,
                    ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info"))
    target = os.path.join(tmp, "target")
    env = dict(os.environ, PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1",
               PIP_NO_CACHE_DIR="1")
    r = subprocess.run([PY, "-m", "pip", "install", "--no-build-isolation", "--no-deps",
                        "--target", target, src],
                       capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert os.path.exists(os.path.join(target, "kvbroker", "py.typed"))
    r = probe(target, LIB, broker.sock)
    assert r.returncode == 0, r.stderr
    assert "MOVED" in r.stdout


def test_python39_syntax():
    """The binding's own modules parse as Python 3.9 (its floor)."""
    import ast
    pkg = os.path.join(SRC, "python", "kvbroker")
    for f in ("__init__.py", "_lib.py", "client.py", "errors.py", "types.py"):
        with open(os.path.join(pkg, f)) as fh:
            ast.parse(fh.read(), filename=f, feature_version=(3, 9))
