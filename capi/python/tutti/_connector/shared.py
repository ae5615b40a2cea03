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
A daemon that exits before serving is started again only when its error says the media
or the socket are still held (a daemon of the same directory still exiting, or one too busy to
answer); any other start-up error
(a pool of another geometry, bad flags) comes back at once as the headline, quoted in
whole lines of its log, with the fix.

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

from ..errors import Busy, IoError, Timeout, TuttiError
from ..runtime import Geometry, Runtime
from .config import ConfigError, ConnectorConfig

# A child of vLLM's "vllm" logger: vLLM's handler prints it (level VLLM_LOGGING_LEVEL, INFO by default).
log = logging.getLogger("vllm.tutti")

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
    installed = installed_tutti_bin()
    if installed is not None:
        return str(installed)
    looked.append("the scripts of an installed tutti package")
    on_path = shutil.which("tutti")
    if on_path:
        return on_path
    looked.append("PATH")
    raise ConfigError(
        "TuttiConnector: daemon 'auto' needs the tutti binary to start tuttid, and it is not in "
        f"{', '.join(looked)}; set TUTTI_BIN (cargo build -p tutti-tools builds target/*/tutti), or "
        "pip install the tutti package (it installs the binary)"
    )


def installed_tutti_bin() -> Path | None:
    """The ``tutti`` command that ``pip install`` put beside this package: a wheel's script goes to the
    environment's bin directory, listed in the distribution's RECORD (``pip install --target DIR``
    puts it in ``DIR/bin``, and its RECORD entry does not point there, so that place is looked at
    too). Only the distribution this very package was installed from counts: a source checkout on
    ``sys.path`` beside an unrelated install does not pick up that install's binary."""
    try:
        from importlib import metadata

        dist = metadata.distribution("tutti")
        here = Path(__file__).resolve().parents[1]
        if Path(str(dist.locate_file("tutti"))).resolve() != here:
            return None
        cands = [Path(str(dist.locate_file(f))) for f in dist.files or () if f.name == "tutti" and f.parts[0] != "tutti"]
        cands.append(here.parent / "bin" / "tutti")
    except Exception:  # noqa: BLE001 - no metadata (a source checkout): only a place to look
        return None
    for cand in cands:
        cand = cand.resolve()
        if cand.parent.name == "bin" and cand.is_file() and os.access(cand, os.X_OK):
            return cand
    return None


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


# What a daemon prints when it lost the race for the media to a daemon of the same directory
# that is still exiting (the driver's owner lock), or found a live tuttid on its socket (one too
# busy to answer the connect in time): the start-up failures a retry (or a connect) can cure.
_MEDIA_HELD = "already in use"
_SOCKET_HELD = "in use by a live tuttid"
_LOG_READ_MAX = 64 << 10
_LOG_LINES = 20
_LINE_MAX = 2000


def _log_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def log_lines(path: Path, start: int = 0, limit: int = _LOG_LINES) -> list[str]:
    """The last ``limit`` non-empty lines of the log at ``path`` from byte ``start`` on, each whole
    (a line over 2000 characters is cut, and says so); at most the last 64 KiB are read."""
    try:
        with open(path, "rb") as f:
            end = f.seek(0, os.SEEK_END)
            begin = max(start, end - _LOG_READ_MAX)
            f.seek(begin)
            data = f.read(end - begin)
    except OSError:
        return []
    if begin > start and b"\n" in data:
        data = data[data.index(b"\n") + 1:]  # the read began mid-line: drop the partial line
    lines = [l.rstrip() for l in data.decode("utf-8", "replace").splitlines() if l.strip()]
    return [l if len(l) <= _LINE_MAX else l[:_LINE_MAX] + " [line cut]" for l in lines[-limit:]]


def _quote(lines: list[str]) -> str:
    """Lines indented under a bar; a run of identical lines (a daemon started again and again
    failing the same way) once, with its count."""
    if not lines:
        return "    | (nothing)"
    runs: list[list] = []
    for l in lines:
        if runs and runs[-1][0] == l:
            runs[-1][1] += 1
        else:
            runs.append([l, 1])
    return "\n".join(f"    | {l}" + (f"   [{n} times]" if n > 1 else "") for l, n in runs)


def geometry_text(g: Geometry) -> str:
    return (f"{g.layers} layers × {g.kv_heads} KV heads × head dim {g.head_dim} × {g.tokens_per_block} "
            f"tokens/block, {g.dtype}")


def _fix(cfg: ConnectorConfig, text: str) -> str:
    """What to do about a daemon's start-up or connect error."""
    d = cfg.emulated_dir
    if "formatted for" in text:
        g = cfg.geometry
        tp = (f" This engine runs tensor_parallel_size={cfg.tp_size}: each rank holds {g.kv_heads} KV heads, "
              "the model's KV heads divided by the TP size." if cfg.tp_size > 1 else "")
        return (
            f"The pool in {d} was formatted for another geometry than this engine's ({geometry_text(g)}).{tp} "
            "A pool made at one tensor-parallel size does not fit another, since TP changes the KV heads per "
            "rank (so do another model, block size or KV cache dtype). Fix: give 'emulated_dir' another "
            "directory (a new pool), or set \"open_mode\": \"create\" to format this one for this engine "
            "(what it holds is lost)."
        )
    if _MEDIA_HELD in text or _SOCKET_HELD in text:
        return (f"The media or the socket in {d} are held by another process (named above): stop it, or give "
                "'emulated_dir' another directory.")
    return f"Fix the cause above; the daemon's command line and output are in {Path(str(d)) / DAEMON_LOG}."


class DaemonStartError(ConfigError):
    """tuttid exited before serving, or had not served by the deadline. ``transient``: its error
    says the media or the socket are still held (a daemon of the same directory still exiting, or
    one too busy to answer), which a retry can cure, or it was still starting; nothing else is."""

    def __init__(self, message: str, lines: list[str], transient: bool):
        super().__init__(message)
        self.lines = lines
        self.transient = transient


# Sockets of the daemons this process started: the connector's start-up line says so.
started_here: dict[str, int] = {}


def _spawn(cfg: ConnectorConfig, socket: str, deadline: float) -> None:
    """Starts ``tutti serve`` detached (its own session; its output appended to tuttid.log in
    the pool directory) and waits, bounded, until its socket exists or it exited. A daemon that
    exited raises :class:`DaemonStartError` with the lines it wrote."""
    exe = find_tutti_bin()
    d = Path(str(cfg.emulated_dir))
    logf = d / DAEMON_LOG
    args = _serve_args(cfg, exe, socket)
    log.info("tutti: starting tuttid for %s: %s", d, " ".join(args))
    start = _log_size(logf)
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
    what = f"tuttid (pid {pid}, {exe}, log {logf})"
    while time.monotonic() < deadline:
        if os.path.exists(socket):
            started_here[socket] = pid
            return
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            lines = log_lines(logf, start)
            text = "\n".join(lines)
            transient = _MEDIA_HELD in text or _SOCKET_HELD in text
            again = ("its media or its socket are still held, so it is tried again until daemon_start_timeout_s"
                     if transient else "the same start-up would fail again, so it was not restarted")
            raise DaemonStartError(
                f"TuttiConnector: tuttid for the pool in {d} exited before serving ({again}). It said:\n"
                f"{_quote(lines)}\n{_fix(cfg, text)}\nIts command line: {' '.join(args)}",
                lines, transient,
            ) from None
        time.sleep(0.05)
    raise DaemonStartError(f"{what} had not created {socket} by the deadline", [], True)


# Connect errors a retry can cure: no daemon on the socket yet (or a stale socket file), a daemon
# too busy to answer in time, or one with no room for this client yet. Anything else (a pool of
# another geometry, a bad configuration) is the same on every try.
_TRANSIENT_CONNECT = (IoError, Timeout, Busy)


def _refuse(cfg: ConnectorConfig, socket: str, e: TuttiError) -> ConfigError:
    return ConfigError(
        f"TuttiConnector: the tuttid serving {socket} refused this engine, and would refuse it on every "
        f"try:\n{_quote((e.message or str(e)).splitlines())}\n{_fix(cfg, str(e))} The daemon of "
        f"{cfg.emulated_dir} exits {cfg.daemon_idle_exit_s} s after its last client (daemon_idle_exit_s)."
    )


def _connect(cfg: ConnectorConfig, socket: str, name: str, control: bool = False) -> Runtime:
    kw = dict(executor="control") if control else cfg.io_kwargs()
    kw.update(cfg.reconnect_kwargs())
    return Runtime.connect(socket, cfg.geometry, client_name=name, **kw)


def _connect_auto(cfg: ConnectorConfig, name: str, control: bool = False) -> Runtime:
    socket = str(cfg.daemon_socket)
    d = Path(str(cfg.emulated_dir))
    d.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + cfg.daemon_start_timeout_s
    log_start = _log_size(d / DAEMON_LOG)
    last: Exception | None = None

    def connect() -> Runtime | None:
        nonlocal last
        try:
            return _connect(cfg, socket, name, control)
        except _TRANSIENT_CONNECT as e:  # a daemon starting or exiting, or a stale socket file
            last = e
            return None
        except TuttiError as e:
            raise _refuse(cfg, socket, e) from None

    while True:
        if os.path.exists(socket):
            rt = connect()
            if rt is not None:
                return rt
        if time.monotonic() >= deadline:
            lines = log_lines(d / DAEMON_LOG, log_start)
            # A daemon's own failure is in its log (quoted); a connect error is not.
            why = f": {last}" if last is not None and not isinstance(last, DaemonStartError) else ""
            raise ConfigError(
                f"TuttiConnector: no tuttid answered on {socket} within {cfg.daemon_start_timeout_s:g} s "
                f"(daemon 'auto' for {d}, daemon_start_timeout_s){why}.\nIts log since this engine started:\n"
                f"{_quote(lines)}\n{_fix(cfg, chr(10).join(lines))}"
            )
        with open(d / START_LOCK, "a+") as lk:
            try:
                fcntl.flock(lk, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                lk.close()
                time.sleep(0.1)  # another process is starting it: wait for the socket
                continue
            try:
                rt = connect()
                if rt is not None:
                    return rt
                try:
                    _spawn(cfg, socket, deadline)
                except DaemonStartError as e:
                    if not e.transient:
                        raise
                    # A daemon of this directory that is still exiting holds the media: again, until the deadline.
                    last = e
                    time.sleep(0.5)
                    continue
                rt = connect()
                if rt is not None:
                    return rt
            finally:
                fcntl.flock(lk, fcntl.LOCK_UN)
        time.sleep(0.1)


def describe_pool(cfg: ConnectorConfig, runtime: Runtime | None = None) -> str:
    """Where the pool of ``cfg`` is, for the connector's start-up line."""
    if cfg.uses_daemon:
        where = f"in tuttid at {cfg.daemon_socket}"
        if cfg.daemon == "auto":
            pid = started_here.get(str(cfg.daemon_socket))
            how = f"started by this process, pid {pid}" if pid else "started on demand"
            where += f" (daemon 'auto', {how}; {cfg.emulated_drives} emulated drives in {cfg.emulated_dir})"
    elif cfg.vfio_drives:
        where = f"in this process: NVMe drives {', '.join(cfg.vfio_drives)} (vfio)"
    else:
        media = f"files in {cfg.emulated_dir}" if cfg.emulated_dir else "RAM"
        where = (f"in this process: {cfg.emulated_drives} emulated drives of "
                 f"{cfg.emulated_capacity_bytes >> 20} MiB ({media})")
    if runtime is not None:
        try:
            info = runtime.info()
            # As tuttid and `tutti status` name it (objstore's pool_name: the id's high 64 bits).
            name = f"{int.from_bytes(info.pool_id, 'little') >> 64:016x}"
            where += f", pool {name} ({info.drives} drives, {info.files} files)"
        except TuttiError:
            pass
    return where


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
