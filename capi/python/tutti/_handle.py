"""The base of every libtutti handle (runtime, job, store session), and the layer-range check
the runtime and store sessions share. Neither knows the other: ``runtime`` and ``jobs`` both
import from here.
"""

from __future__ import annotations

import threading
from ctypes import c_void_p

from ._lib import lib
from .errors import BadHandle


class _Handle:
    """An opaque libtutti handle released exactly once."""

    _destroy = ""

    def __init__(self, ptr: c_void_p):
        self._ptr = ptr
        self._lock = threading.Lock()

    @property
    def closed(self) -> bool:
        return not self._ptr

    def _p(self) -> c_void_p:
        # A closed handle never reaches libtutti again: its address may by
        # now belong to a new handle of the same type.
        if not self._ptr:
            raise BadHandle(BadHandle.status, "TUTTI_E_BAD_HANDLE", f"this {type(self).__name__} is closed")
        return self._ptr

    def close(self) -> None:
        """Releases the handle; closing again does nothing."""
        with self._lock:
            if not self._ptr:
                return
            ptr, self._ptr = self._ptr, None
        lib().call(self._destroy, ptr)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            if getattr(self, "_ptr", None):
                self.close()
        except Exception:
            pass


def layer_range(layers: range | None, num_layers: int) -> range:
    """``layers``, or every one of the model's ``num_layers`` when None; a contiguous range."""
    if layers is None:
        return range(0, num_layers)
    if not isinstance(layers, range) or layers.step != 1:
        raise ValueError(f"layers must be a contiguous range, got {layers!r}")
    return layers
