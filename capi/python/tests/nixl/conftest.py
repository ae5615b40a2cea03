"""Fixtures of the NIXL plugin's tests: the plugin built against TUTTI_LIB, a plugin directory for
the real NIXL agent, and `tutti serve`. These tests run with the NIXL venv's Python
(scripts/setup-nixl; scripts/test-python runs them); without nixl they skip, and fail under CI=true.
"""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[3]
sys.path.insert(0, str(HERE))

import nixl_tutti  # noqa: E402


def _unavailable(why: str):
    if os.environ.get("CI") == "true":
        pytest.fail(why)
    print(f"SKIP: {why}", file=sys.stderr)
    pytest.skip(why)


def _libtutti() -> Path:
    lib = os.environ.get("TUTTI_LIB")
    return Path(lib) if lib else REPO / "target" / "debug" / "libtutti.so"


_PLUGIN_DIR: Path | None = None
_PLUGIN_ERR: str | None = None


def _prepare() -> None:
    """Builds the plugin and lays out NIXL_PLUGIN_DIR once, before nixl is imported anywhere."""
    global _PLUGIN_DIR, _PLUGIN_ERR
    try:
        import nixl  # noqa: F401

        nixl_tutti.wheel_plugin_dir()  # the wheel's binaries (the ABI tests read its POSIX plugin)
    except Exception as e:  # ImportError, LookupError
        _PLUGIN_ERR = f"the NIXL wheel is not importable with {sys.executable} ({e}); run scripts/setup-nixl"
        return
    lib = _libtutti()
    if not lib.exists():
        _PLUGIN_ERR = f"libtutti is not at {lib} (cargo build -p tutti-capi, or set TUTTI_LIB)"
        return
    d = Path(tempfile.mkdtemp(prefix="tutti-nixl-plugins-"))
    atexit.register(shutil.rmtree, d, ignore_errors=True)
    r = subprocess.run([str(REPO / "scripts" / "build-nixl-plugin"), str(lib), str(d)], capture_output=True, text=True)
    if r.returncode != 0:
        _PLUGIN_ERR = f"scripts/build-nixl-plugin failed: {r.stdout}{r.stderr}"
        return
    nixl_tutti.setenv_plugin_dir(d)
    _PLUGIN_DIR = d


_prepare()


@pytest.fixture(scope="session")
def plugin_dir() -> Path:
    if _PLUGIN_DIR is None:
        _unavailable(_PLUGIN_ERR or "the NIXL plugin was not built")
    return _PLUGIN_DIR


@pytest.fixture(scope="session")
def tutti_bin() -> Path:
    explicit = os.environ.get("TUTTI_BIN")
    exe = Path(explicit) if explicit else _libtutti().parent / "tutti"
    if not exe.exists():
        _unavailable(f"the tutti binary is not at {exe} (cargo build -p tutti-tools, or set TUTTI_BIN)")
    return exe
