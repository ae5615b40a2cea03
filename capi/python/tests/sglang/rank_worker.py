"""One SGLang rank in its own process, for the restart and multi-rank tests.

``python rank_worker.py SPEC_JSON``: builds the rank's device and host pools and SGLang's
HiCacheController with ``tutti.sglang`` attached, then runs the steps of the spec in order:

- ``exists``: ``batch_exists`` of the spec's keys, before anything else touched the pool;
- ``store``: the backup thread writes ``pages`` pages of the rank's data (seeded by ``seed``);
- ``store_extra``: the same for ``extra_pages`` pages under other keys;
- ``barrier``: prints ``READY`` and waits for a line on stdin (the test looks at tuttid);
- ``check``: the prefetch threads read the pages back; compared byte for byte with the data;
- ``exists_extra``: ``batch_exists`` of the extra keys.

Prints ``RESULT <json>`` with what each step saw (and which tutti package, library and binary it
used), and exits 0 unless something raised. ``TUTTI_TEST_INSTALLED=1``: the pip-installed package
on PYTHONPATH instead of the source tree.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # tests/: installed_package
# TUTTI_TEST_INSTALLED=1: the tutti package is the pip-installed one on PYTHONPATH
# (tests/installed_package.py); otherwise capi/python, the source tree.
if os.environ.get("TUTTI_TEST_INSTALLED") != "1":
    sys.path.insert(0, str(HERE.parents[1]))
sys.path.insert(0, str(HERE))
_venv = Path(sys.prefix)
os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(_venv / "torch-extensions"))
os.environ["PATH"] = f"{_venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"

import sglang_env as E  # noqa: E402

PAGE = 4
EXTRA_START = 50_000


def main() -> None:
    spec = json.loads(sys.argv[1])
    E.set_rank(spec["tp_rank"], spec["tp_size"])
    dev = E.device_pool(tokens=256)
    host = E.host_pool(dev, spec["layout"])
    ctl = E.controller(dev, host, spec["extra"])
    n, m = spec["pages"], spec.get("extra_pages", 0)
    toks = E.tokens_for(n, PAGE)
    extra_toks = E.tokens_for(m, PAGE, start=EXTRA_START)
    b = ctl.storage_backend
    out: dict = {"identity_salt": b.ranks}
    E.fill_random(host, spec["seed"])
    idx = host.alloc(n * PAGE)
    want = [E.page_bytes(host, int(idx[i * PAGE])) for i in range(n)]
    for step in spec["steps"]:
        if step == "exists":
            out["exists"] = b.batch_exists(E.hashes_for(toks, PAGE))
            b.clear()
        elif step == "store":
            out["stored"] = E.backup(ctl, idx, toks)
        elif step == "store_extra":
            eidx = host.alloc(m * PAGE)
            out["stored_extra"] = E.backup(ctl, eidx, extra_toks)
            host.free(eidx)
        elif step == "barrier":
            print("READY", flush=True)
            sys.stdin.readline()
        elif step == "check":
            host.free(idx)
            host.kv_buffer.zero_()
            hit, done, got = E.prefetch(ctl, toks)
            out["hit"], out["done"] = hit, done
            out["same"] = got is not None and [E.page_bytes(host, int(got[i * PAGE])) for i in range(n)] == want
        elif step == "exists_extra":
            out["exists_extra"] = b.batch_exists(E.hashes_for(extra_toks, PAGE))
            b.clear()
        else:
            raise ValueError(f"unknown step {step!r}")
    out["stats"] = {k: v for k, v in b.stats().items() if k != "runtime"}
    E.stop(ctl)
    from installed_package import report

    out["tutti_package"] = report()
    print("RESULT " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
