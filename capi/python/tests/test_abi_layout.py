"""The ctypes declarations match capi/include/tutti.h: struct sizes, field offsets and constants.

A C program compiled against the header prints what the C compiler thinks;
any drift between the header and tutti/_lib.py fails here.
"""

from __future__ import annotations

import ctypes
import subprocess
import sys
from pathlib import Path

import pytest

from tutti import _lib
from conftest import has_cc

HEADER_DIR = Path(__file__).resolve().parents[2] / "include"

CONSTANTS = {
    "TUTTI_ABI_VERSION": _lib.ABI_VERSION,
    "TUTTI_ABI_MINOR": _lib.ABI_MINOR,
    **{f"TUTTI_DTYPE_{k.upper()}": v for k, v in _lib.DTYPE.items()},
    "TUTTI_DRIVES_EMULATED": _lib.DRIVES_EMULATED,
    "TUTTI_DRIVES_VFIO": _lib.DRIVES_VFIO,
    "TUTTI_EXECUTOR_GIO_HOST": _lib.EXECUTOR["gio"],
    "TUTTI_EXECUTOR_DIRECT": _lib.EXECUTOR["direct"],
    "TUTTI_OPEN_CREATE": _lib.OPEN_MODE["create"],
    "TUTTI_OPEN_EXISTING": _lib.OPEN_MODE["open"],
    "TUTTI_OPEN_OR_CREATE": _lib.OPEN_MODE["open_or_create"],
    "TUTTI_LAYOUT_VLLM_PER_LAYER": _lib.LAYOUT["vllm_per_layer"],
    "TUTTI_LAYOUT_CONTIGUOUS": _lib.LAYOUT["contiguous"],
    "TUTTI_LAYOUT_STRIDED": _lib.LAYOUT["strided"],
    "TUTTI_MEMORY_HOST": _lib.MEMORY_HOST,
    "TUTTI_MEMORY_CUDA": _lib.MEMORY_CUDA,
    "TUTTI_MEMORY_DEVICE_P2P": _lib.MEMORY_DEVICE_P2P,
    "TUTTI_DIR_LOAD": _lib.DIR_LOAD,
    "TUTTI_DIR_STORE": _lib.DIR_STORE,
    "TUTTI_LOOKUP_PIN": _lib.LOOKUP_PIN,
    **{f"TUTTI_RECONNECT_{k.upper()}": v for k, v in _lib.RECONNECT.items()},
    **{f"TUTTI_SCHED_{k.upper()}": v for k, v in _lib.SCHED_MODE.items()},
    **{f"TUTTI_BACKLOG_{k.upper()}": v for k, v in _lib.BACKLOG_FULL.items()},
    "TUTTI_SCHED_POLICY_ON": 0,
    "TUTTI_SCHED_POLICY_OFF_MODE": 1,
    "TUTTI_SCHED_POLICY_OFF_NO_TIMINGS": 2,
    "TUTTI_SCHED_POLICY_OFF_IDLE": 3,
}


def _program() -> str:
    lines = ["#include <stdio.h>", "#include <stddef.h>", '#include "tutti.h"', "int main(void) {"]
    for cname, cls in {**_lib.SIZED_STRUCTS, **_lib.PLAIN_STRUCTS}.items():
        lines.append(f'  printf("{cname} sizeof %zu\\n", sizeof({cname}));')
        for field, _ in cls._fields_:
            lines.append(f'  printf("{cname} {field} %zu\\n", offsetof({cname}, {field}));')
    for name in CONSTANTS:
        lines.append(f'  printf("const {name} %lld\\n", (long long)({name}));')
    lines += ["  return 0;", "}"]
    return "\n".join(lines)


@pytest.fixture(scope="module")
def c_layout(tmp_path_factory):
    cc = has_cc()
    if cc is None:
        print("SKIP: no C compiler to check tutti.h against the ctypes declarations", file=sys.stderr)
        pytest.skip("no C compiler")
    if not (HEADER_DIR / "tutti.h").exists():
        pytest.fail(f"{HEADER_DIR / 'tutti.h'} is missing")
    d = tmp_path_factory.mktemp("abi")
    (d / "layout.c").write_text(_program())
    subprocess.run([cc, "-std=c11", "-I", str(HEADER_DIR), "-o", str(d / "layout"), str(d / "layout.c")], check=True)
    out = subprocess.run([str(d / "layout")], check=True, capture_output=True, text=True).stdout
    seen = {}
    for line in out.splitlines():
        a, b, c = line.split()
        seen[(a, b)] = int(c)
    return seen


@pytest.mark.parametrize("cname", sorted({**_lib.SIZED_STRUCTS, **_lib.PLAIN_STRUCTS}))
def test_struct_matches_header(c_layout, cname):
    cls = {**_lib.SIZED_STRUCTS, **_lib.PLAIN_STRUCTS}[cname]
    assert ctypes.sizeof(cls) == c_layout[(cname, "sizeof")], f"sizeof({cname})"
    for field, _ in cls._fields_:
        assert getattr(cls, field).offset == c_layout[(cname, field)], f"offsetof({cname}, {field})"


def test_constants_match_header(c_layout):
    for name, value in CONSTANTS.items():
        assert c_layout[("const", name)] == value, name
