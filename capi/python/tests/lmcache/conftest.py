"""The LMCache integration's tests run with the Python of the venv ``scripts/setup-lmcache``
makes (``scripts/test-python`` runs them there), where the real ``lmcache`` package (0.5.6)
imports.

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
os.environ["LMCACHE_TRACK_USAGE"] = "false"  # LMCache's usage telemetry off

try:
    import lmcache  # noqa: F401
    import torch  # noqa: F401

    WHY_NOT = None
except ImportError as e:
    WHY_NOT = f"lmcache is not importable with {sys.executable} ({e}); run scripts/setup-lmcache"


if WHY_NOT is not None:
    if os.environ.get("CI") == "true":
        raise pytest.UsageError(f"the LMCache tests need real LMCache under CI=true: {WHY_NOT}")
    print(f"SKIP: {WHY_NOT}", file=sys.stderr)
collect_ignore_glob = [] if WHY_NOT is None else ["test_*.py"]


@pytest.fixture(scope="session")
def library():
    from tutti import _lib

    return _lib.lib()


@pytest.fixture
def pool_params(library):
    """An in-process pool on two emulated RAM drives (small blocks and staging: many blocks per chunk)."""
    return {"emulated_drives": 2, "emulated_capacity_bytes": 32 << 20, "unit_bytes": 16384,
            "staging_bytes": 1 << 20, "max_chunk_bytes": 1 << 20}
