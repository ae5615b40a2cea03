"""Jobs and store sessions: the handles a load or a store hands back.

A :class:`Job` moves many blocks over a range of layers; the engine waits
for the whole job or for one layer at a time, and reads which blocks failed
from the job's failure bitmap. A :class:`Store` session reserves pool files
for new chunks, is written by jobs, and makes its blocks visible on commit.
"""

from __future__ import annotations

from ctypes import byref, c_char, c_size_t, c_uint64, c_void_p
from dataclasses import dataclass, field

from . import _lib
from ._handle import _Handle, layer_range
from ._lib import lib, sized
from .errors import OK, Timeout

DEFAULT_TIMEOUT_S = 30.0
MAX_TIMEOUT_S = 86_400.0

def _ms(timeout_s: float) -> int:
    if timeout_s < 0 or timeout_s > MAX_TIMEOUT_S:
        raise ValueError(f"timeout {timeout_s} s is outside 0..{MAX_TIMEOUT_S:.0f} s")
    return int(round(timeout_s * 1000))



def _bits(bitmap, blocks: int) -> list[int]:
    # Only the words with a bit set are walked: a job without failures costs one pass over words.
    return [
        w * 64 + b
        for w in range((blocks + 63) // 64)
        if bitmap[w]
        for b in range(64)
        if bitmap[w] >> b & 1 and w * 64 + b < blocks
    ]


@dataclass
class JobStatus:
    """A job's progress; ``failed_blocks`` are indices into the submission's block list.

    The host-work counters: ``host_calls`` (calls into the I/O path), ``host_built``
    (commands whose fields the host wrote), ``host_pairs`` ((file, block) pairs the host
    read or copied per layer; 0 when ``pairs_registered``, i.e. the job's pairs were
    registered once at its start), ``setup_ns`` (host CPU of the job's setup, once),
    ``submit_ns`` (host CPU of its per-layer submissions so far) and ``layer_submit_ns``
    (that CPU per layer of the job, in order; its sum is ``submit_ns``).

    ``unknown_blocks`` (ABI 1.2, a subset of ``failed_blocks``; ``unknown`` is their count)
    failed with an unknown outcome: the command timed out or its queue or drive died, so
    the drive may still execute it. For a load, the drive may still write that engine block
    until the pool is reopened: do not give its memory to another request nor recompute
    into it before then (treat it as poisoned). For a store, the chunk was not stored and
    its pool file is quarantined (``Stats.quarantined_files``).
    """

    direction: str
    done: bool
    cancelled: bool
    first_layer: int
    num_layers: int
    layers_done: int
    blocks: int
    failed: int
    failed_blocks: list[int]
    commands: int
    bytes: int
    host_calls: int = 0
    host_built: int = 0
    host_pairs: int = 0
    pairs_registered: bool = False
    setup_ns: int = 0
    submit_ns: int = 0
    layer_submit_ns: list[int] = field(default_factory=list)
    unknown: int = 0
    unknown_blocks: list[int] = field(default_factory=list)


@dataclass
class StoreReport:
    stored: int
    present: int
    failed: int
    failed_blocks: list[int]



class Job(_Handle):
    """One load or store job over a range of layers."""

    _destroy = "tutti_job_destroy"

    def __init__(self, ptr: c_void_p, direction: str, blocks: int, layers: range, runtime: _Handle):
        super().__init__(ptr)
        self.direction = direction
        self.blocks = blocks
        self.layers = layers
        # Keeps the runtime (and the KV memory it keeps alive) until the drives are done with it.
        self.runtime = runtime

    def _status(self):
        words = max((self.blocks + 63) // 64, 1)
        bitmap = (c_uint64 * words)()
        per_layer = (c_uint64 * max(len(self.layers), 1))()
        unknown = (c_uint64 * words)()
        st = sized(
            _lib.JobStatus,
            failed_bitmap_words=words,
            failed_bitmap=bitmap,
            layer_submit_ns_len=len(per_layer),
            layer_submit_ns=per_layer,
            unknown_bitmap_words=words,
            unknown_bitmap=unknown,
        )
        # The buffers live as long as the struct that points to them.
        st._buffers = (bitmap, per_layer, unknown)
        return st, bitmap

    def _convert(self, st, bitmap) -> JobStatus:
        per_layer = st._buffers[1]
        return JobStatus(
            direction="load" if st.direction == _lib.DIR_LOAD else "store",
            done=bool(st.done),
            cancelled=bool(st.cancelled),
            first_layer=st.first_layer,
            num_layers=st.num_layers,
            layers_done=st.layers_done,
            blocks=st.blocks,
            failed=st.failed,
            failed_blocks=_bits(bitmap, st.blocks),
            commands=st.commands,
            bytes=st.bytes,
            host_calls=st.host_calls,
            host_built=st.host_built,
            host_pairs=st.host_pairs,
            pairs_registered=bool(st.pairs_registered),
            setup_ns=st.setup_ns,
            submit_ns=st.submit_ns,
            layer_submit_ns=[per_layer[i] for i in range(len(self.layers))],
            unknown=st.unknown,
            unknown_blocks=_bits(st._buffers[2], st.blocks),
        )

    def _waited(self, status: int, name: str, st, bitmap) -> JobStatus:
        L = lib()
        if status == Timeout.status:
            exc = Timeout(status, L.status_name(status), L.last_error(), name)
            exc.job_status = self._convert(st, bitmap)
            raise exc
        L.check(status, name)
        return self._convert(st, bitmap)

    def poll(self) -> JobStatus:
        """Advances the job and returns its progress without blocking."""
        st, bitmap = self._status()
        lib().call("tutti_job_poll", self._p(), byref(st))
        return self._convert(st, bitmap)

    def wait(self, timeout: float = DEFAULT_TIMEOUT_S) -> JobStatus:
        """Waits until every layer finished; raises :class:`~tutti.errors.Timeout` (with ``job_status``)."""
        st, bitmap = self._status()
        status = lib().tutti_job_wait(self._p(), _ms(timeout), byref(st))
        return self._waited(status, "tutti_job_wait", st, bitmap)

    def layer_done(self, layer: int) -> bool:
        return lib().call("tutti_job_layer_done", self._p(), layer) == OK

    def wait_layer(self, layer: int, timeout: float = DEFAULT_TIMEOUT_S) -> JobStatus:
        """Waits until ``layer`` finished (ok or failed); the status covers the whole job so far."""
        st, bitmap = self._status()
        status = lib().tutti_job_wait_layer(self._p(), layer, _ms(timeout), byref(st))
        return self._waited(status, "tutti_job_wait_layer", st, bitmap)

    def cancel(self) -> None:
        """Layers not yet submitted are dropped; their blocks fail as cancelled."""
        lib().call("tutti_job_cancel", self._p())

    def error(self) -> str:
        """The job's first failure reason ('' if none)."""
        L = lib()
        needed = c_size_t(0)
        buf = (c_char * 256)()
        status = L.tutti_job_error(self._p(), buf, 256, byref(needed))
        if status == -12 and needed.value > 256:
            buf = (c_char * needed.value)()
            status = L.tutti_job_error(self._p(), buf, needed.value, byref(needed))
        L.check(status, "tutti_job_error")
        return buf.value.decode("utf-8", "replace")


class Store(_Handle):
    """A store session: files reserved for new chunks, written by jobs, made visible by commit."""

    _destroy = "tutti_store_destroy"

    def __init__(self, ptr: c_void_p, runtime: _Handle, blocks: int):
        super().__init__(ptr)
        self.runtime = runtime
        self.blocks = blocks

    def submit(self, layers: range | None = None) -> Job:
        """Writes ``layers`` (default all) of the session's new blocks from engine memory."""
        layers = layer_range(layers, self.runtime.geometry.layers)
        out = c_void_p()
        lib().call("tutti_store_submit", self._p(), layers.start, len(layers), byref(out))
        return Job(out, "store", self.blocks, layers, self.runtime)

    def commit(self) -> StoreReport:
        """Makes the complete new blocks durable and visible to lookups (Busy while jobs run)."""
        words = max((self.blocks + 63) // 64, 1)
        bitmap = (c_uint64 * words)()
        rep = sized(_lib.StoreReport, failed_bitmap=bitmap, failed_bitmap_words=words)
        lib().call("tutti_store_commit", self._p(), byref(rep))
        return StoreReport(rep.stored, rep.present, rep.failed, _bits(bitmap, self.blocks))
