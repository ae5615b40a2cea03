"""The slots of a C++ vtable in a shared library, read with binutils' readelf.

Each slot is named by the symbol its relocation points at: a named symbol (R_X86_64_64, as
for a default-visibility function) or, for a RELATIVE relocation (a hidden one), the function
symbol of .symtab at the addend's address. Pure virtual slots read '__cxa_pure_virtual'.
"""

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[4]


def _readelf(*args):
    return subprocess.run(["readelf", "-W", *args], check=True, capture_output=True, text=True).stdout


def symbols(path):
    """(name -> (value, size)) of every defined symbol, and (value -> name) of functions."""
    by_name, funcs = {}, {}
    for line in _readelf("-s", path).splitlines():
        f = line.split()
        if len(f) < 8 or not f[0].endswith(":") or f[6] == "UND":
            continue
        try:
            value, size = int(f[1], 16), int(f[2], 0)
        except ValueError:
            continue
        name = f[7].split("@")[0]
        by_name.setdefault(name, (value, size))
        if f[3] == "FUNC" and value:
            funcs.setdefault(value, name)
    return by_name, funcs


def vtable_slots(path, vtable_symbol):
    """The function slots of `vtable_symbol` (past the offset-to-top and typeinfo words)."""
    by_name, funcs = symbols(path)
    if vtable_symbol not in by_name:
        raise LookupError(f"{path} defines no {vtable_symbol}")
    start, size = by_name[vtable_symbol]
    slots = {}
    for line in _readelf("-r", path).splitlines():
        m = re.match(r"\s*([0-9a-f]+)\s+[0-9a-f]+\s+(R_X86_64_\w+)\s+(.*)$", line)
        if not m:
            continue
        off = int(m.group(1), 16)
        if not start + 16 <= off < start + size:
            continue
        kind, rest = m.group(2), m.group(3).split()
        if kind == "R_X86_64_RELATIVE":
            slots[off] = funcs.get(int(rest[0], 16), f"?{rest[0]}")
        else:
            slots[off] = rest[1].split("@")[0]
    return size, [slots.get(o, "?none") for o in range(start + 16, start + size, 8)]


def method_of(mangled):
    """The member function part of a mangled name, without its class: '_ZNK17nixlBackendEngine8
    queryMemE...' and '_ZNK15nixlPosixEngine8queryMemE...' both give 'K:8queryMemE...'.
    Destructors give 'D1'/'D0'."""
    m = re.match(r"_ZN(K?)(\d+)", mangled)
    if not m:
        return mangled
    n = int(m.group(2))
    rest = mangled[m.end() + n:]
    if rest.startswith("D2"):  # the base-object destructor is an alias of the complete one
        rest = "D1" + rest[2:]
    return f"{m.group(1)}:{rest}"
