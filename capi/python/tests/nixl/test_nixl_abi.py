"""capi/nixl/nixl_abi.h declares NIXL's plugin interface ourselves; these tests hold those
declarations to the installed wheel's binaries, so a NIXL upgrade that changes the interface fails
here instead of crashing an agent: the vtable the plugin emits for nixlBackendEngine and for its
engine must match, slot by slot (the member function and its mangled parameter types, or a pure
virtual), and in size, the ones in the wheel's own libplugin_POSIX.so."""

from __future__ import annotations

import ctypes

import pytest

import elf_vtable as ev
import nixl_tutti as nt

BASE = "_ZTV17nixlBackendEngine"


def _methods(path, symbol):
    size, slots = ev.vtable_slots(path, symbol)
    return size, [ev.method_of(s) for s in slots]


def test_the_base_vtable_matches_the_wheels(plugin_dir):
    posix = nt.wheel_plugin_dir() / "libplugin_POSIX.so"
    ours = plugin_dir / "libplugin_TUTTI.so"
    want, got = _methods(posix, BASE), _methods(ours, BASE)
    assert got == want
    # 2 destructors, 13 pure virtuals, 12 with defaults, past the offset and typeinfo words.
    assert want[0] == 8 * (2 + 27)
    assert want[1][2:15] == ["__cxa_pure_virtual"] * 13


def test_the_engines_vtable_matches_the_posix_engines(plugin_dir):
    posix = nt.wheel_plugin_dir() / "libplugin_POSIX.so"
    ours = plugin_dir / "libplugin_TUTTI.so"
    size_p, want = _methods(posix, "_ZTV15nixlPosixEngine")
    size_o, got = _methods(ours, "_ZTV15tuttiNixlEngine")
    assert size_o == size_p
    assert got == want
    assert "__cxa_pure_virtual" not in got
    # Our overrides really are ours (not the base's default) where the backend needs them.
    _, names = ev.vtable_slots(ours, "_ZTV15tuttiNixlEngine")
    for m in ("8postXfer", "9checkXfer", "11loadLocalMD", "8queryMem"):
        assert any(m in n and "tuttiNixlEngine" in n for n in names), m


def test_the_comparison_sees_a_moved_or_retyped_virtual(plugin_dir):
    """The check above is not vacuous: a swapped pair of slots, or a slot whose parameter types
    differ, compares unequal (here on the wheel's real slot list)."""
    _, want = _methods(nt.wheel_plugin_dir() / "libplugin_POSIX.so", "_ZTV15nixlPosixEngine")
    swapped = list(want)
    swapped[10], swapped[11] = swapped[11], swapped[10]
    assert swapped != want
    retyped = [s.replace("12nixlMetaDesc", "13nixlOtherDesc") for s in want]
    assert retyped != want
    assert ev.method_of("_ZNK15nixlPosixEngine8queryMemEv") == ev.method_of("_ZNK15tuttiNixlEngine8queryMemEv")


def test_the_plugin_entry_point_speaks_api_version_1(plugin_dir):
    lib = ctypes.CDLL(str(plugin_dir / "libplugin_TUTTI.so"))
    lib.nixl_plugin_init.restype = ctypes.POINTER(ctypes.c_int)
    p = lib.nixl_plugin_init()
    assert p and p[0] == 1  # nixlBackendPlugin::api_version, its first member


@pytest.mark.parametrize("symbol", ["nixl_plugin_init", "nixl_plugin_fini"])
def test_only_the_entry_points_are_exported(plugin_dir, symbol):
    by_name, _ = ev.symbols(plugin_dir / "libplugin_TUTTI.so")
    assert symbol in by_name
    import subprocess

    dyn = subprocess.run(["readelf", "-W", "--dyn-syms", str(plugin_dir / "libplugin_TUTTI.so")],
                         capture_output=True, text=True, check=True).stdout
    exported = {ln.split()[7] for ln in dyn.splitlines()
                if len(ln.split()) >= 8 and ln.split()[6] != "UND" and ln.split()[4] in ("GLOBAL", "WEAK")}
    assert exported <= {"nixl_plugin_init", "nixl_plugin_fini"}, exported


def test_a_plugin_built_from_a_changed_declaration_fails_the_check(plugin_dir, tmp_path):
    """The negative control: the same plugin source compiled against a copy of nixl_abi.h whose
    checkXfer and releaseReqH trade places (a reordered interface) emits a vtable the check
    rejects, while the real header's passes (the tests above)."""
    import shutil
    import subprocess

    src = ev.REPO / "capi" / "nixl"
    for f in ("tutti_nixl.cpp", "params.h"):
        shutil.copy(src / f, tmp_path / f)
    hdr = (src / "nixl_abi.h").read_text()
    check = "    virtual nixl_status_t checkXfer(nixlBackendReqH *handle) const = 0;\n"
    release = "    virtual nixl_status_t releaseReqH(nixlBackendReqH *handle) const = 0;\n"
    assert check + release in hdr
    (tmp_path / "nixl_abi.h").write_text(hdr.replace(check + release, release + check))
    so = tmp_path / "libplugin_CHANGED.so"
    subprocess.run(["g++", "-std=c++17", "-O0", "-fPIC", "-shared", "-fvisibility=hidden",
                    f"-I{ev.REPO / 'capi' / 'include'}", str(tmp_path / "tutti_nixl.cpp"), "-o", str(so)],
                   check=True, capture_output=True, text=True)
    _, want = _methods(nt.wheel_plugin_dir() / "libplugin_POSIX.so", "_ZTV15nixlPosixEngine")
    _, got = _methods(so, "_ZTV15tuttiNixlEngine")
    assert got != want
    assert [i for i, (g, w) in enumerate(zip(got, want)) if g != w] == [13, 14]
