"""tutti's counters on vLLM's own ``/metrics``: vLLM's OpenAI server (the CPU build, tiny
random-weight Llama) bound to 127.0.0.1, the connector through a tuttid it starts
(``"daemon": "auto"``: the server runs the engine in a process of its own). A prompt is sent
twice; the second load comes from tutti, and ``vllm:tutti_*`` on the server's ``/metrics`` says
so, byte for byte against the pool's geometry as tuttid reports it.

Every wait is bounded; the server is stopped with SIGINT (then killed if it lingers) and the
tuttid it started exits on its own (``daemon_idle_exit_s``).
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from test_real_vllm import MODEL, vllm_python  # noqa: F401 - the fixture is used by name

HERE = Path(__file__).resolve().parent
BLOCK = 32
PROMPT = list(range(1, 151))  # 150 tokens: 4 whole 32-token blocks can come back


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, timeout: float = 10) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode()
    except OSError as e:
        return 0, str(e)


def _post(url: str, body: dict, timeout: float = 120) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def _sample(text: str, name: str) -> float | None:
    m = re.search(rf"^{re.escape(name)}\{{[^}}]*engine=\"0\"[^}}]*\}} (\S+)$", text, re.M)
    return float(m.group(1)) if m else None


def _tutti_bin() -> str:
    b = os.environ.get("TUTTI_BIN")
    if not b:
        pytest.fail("TUTTI_BIN is not set (scripts/test-python sets it: the connector starts tuttid)")
    return b


def test_the_connector_counters_appear_on_the_openai_servers_metrics(vllm_python, library, tmp_path):  # noqa: F811
    tutti_bin = _tutti_bin()
    pool = tmp_path / "pool"
    port = _free_port()
    kv = {
        "kv_connector": "TuttiConnector", "kv_connector_module_path": "tutti.vllm", "kv_role": "kv_both",
        "kv_connector_extra_config": {
            "emulated_drives": 2, "emulated_dir": str(pool), "emulated_capacity_bytes": 64 << 20,
            "daemon": "auto", "daemon_idle_exit_s": 3, "load_policy": "always",
        },
    }
    env = dict(os.environ)
    env.update({
        "PYTHONPATH": str(HERE.parent) + os.pathsep + env.get("PYTHONPATH", ""),
        "TUTTI_LIB": str(library.path), "TUTTI_BIN": tutti_bin,
        "VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": "1",
    })
    cmd = [
        vllm_python, "-m", "vllm.entrypoints.openai.api_server", "--model", MODEL, "--host", "127.0.0.1",
        "--port", str(port), "--skip-tokenizer-init", "--block-size", str(BLOCK), "--dtype", "float32",
        "--enforce-eager", "--max-model-len", "512", "--kv-cache-memory-bytes", str(32 << 20),
        "--no-enable-prefix-caching", "--max-num-seqs", "4", "--kv-transfer-config", json.dumps(kv),
    ]
    log = open(tmp_path / "server.log", "w")
    server = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"

    def tail() -> str:
        return (tmp_path / "server.log").read_text()[-6000:]

    try:
        deadline = time.monotonic() + 300
        while _get(f"{base}/health", timeout=5)[0] != 200:
            assert server.poll() is None, f"vLLM's server exited ({server.returncode}):\n{tail()}"
            assert time.monotonic() < deadline, f"vLLM's server was not healthy within 300 s:\n{tail()}"
            time.sleep(1)
        body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 2, "temperature": 0}
        first = _post(f"{base}/v1/completions", body)
        second = _post(f"{base}/v1/completions", body)
        assert first["choices"][0]["finish_reason"] == second["choices"][0]["finish_reason"] == "length"

        # The pool's geometry, as its daemon reports it: one block's bytes on the drives.
        st = subprocess.run([tutti_bin, "status", "--json", "--socket", str(pool / "tuttid.sock")],
                            capture_output=True, text=True, timeout=60)
        assert st.returncode == 0, st.stderr
        status = json.loads(st.stdout)
        g = status["geometry"]
        element = {"f32": 4, "f16": 2, "bf16": 2}[g["dtype"]]
        block_bytes = 2 * g["layers"] * g["tokens_per_block"] * g["kv_heads"] * g["head_dim"] * element
        hit_blocks = (len(PROMPT) - 1) // BLOCK
        names = sorted(c["name"].split("-pid")[0] for c in status["clients"])
        assert "vllm-worker-tp0-pp0" in names, status["clients"]

        # vLLM publishes the connector's stats with its scheduler stats: bounded wait for them.
        deadline = time.monotonic() + 60
        while True:
            code, text = _get(f"{base}/metrics")
            assert code == 200, text
            loaded = _sample(text, "vllm:tutti_bytes_loaded_total")
            if loaded:
                break
            assert time.monotonic() < deadline, "no vllm:tutti_bytes_loaded_total on /metrics:\n" + "\n".join(
                l for l in text.splitlines() if "tutti" in l)
            time.sleep(0.5)
        assert loaded == hit_blocks * block_bytes, (loaded, hit_blocks, block_bytes)
        assert _sample(text, "vllm:tutti_hit_tokens_total") == hit_blocks * BLOCK
        assert _sample(text, "vllm:tutti_bytes_stored_total") >= hit_blocks * block_bytes
        assert _sample(text, "vllm:tutti_loads_total") == 1
        assert _sample(text, "vllm:tutti_saves_total") >= 1
        assert _sample(text, "vllm:tutti_failed_blocks_total") == 0
        assert _sample(text, "vllm:tutti_load_seconds_total") > 0
        assert "# TYPE vllm:tutti_bytes_loaded_total counter" in text
    finally:
        if server.poll() is None:
            server.send_signal(signal.SIGINT)
            try:
                server.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
                server.wait(timeout=30)
        log.close()
    # The tuttid the connector started leaves once its clients are gone.
    pids = [json.loads(l)["pid"] for l in (pool / "tuttid.log").read_text().splitlines() if l.startswith("{")]
    deadline = time.monotonic() + 60
    while any(Path(f"/proc/{p}").exists() for p in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert pids and not any(Path(f"/proc/{p}").exists() for p in pids), f"tuttid {pids} still running"
    print(f"vLLM server log tail:\n{tail()[-1500:]}", file=sys.stderr)
