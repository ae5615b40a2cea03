"""The native half of the `tutti` Python package (metadata: pyproject.toml).

Two Rust artefacts of this workspace go into the wheel, built by cargo through
setuptools-rust (release profile, `--locked`; CARGO_TARGET_DIR is honoured, so a
checkout's target/ is reused):

* libtutti (crate tutti-capi, a cdylib loaded with ctypes) as ``tutti/libtutti.so``,
  where ``tutti/_lib.py`` looks first after ``$TUTTI_LIB``;
* the ``tutti`` command (crate tutti-tools) in the wheel's scripts, which pip installs
  into the environment's bin directory (on PATH in an activated venv), where
  ``tutti._connector.shared.find_tutti_bin`` finds it through the distribution's file list.

Neither links to libpython: the wheel is tagged ``py3-none-<platform>`` (any CPython 3,
no Python ABI), not with the building interpreter's ABI.
"""

import os
import shutil

from setuptools import setup
from setuptools.command.bdist_wheel import bdist_wheel
from setuptools.command.build_py import build_py
from setuptools_rust import Binding, RustBin, RustExtension, Strip
from setuptools_rust.build import build_rust

LOCKED = ["--locked"]


class BuildRust(build_rust):
    def get_dylib_ext_path(self, ext, target_fname):
        # setuptools-rust names a library like a Python extension module
        # (libtutti.cpython-311-x86_64-linux-gnu.so); ctypes loads it by its own name.
        path = super().get_dylib_ext_path(ext, target_fname)
        return os.path.join(os.path.dirname(path), "libtutti.so")


class BuildPy(build_py):
    def run(self):
        # build/lib outlives a build: a module deleted from the source would still ship from there.
        shutil.rmtree(os.path.join(self.build_lib, "tutti"), ignore_errors=True)
        super().run()


class BdistWheel(bdist_wheel):
    def get_tag(self):
        _, _, plat = super().get_tag()
        return "py3", "none", plat


setup(
    rust_extensions=[
        RustExtension(
            "tutti.libtutti",
            path="capi/Cargo.toml",
            binding=Binding.NoBinding,
            py_limited_api=False,
            cargo_manifest_args=LOCKED,
            strip=Strip.Debug,
        ),
        RustBin("tutti", path="tools/Cargo.toml", cargo_manifest_args=LOCKED, strip=Strip.Debug),
    ],
    cmdclass={"build_py": BuildPy, "build_rust": BuildRust, "bdist_wheel": BdistWheel},
    zip_safe=False,
)
