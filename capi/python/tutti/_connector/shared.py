"""One runtime per pool per process, shared by the scheduler-side and worker-side connectors.

vLLM builds two connector instances: one in the scheduler, one per worker.
With one device and vLLM's in-process executor both live in the engine-core
process, and they share one runtime: the worker registers the KV memory and
moves bytes, the scheduler looks up prefixes in the same index.

With a daemon (``daemon_socket``, or ``daemon: "auto"``) the runtime of each
process is a client of tuttid, which owns the drives and the pool: the
scheduler process and every worker process connect on their own. A worker
moves its own bytes with its own executor (``gio_cuda``: its own I/O kernels
on its own GPU); a scheduler that has no worker of the same pool in its
process connects control-only (no queue pairs, no executor, no GPU context),
since it only looks up. ``auto``
starts ``tutti serve`` for an emulated pool kept in ``emulated_dir`` when none
answers on its socket: the first process to take ``.tuttid-start.lock`` in that
directory spawns it (detached, with ``--idle-exit-s``) and waits for it;
others wait for the socket. Every wait is bounded by ``daemon_start_timeout_s``.

A pool in files opened in-process has one owner process: the driver's owner
lock (a flock on the media and an ``.owner`` record) refuses a second one
with ``TUTTI_E_BUSY`` naming the holder.
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import subprocess
import threading
import time
from pathlib import Path

from ..errors import TuttiError
from ..runtime import Runtime
from .config import ConfigError, ConnectorConfig

log = logging.getLogger("tutti.vllm")

_lock = threading.Lock()
_runtimes: dict[tuple, list] = {}  # pool key -> [runtime, users]
# Cache identities registered by worker-side connectors of this process, by pool key:
# the scheduler side of the same process uses them when vLLM hands it no handshake.
_identities: dict[tuple, dict[tuple[int, int], tuple[str, bytes, str]]] = {}

START_LOCK = ".tuttid-start.lock"
DAEMON_LOG = "tuttid.log"


def _loaded_lib_dir() -> Path | None:
    """The directory of the libtutti this process loaded."""
    try:
        from .._lib import lib

        path = getattr(lib(), "path", None)
    except Exception:  # noqa: BLE001 - only a place to look
        return None
    return Path(path).parent if path and os.path.isabs(str(path)) else None


def find_tutti_bin() -> str:
    """The ``tutti`` binary: ``$TUTTI_BIN``, else next to libtutti (``$TUTTI_LIB``'s directory, or
    the library this process loaded), else on ``PATH``; a clear error naming every place looked."""
    looked = []
    explicit = os.environ.get("TUTTI_BIN")
    if explicit:
        if os.access(explicit, os.X_OK):
            return explicit
        looked.append(f"$TUTTI_BIN={explicit}")
    dirs = []
    if os.environ.get("TUTTI_LIB"):
        dirs.append(Path(os.environ["TUTTI_LIB"]).parent)
    loaded = _loaded_lib_dir()
    if loaded is not None:
        dirs.append(loaded)
    for d in dirs:
        cand = d / "tutti"
        if os.access(cand, os.X_OK):
            return str(cand)
        looked.append(str(cand))
    on_path = shutil.which("tutti")
    if on_path:
        return on_path
    looked.append("PATH")
    raise ConfigError(
        "TuttiConnector: daemon 'auto' needs the tutti binary to start tuttid, and it is not in "
        f"{', '.join(looked)}; set TUTTI_BIN (cargo build -p tutti-tools builds target/*/tutti)"
    )


def _serve_args(cfg: ConnectorConfig, exe: str, socket: str) -> list[str]:
    g = cfg.geometry
    args = [exe, "serve", "--json", "--socket", socket, "--dir", str(cfg.emulated_dir)]
    args += ["--emulated", str(cfg.emulated_drives), "--capacity-mib", str(cfg.emulated_capacity_bytes >> 20)]
    args += ["--layers", str(g.layers), "--kv-heads", str(g.kv_heads), "--head-dim", str(g.head_dim)]
    args += ["--block-tokens", str(g.tokens_per_block), "--dtype", g.dtype]
    args += ["--open", cfg.open_mode.replace("_", "-"), "--idle-exit-s", str(cfg.daemon_idle_exit_s)]
    if cfg.io_timeout_ms:
        args += ["--io-timeout-ms", str(cfg.io_timeout_ms)]
    for key, flag in (("emulated_read_bytes_per_sec", "--emu-read-gbps"),
                      ("emulated_write_bytes_per_sec", "--emu-write-gbps")):
        if getattr(cfg, key):
            args += [flag, repr(getattr(cfg, key) / 1e9)]
    for key, flag in (("emulated_latency_us", "--emu-latency-us"), ("emulated_read_latency_us", "--emu-read-latency-us"),
                      ("emulated_write_latency_us", "--emu-write-latency-us")):
        if getattr(cfg, key):
            args += [flag, str(getattr(cfg, key))]
    return args


def _log_tail(path: Path) -> str:
    try:
        text = path.read_text(errors="replace").strip()
    except OSError:
        return ""
    return text[-1500:]


def _spawn(cfg: ConnectorConfig, socket: str, deadline: float) -> None:
    """Starts ``tutti serve`` detached (its own session; its output appended to tuttid.log in
    the pool directory) and waits, bounded, until its socket exists or it exited."""
    exe = find_tutti_bin()
    d = Path(str(cfg.emulated_dir))
    logf = d / DAEMON_LOG
    args = _serve_args(cfg, exe, socket)
    log.info("tutti: starting tuttid for %s: %s", d, " ".join(args))
    # A shell starts the daemon in the background and exits at once, so the daemon is not
    # this process's child (nothing to reap, and it outlives this engine by its idle exit).
    sh = subprocess.run(
        ["/bin/sh", "-c", 'log="$1"; shift; "$@" </dev/null >>"$log" 2>&1 & echo $!', "sh", str(logf), *args],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True, timeout=30,
    )
    try:
        pid = int(sh.stdout.decode().strip())
    except ValueError:
        raise ConfigError(
            f"TuttiConnector: starting tuttid ({exe}) failed: {sh.stdout.decode(errors='replace')[-500:]}"
        ) from None
    args_note = f"tuttid (pid {pid}, {exe}, log {logf})"
    while time.monotonic() < deadline:
        if os.path.exists(socket):
            return
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            raise ConfigError(
                f"TuttiConnector: {args_note} exited before serving {socket}: {_log_tail(logf)}"
            ) from None
        time.sleep(0.05)
    raise ConfigError(f"TuttiConnector: {args_note} did not create {socket} in time: {_log_tail(logf)}")


def _connect(cfg: ConnectorConfig, socket: str, name: str, control: bool = False) -> Runtime:
    kw = dict(executor="control") if control else cfg.io_kwargs()
    return Runtime.connect(socket, cfg.geometry, client_name=name, **kw)


def _connect_auto(cfg: ConnectorConfig, name: str, control: bool = False) -> Runtime:
    socket = str(cfg.daemon_socket)
    d = Path(str(cfg.emulated_dir))
    d.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + cfg.daemon_start_timeout_s
    last: Exception | None = None
    while True:
        if os.path.exists(socket):
            try:
                return _connect(cfg, socket, name, control)
            except TuttiError as e:  # a daemon exiting, or a stale socket file
                last = e
        if time.monotonic() >= deadline:
            raise ConfigError(
                f"TuttiConnector: no tuttid answered on {socket} within {cfg.daemon_start_timeout_s:g} s "
                f"(daemon 'auto' for {d}): {last}; its log: {_log_tail(d / DAEMON_LOG) or '(empty)'}"
            )
        with open(d / START_LOCK, "a+") as lk:
            try:
                fcntl.flock(lk, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                lk.close()
                time.sleep(0.1)  # another process is starting it: wait for the socket
                continue
            try:
                try:
                    return _connect(cfg, socket, name, control)
                except TuttiError as e:
                    last = e
                try:
                    _spawn(cfg, socket, deadline)
                except ConfigError as e:
                    # A daemon that is still exiting holds the media: try again until the deadline.
                    last = e
                    time.sleep(0.5)
                    continue
                try:
                    return _connect(cfg, socket, name, control)
                except TuttiError as e:
                    last = e
            finally:
                fcntl.flock(lk, fcntl.LOCK_UN)
        time.sleep(0.1)


def client_name(role: str, tp_rank: int = 0, pp_rank: int = 0) -> str:
    return f"vllm-{role}-tp{tp_rank}-pp{pp_rank}-pid{os.getpid()}"


def _key(cfg: ConnectorConfig, rank: tuple[int, int]) -> tuple:
    # Through a daemon each rank is its own client (its own registration), even in one process.
    return cfg.pool_key() + (rank if cfg.uses_daemon else (0, 0),)


def acquire(cfg: ConnectorConfig, name: str = "vllm", rank: tuple[int, int] = (0, 0),
            control: bool = False) -> Runtime:
    """The runtime of ``cfg``'s pool for ``rank`` in this process, opened or connected on first use.
    ``control`` (the scheduler side): with a daemon, a runtime that only looks up will do: the rank's
    runtime if this process has one, else a control-only client."""
    key = _key(cfg, rank)
    with _lock:
        entry = _runtimes.get(key)
        if control and cfg.uses_daemon and (entry is None or entry[0].closed):
            key = cfg.pool_key() + ("control",)
            entry = _runtimes.get(key)
        else:
            control = False
        if entry is None or entry[0].closed:
            if cfg.daemon == "connect":
                rt = _connect(cfg, str(cfg.daemon_socket), name, control)
            elif cfg.daemon == "auto":
                rt = _connect_auto(cfg, name, control)
            else:
                rt = Runtime(cfg.geometry, **cfg.runtime_kwargs())
            entry = [rt, 0]
            _runtimes[key] = entry
        entry[1] += 1
        return entry[0]


def release(cfg: ConnectorConfig, runtime: Runtime, rank: tuple[int, int] = (0, 0)) -> None:
    """Drops one user; the last one closes the runtime (a daemon client disconnects)."""
    with _lock:
        key = next((k for k, e in _runtimes.items() if e[0] is runtime), None)
        if key is None:
            return
        entry = _runtimes[key]
        entry[1] -= 1
        if entry[1] > 0:
            return
        del _runtimes[key]
        if not any(k[:-1] == key[:-1] for k in _runtimes):
            _identities.pop(key[:-1], None)
    runtime.close()


def note_identity(cfg: ConnectorConfig, rank: tuple[int, int], identity: tuple[str, bytes, str]) -> None:
    with _lock:
        _identities.setdefault(cfg.pool_key(), {})[rank] = identity


def local_identities(cfg: ConnectorConfig) -> dict[tuple[int, int], tuple[str, bytes, str]]:
    with _lock:
        return dict(_identities.get(cfg.pool_key(), {}))
