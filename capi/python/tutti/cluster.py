"""``tutti.cluster``: Mooncake Store as the cluster tier above each node's tutti pool.

Each node keeps its own HBM↔SSD path (the tutti pool). Above it, Mooncake Store
(``mooncake-transfer-engine``'s ``MooncakeDistributedStore``) holds blocks that any node
published, so a prefix computed on one node is loaded by another instead of recomputed.
The vLLM connector uses this module when ``kv_connector_extra_config['mooncake']`` names
a master and a metadata server (see :func:`parse_config`).

Objects. One block (every layer's K and V of one chunk) is one Mooncake object, gathered
from and scattered into the engine's KV memory by ``batch_put_from_multi_buffers`` /
``batch_get_into_multi_buffers``, plus a small manifest object written after it::

    tutti1/<identity>/<chain hash>       the block's bytes, layer by layer
    tutti1/<identity>/<chain hash>/m     b"TUTTIMC1" identity chain-hash length digest

``identity`` is a digest of the cache identity (model, tenant salt — which carries the
rank layout and the byte order — the layout kind and the geometry), so two deployments
never share KV they must not. A lookup asks for the manifests (one batch existence
check); a load reads the manifests, checks magic, identity, chain hash and length against
what this node expects, reads the block straight into the engine's blocks, and checks the
BLAKE2b digest of the bytes that landed. Anything that does not verify is a failed block:
the connector reports it as a load error and the engine recomputes it.

Publication is asynchronous: the engine thread computes the manifests (the digest of the
blocks while they still hold the step's KV) and hands them to a bounded queue; a publisher
thread writes the objects from KV memory and then the manifests, but only if the blocks
still hash the same (vLLM may have reused them meanwhile). A full queue drops the
publication and counts it; the engine never waits for Mooncake.

Failures. Every call the engine waits on (setup, lookups, loads) runs on one caller thread
with a deadline (``timeout_ms``). A call past its deadline, or an error from Mooncake,
is a miss; after a timeout the tier stays "down" (every lookup a miss at once) until the
stuck call returns and ``retry_ms`` passed. Blocks whose read was still running at the
deadline may yet be written by Mooncake: they are reported separately so the connector can
treat them as poisoned (like an NVMe read of unknown outcome).

Network safety: every host (master, metadata server, this node, ``MC_TCP_BIND_ADDRESS``)
must be in 127.0.0.0/8 unless ``allow_remote_hosts`` is set; the transfer engine otherwise
advertises the machine's first non-loopback interface.
"""

from __future__ import annotations

import ctypes
import hashlib
import ipaddress
import logging
import os
import queue
import struct
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence
from urllib.parse import urlsplit

log = logging.getLogger("tutti.cluster")

MAGIC = b"TUTTIMC1"
KEY_PREFIX = "tutti1"
DIGEST_BYTES = 32
NOT_FOUND = -704  # Mooncake's OBJECT_NOT_FOUND

# (model, tenant salt, layout kind): the cache identity the connector registers KV under.
Identity = tuple[str, bytes, str]
# One block's memory: (address, bytes) runs in the object's order.
Segments = list[tuple[int, int]]


class ClusterError(ValueError):
    """The ``mooncake`` configuration is wrong, or Mooncake cannot be used; the message says why."""


@dataclass(frozen=True)
class ClusterConfig:
    """Where Mooncake runs and how the tier behaves (``kv_connector_extra_config['mooncake']``)."""

    master: str  # host:port of mooncake_master's RPC
    metadata_server: str  # http://host:port/metadata
    local_hostname: str = "127.0.0.1"
    protocol: str = "tcp"
    device: str = ""
    segment_bytes: int = 64 << 20  # memory this node contributes to the store
    buffer_bytes: int = 16 << 20  # the client's local transfer buffer
    timeout_s: float = 2.0
    retry_s: float = 5.0
    publish_queue: int = 64  # publications (one per stored request step) waiting at most
    store_local: bool = True  # remote hits are stored into the local pool after loading
    allow_remote_hosts: bool = False


MOONCAKE_KEYS = {
    "master", "metadata_server", "local_hostname", "protocol", "device", "segment_bytes", "buffer_bytes",
    "timeout_ms", "retry_ms", "publish_queue", "store_local", "allow_remote_hosts",
}


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host) in ipaddress.ip_network("127.0.0.0/8")
    except ValueError:
        return False


def _host_port(value: str, what: str) -> str:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ClusterError(f"mooncake[{what!r}] = {value!r} is not host:port")
    return host


def _pos_int(raw: dict, key: str, default: int) -> int:
    v = raw.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        raise ClusterError(f"mooncake[{key!r}] = {v!r} must be a positive integer")
    return v


def parse_config(raw: Any) -> ClusterConfig:
    """Checks the connector's ``mooncake`` value (a dict) and returns the tier's config.

    Required: ``master`` (``host:port``) and ``metadata_server`` (``http://host:port/metadata``).
    Optional: ``local_hostname`` (this node's address, default 127.0.0.1), ``protocol``
    (``tcp``), ``device``, ``segment_bytes``, ``buffer_bytes``, ``timeout_ms`` (2000),
    ``retry_ms`` (5000), ``publish_queue`` (64), ``store_local`` (true),
    ``allow_remote_hosts`` (false: every host must be in 127.0.0.0/8).
    """
    if not isinstance(raw, dict):
        raise ClusterError(f"kv_connector_extra_config['mooncake'] must be a dict, not {type(raw).__name__}")
    unknown = set(raw) - MOONCAKE_KEYS
    if unknown:
        raise ClusterError(f"unknown mooncake keys {sorted(unknown)}; known: {sorted(MOONCAKE_KEYS)}")
    for key in ("master", "metadata_server"):
        if not isinstance(raw.get(key), str) or not raw[key]:
            raise ClusterError(f"mooncake[{key!r}] is required (a string)")
    master = raw["master"]
    master_host = _host_port(master, "master")
    meta = urlsplit(raw["metadata_server"])
    if meta.scheme != "http" or not meta.hostname or meta.port is None:
        raise ClusterError(
            f"mooncake['metadata_server'] = {raw['metadata_server']!r} is not http://host:port/metadata"
        )
    local = str(raw.get("local_hostname", "127.0.0.1"))
    protocol = str(raw.get("protocol", "tcp"))
    if protocol not in ("tcp", "rdma"):
        raise ClusterError(f"mooncake['protocol'] = {protocol!r}: use 'tcp' or 'rdma'")
    allow = raw.get("allow_remote_hosts", False)
    if not isinstance(allow, bool):
        raise ClusterError(f"mooncake['allow_remote_hosts'] = {allow!r} must be true or false")
    if not allow:
        for what, host in (("master", master_host), ("metadata_server", meta.hostname),
                           ("local_hostname", local)):
            if not _loopback(host):
                raise ClusterError(
                    f"mooncake[{what!r}] host {host!r} is not a loopback address (127.0.0.0/8); set "
                    f"mooncake['allow_remote_hosts'] = true to run across machines"
                )
        bind = os.environ.get("MC_TCP_BIND_ADDRESS")
        if bind and not _loopback(bind):
            raise ClusterError(
                f"MC_TCP_BIND_ADDRESS={bind!r} is not a loopback address while mooncake['allow_remote_hosts'] "
                f"is false"
            )
    store_local = raw.get("store_local", True)
    if not isinstance(store_local, bool):
        raise ClusterError(f"mooncake['store_local'] = {store_local!r} must be true or false")
    return ClusterConfig(
        master=master,
        metadata_server=raw["metadata_server"],
        local_hostname=local,
        protocol=protocol,
        device=str(raw.get("device", "")),
        segment_bytes=_pos_int(raw, "segment_bytes", 64 << 20),
        buffer_bytes=_pos_int(raw, "buffer_bytes", 16 << 20),
        timeout_s=_pos_int(raw, "timeout_ms", 2000) / 1000.0,
        retry_s=_pos_int(raw, "retry_ms", 5000) / 1000.0,
        publish_queue=_pos_int(raw, "publish_queue", 64),
        store_local=store_local,
        allow_remote_hosts=allow,
    )


# --- keys and manifests ---------------------------------------------------------------------


def identity_digest(identity: Identity, geometry: Any) -> bytes:
    """16 bytes naming one cache identity and geometry; part of every key."""
    model, salt, kind = identity
    g = (geometry.layers, geometry.kv_heads, geometry.head_dim, geometry.tokens_per_block, geometry.dtype)
    h = hashlib.blake2b(digest_size=16, person=b"tutti-mc-ident")
    for part in (model.encode(), bytes(salt), kind.encode(), repr(g).encode()):
        h.update(struct.pack("<Q", len(part)))
        h.update(part)
    return h.digest()


def data_key(ident: bytes, chain: bytes) -> str:
    return f"{KEY_PREFIX}/{ident.hex()}/{chain.hex()}"


def manifest_key(ident: bytes, chain: bytes) -> str:
    return data_key(ident, chain) + "/m"


def _mem(addr: int, n: int) -> memoryview:
    return memoryview((ctypes.c_char * n).from_address(addr)).cast("B")


def digest_segments(segments: Segments) -> bytes:
    h = hashlib.blake2b(digest_size=DIGEST_BYTES, person=b"tutti-mc-data")
    for addr, n in segments:
        h.update(_mem(addr, n))
    return h.digest()


def make_manifest(ident: bytes, chain: bytes, length: int, digest: bytes) -> bytes:
    return MAGIC + ident + struct.pack("<H", len(chain)) + chain + struct.pack("<Q", length) + digest


def check_manifest(raw: bytes, ident: bytes, chain: bytes, length: int) -> tuple[bytes | None, str]:
    """(the block's digest, "") when ``raw`` is the manifest of this block as this node lays it
    out; (None, why) otherwise."""
    want = len(MAGIC) + len(ident) + 2 + len(chain) + 8 + DIGEST_BYTES
    if len(raw) != want:
        return None, f"manifest is {len(raw)} bytes, expected {want}"
    if raw[: len(MAGIC)] != MAGIC:
        return None, "manifest magic"
    at = len(MAGIC)
    if raw[at: at + len(ident)] != ident:
        return None, "manifest of another cache identity"
    at += len(ident)
    (clen,) = struct.unpack_from("<H", raw, at)
    at += 2
    if raw[at: at + clen] != chain:
        return None, "manifest of another chunk"
    at += clen
    (n,) = struct.unpack_from("<Q", raw, at)
    if n != length:
        return None, f"object length {n}, this node's block is {length} bytes"
    return raw[at + 8:], ""


# --- the tier -------------------------------------------------------------------------------


class Unavailable(Exception):
    """Mooncake did not answer in time, or the tier is down."""


class _Caller:
    """Runs one blocking call at a time on a daemon thread; the caller waits with a deadline.

    A call past its deadline keeps its thread; until it returns the caller refuses new calls
    (``Unavailable``) rather than queueing behind it.
    """

    def __init__(self, name: str):
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        self._busy = threading.Event()
        self._t = threading.Thread(target=self._run, name=name, daemon=True)
        self._t.start()

    def _run(self):
        while True:
            item = self._q.get()
            if item is None:
                return
            fn, box, done = item
            try:
                box.append((True, fn()))
            except BaseException as e:  # noqa: BLE001 - handed to the waiting caller
                box.append((False, e))
            finally:
                self._busy.clear()
                done.set()

    @property
    def busy(self) -> bool:
        return self._busy.is_set()

    def call(self, fn: Callable[[], Any], timeout_s: float) -> Any:
        if self._busy.is_set():
            raise Unavailable("an earlier Mooncake call has not returned yet")
        self._busy.set()
        box: list = []
        done = threading.Event()
        self._q.put((fn, box, done))
        if not done.wait(timeout_s):
            raise Unavailable(f"Mooncake did not answer within {timeout_s:g} s")
        ok, value = box[0]
        if ok:
            return value
        raise value

    def stop(self):
        self._q.put(None)


STAT_KEYS = (
    "remote_lookups", "remote_hit_blocks", "remote_loaded_blocks", "remote_bytes_loaded", "remote_failures",
    "remote_verify_failures", "remote_published_blocks", "remote_bytes_published", "remote_publish_drops",
)


@dataclass
class LoadResult:
    """Indices (into the load's blocks) that failed, and those whose read may still land."""

    failed: set[int] = field(default_factory=set)
    unknown: set[int] = field(default_factory=set)


def _default_factory():
    try:
        from mooncake.store import MooncakeDistributedStore
    except ImportError as e:
        raise ClusterError(
            f"the mooncake tier needs the Mooncake Python package (scripts/setup-mooncake installs "
            f"mooncake-transfer-engine-non-cuda): {e}"
        ) from None
    return MooncakeDistributedStore()


_store_factory: Callable[[], Any] = _default_factory


def _own_segment(store: Any) -> Any:
    """Mooncake's put config placing objects in this client's own segment (its memory), so a
    node's blocks live, and go, with that node; None where the client has no such config."""
    if not type(store).__module__.startswith("mooncake"):
        return None
    try:
        from mooncake.store import ReplicateConfig
    except ImportError:
        return None
    try:
        cfg = ReplicateConfig()
        cfg.replica_num = 1
        cfg.preferred_segment = store.get_hostname()
        return cfg
    except Exception as e:  # noqa: BLE001 - a client without it: Mooncake places the objects
        log.info("tutti: Mooncake's ReplicateConfig is not usable here (%s)", e)
        return None


def set_store_factory(factory: Callable[[], Any] | None) -> None:
    """Replaces how the tier makes its Mooncake client (tests; ``None`` restores the real one)."""
    global _store_factory
    _store_factory = factory or _default_factory


class MooncakeTier:
    """One node's client of Mooncake Store (see the module docs)."""

    def __init__(self, cfg: ClusterConfig, geometry: Any):
        self.cfg = cfg
        self.geometry = geometry
        self.stats = {k: 0 for k in STAT_KEYS}
        self._lock = threading.Lock()
        self._caller = _Caller("tutti-mooncake")
        self._store: Any = None
        self._put_config: Any = None  # objects go into this node's own segment
        self._down_until = 0.0
        self._registered: list[tuple[int, int]] = []
        self._closed = False
        self._queue: queue.Queue = queue.Queue(maxsize=cfg.publish_queue)
        self._pub_store_ready = threading.Event()
        self._publisher = threading.Thread(target=self._publish_loop, name="tutti-mooncake-publish", daemon=True)
        self._publisher.start()
        if not cfg.allow_remote_hosts:
            os.environ.setdefault("MC_TCP_BIND_ADDRESS", cfg.local_hostname)
        try:
            self._guarded(self._setup)
        except Unavailable as e:
            log.warning("tutti: Mooncake at %s is not available yet (%s); lookups miss until it is",
                        cfg.master, e)

    # --- plumbing -------------------------------------------------------------------------

    def _count(self, key: str, n: int = 1) -> None:
        with self._lock:
            self.stats[key] += n

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self.stats)

    def _setup(self) -> None:
        if self._store is not None:
            return
        store = _store_factory()
        c = self.cfg
        rc = store.setup(c.local_hostname, c.metadata_server, c.segment_bytes, c.buffer_bytes, c.protocol,
                         c.device, c.master)
        if rc != 0:
            raise RuntimeError(f"MooncakeDistributedStore.setup returned {rc}")
        for addr, n in self._registered:
            rc = store.register_buffer(addr, n)
            if rc != 0:
                raise RuntimeError(f"register_buffer of {n} bytes returned {rc}")
        self._put_config = _own_segment(store)
        self._store = store
        self._pub_store_ready.set()
        log.info("tutti: Mooncake client %s connected to master %s", c.local_hostname, c.master)

    def _guarded(self, fn: Callable[[], Any]) -> Any:
        """Runs ``fn`` on the caller thread within the deadline; every failure is ``Unavailable``."""
        if self._closed:
            raise Unavailable("the tier is closed")
        now = time.monotonic()
        if now < self._down_until or self._caller.busy:
            raise Unavailable("Mooncake is down (an earlier call failed or has not returned)")
        try:
            if self._store is None:
                self._caller.call(self._setup, self.cfg.timeout_s)
            return self._caller.call(fn, self.cfg.timeout_s)
        except Unavailable:
            self._count("remote_failures")
            self._down_until = time.monotonic() + self.cfg.retry_s
            raise
        except Exception as e:  # noqa: BLE001 - Mooncake's errors are misses
            self._count("remote_failures")
            self._down_until = time.monotonic() + self.cfg.retry_s
            raise Unavailable(f"{type(e).__name__}: {e}") from e

    def register_memory(self, regions: Sequence[tuple[int, int]]) -> None:
        """The engine's KV memory, which Mooncake reads from and writes into."""
        self._registered = [(int(a), int(n)) for a, n in regions]
        if self._store is None:
            return

        def reg():
            for addr, n in self._registered:
                rc = self._store.register_buffer(addr, n)
                if rc != 0:
                    raise RuntimeError(f"register_buffer of {n} bytes returned {rc}")

        try:
            self._guarded(reg)
        except Unavailable as e:
            log.warning("tutti: registering KV memory with Mooncake failed (%s): remote loads miss", e)
            self._store = None  # registered again at the next setup
            self._pub_store_ready.clear()

    # --- lookup ---------------------------------------------------------------------------

    def contains(self, identities: Sequence[Identity], hashes: Sequence[bytes]) -> int:
        """How many leading ``hashes`` Mooncake holds under every identity (0 on any failure)."""
        if not hashes or not identities:
            return 0
        self._count("remote_lookups")
        hits = len(hashes)
        for identity in identities:
            ident = identity_digest(identity, self.geometry)
            keys = [manifest_key(ident, h) for h in hashes[:hits]]
            try:
                found = self._guarded(lambda keys=keys: self._store.batch_is_exist(keys))
            except Unavailable as e:
                log.info("tutti: Mooncake lookup failed, a miss: %s", e)
                return 0
            if any(v < 0 for v in found):
                self._count("remote_failures")  # Mooncake answered with an error: the master is gone?
            run = 0
            for v in found:
                if v != 1:
                    break
                run += 1
            hits = min(hits, run)
            if hits == 0:
                break
        self._count("remote_hit_blocks", hits)
        return hits

    # --- load -----------------------------------------------------------------------------

    def load(self, identity: Identity, hashes: Sequence[bytes], segments: Sequence[Segments]) -> LoadResult:
        """Reads blocks ``hashes[i]`` into ``segments[i]`` (the engine's memory) and verifies them."""
        res = LoadResult()
        if not hashes:
            return res
        ident = identity_digest(identity, self.geometry)
        lengths = [sum(n for _, n in seg) for seg in segments]
        state = {"phase": "manifests"}

        def run():
            mans = self._store.get_batch([manifest_key(ident, h) for h in hashes])
            digests: list[bytes | None] = []
            for i, h in enumerate(hashes):
                raw = bytes(mans[i]) if i < len(mans) and mans[i] is not None else b""
                if not raw:
                    digests.append(None)
                    log.info("tutti: Mooncake block %s: no manifest (gone)", h.hex()[:16])
                    continue
                d, why = check_manifest(raw, ident, h, lengths[i])
                if d is None:
                    self._count("remote_verify_failures")
                    log.warning("tutti: Mooncake block %s does not verify: %s; a miss", h.hex()[:16], why)
                digests.append(d)
            todo = [i for i, d in enumerate(digests) if d is not None]
            state["phase"] = "data"
            state["todo"] = todo
            got = self._store.batch_get_into_multi_buffers(
                [data_key(ident, hashes[i]) for i in todo],
                [[a for a, _ in segments[i]] for i in todo],
                [[n for _, n in segments[i]] for i in todo],
            ) if todo else []
            state["phase"] = "verify"
            ok = set()
            for j, i in enumerate(todo):
                n = got[j] if j < len(got) else -1
                if n != lengths[i]:
                    self._count("remote_verify_failures")
                    log.warning("tutti: Mooncake block %s: read returned %s, expected %d bytes; a miss",
                                hashes[i].hex()[:16], n, lengths[i])
                    continue
                if digest_segments(segments[i]) != digests[i]:
                    self._count("remote_verify_failures")
                    log.warning("tutti: Mooncake block %s: digest mismatch; a miss", hashes[i].hex()[:16])
                    continue
                ok.add(i)
            return ok

        try:
            ok = self._guarded(run)
        except Unavailable as e:
            log.warning("tutti: loading %d blocks from Mooncake failed, recomputing them: %s", len(hashes), e)
            res.failed = set(range(len(hashes)))
            if state["phase"] == "data":
                res.unknown = set(state.get("todo", ()))
            return res
        res.failed = set(range(len(hashes))) - ok
        self._count("remote_loaded_blocks", len(ok))
        self._count("remote_bytes_loaded", sum(lengths[i] for i in ok))
        return res

    # --- publish --------------------------------------------------------------------------

    def publish(self, identity: Identity, hashes: Sequence[bytes], segments: Sequence[Segments]) -> bool:
        """Queues blocks for publication (never blocks). False, counted, when the queue is full
        or the tier is closed."""
        if not hashes:
            return True
        if self._closed or self._queue.full():
            self._count("remote_publish_drops", len(hashes))
            return False
        ident = identity_digest(identity, self.geometry)
        items = []
        for h, seg in zip(hashes, segments):
            length = sum(n for _, n in seg)
            d = digest_segments(seg)
            items.append((data_key(ident, h), manifest_key(ident, h), list(seg), d,
                          make_manifest(ident, h, length, d)))
        try:
            self._queue.put_nowait(items)
        except queue.Full:
            self._count("remote_publish_drops", len(hashes))
            return False
        return True

    def _publish_loop(self) -> None:
        while True:
            items = self._queue.get()
            try:
                if items is None:
                    return
                self._publish(items)
            except Exception as e:  # noqa: BLE001 - publication is best effort
                self._count("remote_failures")
                log.warning("tutti: publishing %d blocks to Mooncake failed: %s", len(items), e)
            finally:
                self._queue.task_done()

    def _publish(self, items: list) -> None:
        if not self._pub_store_ready.is_set() or self._store is None:
            self._count("remote_publish_drops", len(items))
            return
        store = self._store
        exists = store.batch_is_exist([m for _, m, _, _, _ in items])
        todo = [it for it, e in zip(items, exists) if e != 1]
        if not todo:
            return
        extra = () if self._put_config is None else (self._put_config,)
        rcs = store.batch_put_from_multi_buffers(
            [k for k, _, _, _, _ in todo], [[a for a, _ in s] for _, _, s, _, _ in todo],
            [[n for _, n in s] for _, _, s, _, _ in todo], *extra,
        )
        mkeys, mvals, nbytes = [], [], 0
        for it, rc in zip(todo, rcs):
            key, mkey, seg, d, man = it
            if rc != 0:
                self._count("remote_failures")
                log.info("tutti: Mooncake put of %s returned %s", key, rc)
                continue
            if digest_segments(seg) != d:
                # The engine reused the block before it was sent: never describe those bytes.
                self._count("remote_publish_drops")
                continue
            mkeys.append(mkey)
            mvals.append(man)
            nbytes += sum(n for _, n in seg)
        if mkeys:
            rc = store.put_batch(mkeys, mvals, *extra)
            if rc != 0:
                self._count("remote_failures")
                log.info("tutti: Mooncake put of %d manifests returned %s", len(mkeys), rc)
                return
            self._count("remote_published_blocks", len(mkeys))
            self._count("remote_bytes_published", nbytes)

    def flush(self, timeout_s: float) -> bool:
        """Waits (bounded) until queued publications are done; True if they are."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._queue.unfinished_tasks == 0:
                return True
            time.sleep(0.01)
        return self._queue.unfinished_tasks == 0

    def close(self, timeout_s: float = 5.0) -> None:
        """Stops publishing and closes the client, each wait bounded."""
        if self._closed:
            return
        self._closed = True
        try:
            self._queue.put(None, timeout=timeout_s)
        except queue.Full:
            pass
        self._publisher.join(timeout_s)
        store, self._store = self._store, None
        if store is not None and not self._caller.busy:
            box = threading.Thread(target=store.close, name="tutti-mooncake-close", daemon=True)
            box.start()
            box.join(timeout_s)
        self._caller.stop()


# --- one tier per node process, shared by the scheduler-side and worker-side connectors -----

_tiers_lock = threading.Lock()
_tiers: dict[tuple, list] = {}  # key -> [tier, users]


def acquire(cfg: ClusterConfig, geometry: Any, pool_key: tuple = ()) -> MooncakeTier:
    key = (cfg, geometry, pool_key)
    with _tiers_lock:
        entry = _tiers.get(key)
        if entry is None or entry[0]._closed:
            entry = [MooncakeTier(cfg, geometry), 0]
            _tiers[key] = entry
        entry[1] += 1
        return entry[0]


def release(tier: MooncakeTier) -> None:
    """Drops one user; the last one closes the tier."""
    with _tiers_lock:
        for key, entry in list(_tiers.items()):
            if entry[0] is tier:
                entry[1] -= 1
                if entry[1] > 0:
                    return
                del _tiers[key]
                break
    tier.close()
