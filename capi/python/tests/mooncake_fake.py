"""An in-process stand-in for Mooncake Store's Python client (``MooncakeDistributedStore``).

It keeps objects in one ``FakeCluster`` shared by every client made from it, with the real
client's return conventions as observed on mooncake-transfer-engine 0.3.13: ``batch_is_exist``
gives 1/0 (negative on RPC failure), ``get_batch`` gives ``b""`` for a missing key, the
multi-buffer get returns the bytes read or a negative error (-704 not found, -600 buffer too
small), a put of an existing key keeps the old value and returns 0. Tests can make every call
fail (``down``) or block until released (``hang``), and count calls.
"""

from __future__ import annotations

import ctypes
import threading

NOT_FOUND = -704
TOO_SMALL = -600
RPC_FAIL = -900


class FakeCluster:
    def __init__(self):
        self.objects: dict[str, bytes] = {}
        self.down = False
        self.hang: dict[str, threading.Event] = {}  # method name -> released when set
        self.blocked: dict[str, int] = {}  # method name -> calls blocked right now
        self.calls: dict[str, int] = {}
        self.calls_by_thread: dict[tuple[str, str], int] = {}  # (method, thread name) -> calls
        self.before: dict[str, object] = {}  # method name -> callable run at the start of each call
        self.lock = threading.Lock()

    def block(self, method: str) -> threading.Event:
        ev = threading.Event()
        self.hang[method] = ev
        return ev

    def _enter(self, method: str) -> None:
        with self.lock:
            self.calls[method] = self.calls.get(method, 0) + 1
            who = (method, threading.current_thread().name)
            self.calls_by_thread[who] = self.calls_by_thread.get(who, 0) + 1
        ev = self.hang.get(method)
        if ev is not None:
            with self.lock:
                self.blocked[method] = self.blocked.get(method, 0) + 1
            released = ev.wait(30)  # bounded: a test that forgets to release still ends
            with self.lock:
                self.blocked[method] -= 1
            assert released, f"fake Mooncake: {method} was never released"
        hook = self.before.get(method)
        if hook is not None:
            hook()


class FakeStore:
    def __init__(self, cluster: FakeCluster):
        self.c = cluster
        self.hostname = ""

    def setup(self, local_hostname, metadata_server, segment_bytes, buffer_bytes, protocol, device, master):
        self.c._enter("setup")
        if self.c.down:
            return RPC_FAIL
        self.hostname = f"{local_hostname}:12345"
        return 0

    def get_hostname(self):
        return self.hostname

    def register_buffer(self, addr, n):
        self.c._enter("register_buffer")
        return 0

    def batch_is_exist(self, keys):
        self.c._enter("batch_is_exist")
        if self.c.down:
            return [RPC_FAIL] * len(keys)
        return [1 if k in self.c.objects else 0 for k in keys]

    def get_batch(self, keys):
        self.c._enter("get_batch")
        if self.c.down:
            raise RuntimeError("fake Mooncake: master unreachable")
        return [self.c.objects.get(k, b"") for k in keys]

    def batch_get_into_multi_buffers(self, keys, all_ptrs, all_sizes):
        self.c._enter("batch_get_into_multi_buffers")
        out = []
        for key, ptrs, sizes in zip(keys, all_ptrs, all_sizes):
            data = self.c.objects.get(key)
            if self.c.down:
                out.append(RPC_FAIL)
                continue
            if data is None:
                out.append(NOT_FOUND)
                continue
            if len(data) > sum(sizes):
                out.append(TOO_SMALL)
                continue
            at = 0
            for p, n in zip(ptrs, sizes):
                chunk = data[at: at + n]
                ctypes.memmove(p, chunk, len(chunk))
                at += len(chunk)
            out.append(len(data))
        return out

    def batch_put_from_multi_buffers(self, keys, all_ptrs, all_sizes, config=None):
        self.c._enter("batch_put_from_multi_buffers")
        out = []
        for key, ptrs, sizes in zip(keys, all_ptrs, all_sizes):
            if self.c.down:
                out.append(RPC_FAIL)
                continue
            if key not in self.c.objects:
                self.c.objects[key] = b"".join(ctypes.string_at(p, n) for p, n in zip(ptrs, sizes))
            out.append(0)
        return out

    def put_batch(self, keys, values, config=None):
        self.c._enter("put_batch")
        if self.c.down:
            return RPC_FAIL
        for k, v in zip(keys, values):
            self.c.objects.setdefault(k, bytes(v))
        return 0

    def close(self):
        self.c._enter("close")
        return 0
