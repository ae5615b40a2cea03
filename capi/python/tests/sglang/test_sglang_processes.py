"""Ranks as processes: a restart (the pool in files, a new process asks ``batch_exists`` first),
and two TP ranks, each its own process and its own client of one tuttid, storing the same
page keys with different bytes and reading back only their own. The two ranks run once with the
source tree and once with the package as pip installs it (tests/installed_package.py: the wheel
of this checkout, no TUTTI_LIB or TUTTI_BIN): its own libtutti, and its own ``tutti`` started as
the daemon."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import installed_package
from tutti._connector.shared import find_tutti_bin

HERE = Path(__file__).resolve().parent
WORKER = HERE / "rank_worker.py"
TIMEOUT = 240


def _spawn(spec: dict, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(WORKER), json.dumps(spec)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, env=env,
    )


@pytest.fixture(scope="session")
def installed_site(tmp_path_factory) -> Path:
    return installed_package.install(tmp_path_factory.mktemp("installed-tutti"))


def _result(p: subprocess.Popen, stdin: str = "") -> dict:
    out, err = p.communicate(stdin, timeout=TIMEOUT)
    line = [l for l in out.splitlines() if l.startswith("RESULT ")]
    assert p.returncode == 0 and line, f"rank worker failed ({p.returncode}):\n{out[-2000:]}\n{err[-4000:]}"
    return json.loads(line[-1][len("RESULT "):])


def _wait_ready(p: subprocess.Popen) -> None:
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        line = p.stdout.readline()
        if line.startswith("READY"):
            return
        if not line and p.poll() is not None:
            raise AssertionError(f"rank worker exited before READY: {p.stderr.read()[-4000:]}")
    raise AssertionError("rank worker not READY in time")


def spec(steps, *, extra, layout="page_first", tp_rank=0, tp_size=1, seed=1, pages=5, extra_pages=0) -> dict:
    return dict(steps=steps, extra=extra, layout=layout, tp_rank=tp_rank, tp_size=tp_size, seed=seed, pages=pages,
                extra_pages=extra_pages)


def test_batch_exists_is_right_after_a_restart(library, tmp_path):
    extra = {"interface_v1": 1, "emulated_drives": 2, "emulated_dir": str(tmp_path / "pool"),
             "emulated_capacity_bytes": 16 << 20}
    first = _result(_spawn(spec(["exists", "store"], extra=extra, layout="page_head", seed=4)))
    assert first["exists"] == 0 and first["stored"] == 5 * 4
    # A new process: its first call is batch_exists, then SGLang's prefetch reads every page back.
    second = _result(_spawn(spec(["exists", "check"], extra=extra, layout="page_head", seed=4)))
    assert second["exists"] == 5
    assert second["hit"] == second["done"] == 5 * 4 and second["same"] is True


@pytest.mark.parametrize("package", ["source", "installed"])
def test_two_tp_ranks_share_one_tuttid_and_read_only_their_own_shard(library, tmp_path, package, request):
    env = site = None
    if package == "installed":
        site = request.getfixturevalue("installed_site")
        env = installed_package.child_env(installed_package.environment(site))
    d = tmp_path / "pool"
    extra = {"interface_v1": 1, "emulated_drives": 2, "emulated_dir": str(d), "emulated_capacity_bytes": 16 << 20,
             "daemon_idle_exit_s": 2}  # TP 2 with emulated_dir: tuttid started on demand ("daemon": "auto")
    # Rank 1 also stores 3 pages under keys rank 0 never stores; both ask for them after the barrier.
    r0 = _spawn(spec(["store", "barrier", "check", "exists_extra"], extra=extra, tp_rank=0, tp_size=2, seed=100,
                     extra_pages=3), env)
    r1 = _spawn(spec(["store", "store_extra", "barrier", "check", "exists_extra"], extra=extra, tp_rank=1,
                     tp_size=2, seed=200, extra_pages=3), env)
    try:
        _wait_ready(r0)
        _wait_ready(r1)
        status = subprocess.run(
            [find_tutti_bin(), "status", "--socket", str(d / "tuttid.sock"), "--json"],
            capture_output=True, text=True, timeout=30,
        )
        assert status.returncode == 0, status.stderr
        st = json.loads(status.stdout)
        clients = {c["name"]: c for c in st["clients"]}
        daemon_exe = Path(os.readlink(f"/proc/{st['pid']}/exe")).resolve()
        assert "sglang-tp0-pp0" in clients and "sglang-tp1-pp0" in clients, sorted(clients)
        assert clients["sglang-tp0-pp0"]["pid"] == r0.pid and clients["sglang-tp1-pp0"]["pid"] == r1.pid
        res0, res1 = _result(r0, "go\n"), _result(r1, "go\n")
    finally:
        for p in (r0, r1):
            if p.poll() is None:
                p.kill()
                p.wait(timeout=30)
    # Both stored the same keys with different bytes; each read back its own.
    for res in (res0, res1):
        assert res["stored"] == 20 and res["hit"] == res["done"] == 20 and res["same"] is True
    # Rank 1's extra pages are in rank 1's shard only.
    assert res1["stored_extra"] == 12 and res1["exists_extra"] == 3
    assert res0["exists_extra"] == 0
    if site is not None:
        for res in (res0, res1):
            installed_package.check_used(res["tutti_package"], site)
        assert daemon_exe == (site / "bin" / "tutti").resolve(), "daemon 'auto' ran the installed tutti"
