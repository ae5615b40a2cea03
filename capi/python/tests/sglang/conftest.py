"""The SGLang backend's tests run with the Python of the venv ``scripts/setup-sglang`` makes
(``scripts/test-python`` runs them there), where the real ``sglang`` package imports.

With another Python nothing here is collected (a SKIP line says why); under ``CI=true`` that is
an error instead. ``scripts/test-python`` checks the venv first and says the same.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))  # capi/python: the tutti package
sys.path.insert(0, str(HERE))

# SGLang's page hashes come from a small C++ torch extension built on first use: it needs ninja
# (linked into the venv's bin by setup-sglang) and a writable build directory.
_venv = Path(sys.prefix)
os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(_venv / "torch-extensions"))
os.environ["PATH"] = f"{_venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"

try:
    import sglang  # noqa: F401
    import torch  # noqa: F401

    WHY_NOT = None
except ImportError as e:
    WHY_NOT = f"sglang is not importable with {sys.executable} ({e}); run scripts/setup-sglang"


if WHY_NOT is not None:
    if os.environ.get("CI") == "true":
        raise pytest.UsageError(f"the SGLang tests need real SGLang under CI=true: {WHY_NOT}")
    print(f"SKIP: {WHY_NOT}", file=sys.stderr)
collect_ignore_glob = [] if WHY_NOT is None else ["test_*.py"]


@pytest.fixture(scope="session")
def library():
    from tutti import _lib

    return _lib.lib()


@pytest.fixture
def pool_extra(tmp_path):
    """An in-process pool on two emulated RAM drives."""
    return {"interface_v1": 1, "emulated_drives": 2, "emulated_capacity_bytes": 16 << 20}
