"""The tutti package as pip installs it, for tests that run an engine with it.

:func:`install` builds the wheel of this checkout (``pip wheel``: pip runs setuptools-rust, which
runs cargo in the workspace's target dir, so a build scripts/check-install or an earlier test made
is reused) and installs it with ``pip install --target`` into a directory. :func:`environment`
is what a child process changes to run that package and nothing of the checkout: the directory on
``PYTHONPATH``, ``TUTTI_TEST_INSTALLED=1`` (the test drivers then leave ``capi/python`` off
``sys.path``) and no ``TUTTI_LIB``/``TUTTI_BIN``. :func:`check_used` asserts a child reported
that package's module, library and binary.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


_INSTALLED: Path | None = None


def install(dest: Path) -> Path:
    """Builds and installs the package under ``dest``; returns the directory to put on PYTHONPATH.

    Once per pytest process: a later call returns the first call's directory (the checkout does not
    change during a run), so the real-vLLM tests and the README's quick-start share one wheel."""
    global _INSTALLED
    if _INSTALLED is not None and _INSTALLED.is_dir():
        return _INSTALLED
    _INSTALLED = _install(dest)
    return _INSTALLED


def _install(dest: Path) -> Path:
    wheels, site = dest / "wheel", dest / "site"
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    built = subprocess.run(pip + ["wheel", "--no-deps", "-q", "-w", str(wheels), str(REPO)], capture_output=True,
                           text=True, timeout=1800)
    assert built.returncode == 0, f"pip wheel {REPO} failed:\n{built.stdout[-3000:]}\n{built.stderr[-5000:]}"
    (whl,) = wheels.glob("tutti-*.whl")
    done = subprocess.run(pip + ["install", "--no-deps", "-q", "--target", str(site), str(whl)], capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return site


def environment(site: Path) -> dict:
    """What a child's environment changes to run the installed package and nothing of the checkout
    (a value of None removes the variable): apply it with :func:`child_env`."""
    return {"PYTHONPATH": str(site), "TUTTI_TEST_INSTALLED": "1", "TUTTI_LIB": None, "TUTTI_BIN": None}


def child_env(changes: dict, base: dict | None = None) -> dict:
    """``base`` (default: this process's environment) with ``changes`` applied (None removes)."""
    import os

    env = dict(os.environ if base is None else base)
    for k, v in changes.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = str(v)
    return env


def report() -> dict:
    """In the child: which tutti it imported, the library it loaded, the binary daemon 'auto' runs."""
    import tutti
    from tutti._connector.shared import find_tutti_bin
    from tutti._lib import lib

    out = {"module": tutti.__file__, "lib": str(lib().path)}
    try:
        out["bin"] = find_tutti_bin()
    except Exception as e:  # noqa: BLE001 - reported to the test
        out["bin"] = f"error: {e}"
    return out


def check_used(pkg: dict, site: Path) -> None:
    """``pkg`` (a child's :func:`report`) names the installed package's module, library and binary."""
    assert Path(pkg["module"]).resolve() == (site / "tutti" / "__init__.py").resolve(), pkg
    assert Path(pkg["lib"]).resolve() == (site / "tutti" / "libtutti.so").resolve(), pkg
    assert Path(pkg["bin"]).resolve() == (site / "bin" / "tutti").resolve(), pkg
