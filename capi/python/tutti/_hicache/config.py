"""The SGLang backend's configuration: ``--hicache-storage-backend-extra-config``.

SGLang hands the whole extra-config dict to the backend (minus the keys its controller
takes: ``prefetch_threshold``, ``prefetch_timeout_*``, ``tp_lcm_size``, ...). Keys:

==========================  ===========================================================
``backend_name``,           SGLang's ``dynamic`` factory: any name, ``"tutti.sglang"``,
``module_path``,            ``"TuttiHiCacheStorage"``
``class_name``
``interface_v1``            1: SGLang calls the zero-copy ``batch_get_v1``/``batch_set_v1``
                            (recommended); otherwise it calls ``batch_get``/``batch_set``
                            with page tensors, which this backend also serves
``emulated_drives``         number of emulated NVMe drives (no hardware)
``emulated_capacity_bytes`` bytes per emulated drive (default 256 MiB; at least 4 MiB, whole
                            512-byte blocks; whole MiB with a daemon)
``emulated_dir``            keep the emulated media in files here (survives restarts)
``vfio_drives``             PCI addresses of NVMe drives bound to vfio-pci (list or
                            comma-separated string)
``vfio_noiommu``            vfio's no-IOMMU mode
``executor``                ``"gio"`` (gio_uring on host lanes, the default and only one
                            wired here; ``"direct"`` is refused: a timed-out read keeps an
                            unknown outcome and SGLang reuses the host page at once)
``host_threads``            OS threads of the host executor (default 0: libtutti's 1)
``host_mode``               how the host executor runs its lanes: ``"inline"`` (default with
                            one thread: on the threads calling tutti), ``"persistent"`` or
                            ``"launch"`` (default with more threads)
``load_policy``             ``"breakeven"`` (default): ``batch_exists`` reports only the run of
                            pages expected to load faster than SGLang recomputes them, which
                            needs ``prefill_s_per_token`` or ``slack_table`` (without either
                            every hit is reported); ``"always"``: every hit
``prefill_s_per_token``     this engine's prefill cost per token in seconds (e.g. from a
                            benchmark of the deployment): the recompute estimate
``slack_table``             a slack table (``tutti profile``) whose windows give the recompute
                            estimate instead
``open_mode``               ``"open_or_create"`` (default), ``"open"``, ``"create"``
``io_timeout_ms``           per NVMe command deadline (default: libtutti's 2000)
``timeout_ms``              how long one batch may take before its pages count as
                            misses (default 30000)
``pin_ttl_ms``              how long ``batch_exists`` keeps a hit pinned when no get
                            follows (SGLang revoked the prefetch; default 30000)
``model``                   the cache identity's model name (default: SGLang's
                            ``model_name``)
``tenant_salt``             string mixed into the cache identity
``daemon_socket``           a running tuttid (``tutti serve``): this rank is its client
``daemon``                  ``"auto"``: start ``tutti serve`` for the emulated pool in
                            ``emulated_dir`` (one per directory, shared by every rank) when
                            none answers; ``"off"``: the pool in this process. Default:
                            ``"auto"`` when TP×PP > 1 and ``emulated_dir`` is set, else off
``daemon_idle_exit_s``      idle exit of a daemon started by ``"auto"`` (default 30)
``daemon_start_timeout_s``  how long to wait for its socket (default 60)
``lib``                     path to libtutti.so (else ``$TUTTI_LIB`` or the usual search)
==========================  ===========================================================

Unknown keys are refused, naming the key.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import Any

from .._connector.config import (
    DAEMON_SOCKET_NAME,
    MAX_HOST_THREADS,
    POOL_KEYS,
    ConnectorConfig,
    drive_source_problem,
)
from ..runtime import Geometry

WHERE = "hicache_storage_backend_extra_config"
# libtutti's smallest emulated drive, and the logical block every drive size is a multiple of.
MIN_EMULATED_BYTES = 4 << 20
EMULATED_LBA_BYTES = 512

SGLANG_KEYS = {"backend_name", "module_path", "class_name", "interface_v1"}
KNOWN_KEYS = SGLANG_KEYS | POOL_KEYS | {
    "prefill_s_per_token",
    "timeout_ms",
    "pin_ttl_ms",
}


class ConfigError(ValueError):
    """The backend's configuration is wrong; the message names the key."""


def _int(extra: dict, key: str, default: int, lo: int = 0, hi: int | None = None, *, where: str = WHERE) -> int:
    v = extra.get(key, default)
    if isinstance(v, bool) or not isinstance(v, (int, float, str)):
        raise ConfigError(f"{where}[{key!r}] = {v!r} is not an integer")
    try:
        iv = int(v)
    except ValueError:
        raise ConfigError(f"{where}[{key!r}] = {v!r} is not an integer") from None
    if iv < lo or (isinstance(v, float) and v != iv) or (hi is not None and iv > hi):
        bound = f">= {lo}" if hi is None else f"in {lo}..{hi}"
        raise ConfigError(f"{where}[{key!r}] = {v!r} must be an integer {bound}")
    return iv


def _capacity(extra: dict, daemon: str, *, who: str = "tutti.sglang", where: str = WHERE) -> int:
    """``emulated_capacity_bytes``, checked here against what libtutti accepts, so the error names the key
    and the minimum instead of surfacing later as a pool that will not open."""
    v = extra.get("emulated_capacity_bytes", 256 << 20)
    capacity = _int(extra, "emulated_capacity_bytes", 256 << 20, 1, where=where)
    if capacity < MIN_EMULATED_BYTES:
        raise ConfigError(
            f"{who}: {where}['emulated_capacity_bytes'] = {v!r} is under the minimum of "
            f"{MIN_EMULATED_BYTES} bytes (4 MiB) per emulated drive"
        )
    if capacity % EMULATED_LBA_BYTES:
        raise ConfigError(
            f"{who}: {where}['emulated_capacity_bytes'] = {v!r} is not a whole number of "
            f"{EMULATED_LBA_BYTES}-byte blocks"
        )
    if daemon == "auto" and capacity % (1 << 20):
        raise ConfigError(
            f"{who}: {where}['emulated_capacity_bytes'] = {v!r} must be whole MiB with a daemon "
            "(`tutti serve` takes MiB)"
        )
    return capacity



def _choice(extra: dict, key: str, default: str, allowed: tuple[str, ...], *, where: str = WHERE) -> str:
    v = str(extra.get(key, default))
    if v not in allowed:
        raise ConfigError(f"{where}[{key!r}] = {v!r}: use {' or '.join(repr(a) for a in allowed)}")
    return v


@dataclass(frozen=True)
class BackendConfig:
    """Everything but the geometry, which comes from the host pool at registration."""

    interface_v1: bool
    model: str | None
    tenant_salt: bytes
    timeout_s: float
    pin_ttl_s: float
    emulated_drives: int
    emulated_capacity_bytes: int
    emulated_dir: str | None
    vfio_drives: tuple[str, ...]
    vfio_noiommu: bool
    host_threads: int
    open_mode: str
    io_timeout_ms: int
    daemon: str  # "off", "connect" or "auto"
    daemon_socket: str | None
    daemon_idle_exit_s: int
    daemon_start_timeout_s: float
    tp_size: int
    pp_size: int
    host_mode: str | None = None
    load_policy: str = "breakeven"
    prefill_s_per_token: float = 0.0
    slack_table: str | None = None

    def runtime_config(self, geometry: Geometry, model: str) -> ConnectorConfig:
        """The runtime settings :mod:`tutti._connector.shared` opens or connects with."""
        return ConnectorConfig(
            geometry=geometry, model=model, tenant_salt=self.tenant_salt,
            emulated_drives=self.emulated_drives, emulated_capacity_bytes=self.emulated_capacity_bytes,
            emulated_dir=self.emulated_dir, vfio_drives=self.vfio_drives, vfio_noiommu=self.vfio_noiommu,
            executor="gio", open_mode=self.open_mode, io_timeout_ms=self.io_timeout_ms,
            layer_timeout_s=self.timeout_s, daemon=self.daemon, daemon_socket=self.daemon_socket,
            daemon_idle_exit_s=self.daemon_idle_exit_s, daemon_start_timeout_s=self.daemon_start_timeout_s,
            tp_size=self.tp_size, pp_size=self.pp_size, multiprocess=self.tp_size * self.pp_size > 1,
            host_threads=self.host_threads, host_mode=self.host_mode,
        )


def parse(
    extra: dict | None,
    *,
    tp_size: int = 1,
    pp_size: int = 1,
    who: str = "tutti.sglang",
    where: str = WHERE,
    known: "set[str] | frozenset[str]" = KNOWN_KEYS,
) -> BackendConfig:
    """Validates an engine's extra config before anything is opened: SGLang's by default.
    ``who`` (the integration), ``where`` (its config's name) and ``known`` (its keys) let another
    integration (:mod:`tutti.lmcache`) share these pool settings and their checks, with messages
    that name its own config."""
    extra = dict(extra or {})
    _i = functools.partial(_int, where=where)
    _c = functools.partial(_choice, where=where)
    unknown = set(extra) - known
    if unknown:
        raise ConfigError(f"{who}: unknown {where} keys {sorted(unknown)}; known: {sorted(known)}")
    if extra.get("lib"):
        os.environ.setdefault("TUTTI_LIB", str(extra["lib"]))
    emulated = _i(extra, "emulated_drives", 0, 0, 64)
    vfio = extra.get("vfio_drives") or ()
    if isinstance(vfio, str):
        vfio = [v for v in vfio.split(",") if v]
    socket = str(extra["daemon_socket"]) if extra.get("daemon_socket") else None
    emulated_dir = str(extra["emulated_dir"]) if extra.get("emulated_dir") else None
    ranks = tp_size * pp_size
    daemon = extra.get("daemon")
    if daemon is None:
        if socket is not None:
            daemon = "connect"
        else:
            daemon = "auto" if ranks > 1 and emulated and emulated_dir else "off"
    elif daemon == "auto":
        if vfio or not emulated or not emulated_dir:
            raise ConfigError(
                f"{who}: {where}['daemon'] = 'auto' starts tuttid for an emulated pool kept in "
                "'emulated_dir' (set 'emulated_drives' and 'emulated_dir'), or run `tutti serve` yourself and "
                "pass its socket as 'daemon_socket'"
            )
    elif daemon == "off":
        if socket is not None:
            raise ConfigError(f"{who}: {where} has 'daemon_socket' but 'daemon' is 'off'; drop one")
    else:
        raise ConfigError(f"{who}: {where}['daemon'] = {daemon!r}: use 'auto' or 'off'")
    if daemon == "auto" and socket is None:
        socket = os.path.join(str(emulated_dir), DAEMON_SOCKET_NAME)
    problem = drive_source_problem(f"{who}: {where}", daemon, emulated, vfio)
    if problem:
        raise ConfigError(problem)
    if daemon == "off" and ranks > 1:
        raise ConfigError(
            f"{who}: SGLang runs TP×PP = {ranks} ranks, each its own process, and they can share a pool "
            "only through tuttid: set 'daemon_socket' (a running `tutti serve`), or 'emulated_dir' with "
            "'emulated_drives' (tuttid started on demand)"
        )
    capacity = _capacity(extra, daemon, who=who, where=where)
    executor = _c(extra, "executor", "gio", ("gio", "direct"))
    if executor == "direct":
        raise ConfigError(
            f"{who}: {where}['executor'] = 'direct' is refused: its timed-out reads keep an unknown outcome "
            "(the drive may still write the page), and the engine reuses a failed page's host memory at once; "
            "use 'gio', which recovers the drive first"
        )
    host_threads = _i(extra, "host_threads", 0, 0, MAX_HOST_THREADS)
    host_mode = extra.get("host_mode")
    if host_mode is not None:
        host_mode = _c(extra, "host_mode", "inline", ("inline", "persistent", "launch"))
        if host_mode == "inline" and host_threads > 1:
            raise ConfigError(
                f"{who}: {where}['host_mode'] = 'inline' runs the lanes on the calling threads; "
                f"'host_threads' = {host_threads} needs 'persistent' or 'launch'"
            )
    load_policy = _c(extra, "load_policy", "breakeven", ("breakeven", "always"))
    rate = extra.get("prefill_s_per_token", 0.0)
    try:
        prefill_s_per_token = float(rate)
    except (TypeError, ValueError):
        prefill_s_per_token = -1.0
    if isinstance(rate, bool) or not (0.0 <= prefill_s_per_token < 1.0):
        raise ConfigError(f"{who}: {where}['prefill_s_per_token'] = {rate!r} must be seconds in [0, 1)")
    table = extra.get("slack_table")
    if table is not None and (not isinstance(table, str) or not os.path.isfile(table)):
        raise ConfigError(f"{who}: {where}['slack_table'] = {table!r} is not a file")
    salt = extra.get("tenant_salt", "")
    if not isinstance(salt, (str, bytes)):
        raise ConfigError(f"{who}: {where}['tenant_salt'] must be a string")
    model = extra.get("model")
    if model is not None and (not isinstance(model, str) or not model):
        raise ConfigError(f"{who}: {where}['model'] must be a non-empty string")
    return BackendConfig(
        interface_v1=bool(extra.get("interface_v1", 0)),
        model=model,
        tenant_salt=salt.encode() if isinstance(salt, str) else bytes(salt),
        timeout_s=_i(extra, "timeout_ms", 30_000, 1, 3_600_000) / 1000.0,
        pin_ttl_s=_i(extra, "pin_ttl_ms", 30_000, 1, 3_600_000) / 1000.0,
        emulated_drives=emulated,
        emulated_capacity_bytes=capacity,
        emulated_dir=emulated_dir,
        vfio_drives=tuple(str(v) for v in vfio),
        vfio_noiommu=bool(extra.get("vfio_noiommu", False)),
        host_threads=host_threads,
        host_mode=host_mode,
        load_policy=load_policy,
        prefill_s_per_token=prefill_s_per_token,
        slack_table=table,
        open_mode=_c(extra, "open_mode", "open_or_create", ("open_or_create", "open", "create")),
        io_timeout_ms=_i(extra, "io_timeout_ms", 0),
        daemon=daemon,
        daemon_socket=socket,
        daemon_idle_exit_s=_i(extra, "daemon_idle_exit_s", 30, 1),
        daemon_start_timeout_s=float(_i(extra, "daemon_start_timeout_s", 60, 1)),
        tp_size=tp_size,
        pp_size=pp_size,
    )


def identity_salt(cfg: BackendConfig, layout_name: str, torch_dtype: str, ranks: dict[str, Any],
                  latent: bool = False) -> bytes:
    """The tenant salt of one rank's cache identity: the user's salt, then what makes SGLang's
    bytes mean what they mean (its layout name and dtype) and whose shard they are (the ranks).

    An MLA pool (``latent``) holds the same latents on every TP rank: its identity says so and
    leaves the TP rank and size out, so every rank (and a deployment at another TP size) reads
    the pages one rank wrote. PP and CP ranks stay: they hold other layers or tokens."""
    parts = [f"layout={layout_name}", f"dtype={torch_dtype}"]
    if latent:
        parts.append("kv=mla-latent")
    parts += [f"{k}={v}" for k, v in ranks.items() if not (latent and k == "tp")]
    return cfg.tenant_salt + b"\0tutti-sglang:" + ";".join(parts).encode()
