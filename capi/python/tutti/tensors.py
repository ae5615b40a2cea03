"""The little tutti needs from a tensor, behind one adapter.

tutti registers engine memory by address, so all it asks of a KV tensor is
its base address, shape, strides, element size and whether it lives on a
GPU. :func:`view` reads those from a torch tensor, a numpy array, or
:class:`HostTensor` (page-aligned host memory with the same surface as a
torch tensor, used by the tests and by engines without a GPU), and nothing
else in this package touches tensors directly.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

PAGE = 4096


@dataclass(frozen=True)
class TensorView:
    """Address and shape of a tensor; ``strides`` are in elements."""

    addr: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    element_size: int
    on_gpu: bool

    @property
    def nbytes(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n * self.element_size

    def is_contiguous(self) -> bool:
        expect = 1
        for dim, stride in zip(reversed(self.shape), reversed(self.strides)):
            if dim != 1 and stride != expect:
                return False
            expect *= dim
        return True


def view(t) -> TensorView:
    """Describes ``t`` (torch tensor, numpy array, or anything with the torch tensor surface)."""
    if hasattr(t, "data_ptr") and callable(t.data_ptr):
        shape = tuple(int(d) for d in t.shape)
        strides = tuple(int(s) for s in t.stride())
        device = getattr(t, "device", None)
        on_gpu = getattr(device, "type", device) not in (None, "cpu")
        return TensorView(int(t.data_ptr()), shape, strides, int(t.element_size()), bool(on_gpu))
    if hasattr(t, "__array_interface__"):
        ai = t.__array_interface__
        item = int(t.itemsize)
        shape = tuple(int(d) for d in ai["shape"])
        if ai.get("strides") is None:
            strides, acc = [], 1
            for d in reversed(shape):
                strides.append(acc)
                acc *= d
            strides = tuple(reversed(strides))
        else:
            strides = tuple(int(s) // item for s in ai["strides"])
        return TensorView(int(ai["data"][0]), shape, strides, item, False)
    raise TypeError(f"{type(t).__name__} is not a tensor: it has neither data_ptr() nor __array_interface__")


class CudaMarker:
    """A CUDA event recorded on the current stream after the kernels that wrote a tensor."""

    def __init__(self, device):
        import torch  # only reachable with torch tensors

        self.event = torch.cuda.Event()
        self.event.record(torch.cuda.current_stream(device))

    def done(self) -> bool:
        return bool(self.event.query())

    def wait(self) -> None:
        self.event.synchronize()


def mark_written(t):
    """A marker for "the work queued so far that writes ``t`` has finished", or None if it has.

    On a GPU the engine's kernels run asynchronously on a stream: a store that
    read the KV before the kernel writing it finished would store stale bytes.
    The marker lets the caller submit the store once the kernels are done
    without stalling the stream. Host memory is written synchronously: None.
    """
    device = getattr(t, "device", None)
    if getattr(device, "type", None) == "cuda":
        return CudaMarker(device)
    return None


class HostTensor:
    """Page-aligned, zeroed host memory shaped like a contiguous tensor.

    Exposes ``data_ptr()``, ``shape``, ``stride()``, ``element_size()``,
    ``device`` like a torch tensor, plus byte access for filling and checking.
    """

    def __init__(self, shape: tuple[int, ...], element_size: int):
        self.shape = tuple(int(d) for d in shape)
        self._element_size = int(element_size)
        n = 1
        for d in self.shape:
            if d <= 0:
                raise ValueError(f"shape {self.shape} has a non-positive dimension")
            n *= d
        self.nbytes = n * self._element_size
        self._raw = ctypes.create_string_buffer(self.nbytes + PAGE)
        base = ctypes.addressof(self._raw)
        self._addr = (base + PAGE - 1) // PAGE * PAGE
        self.device = "cpu"

    def data_ptr(self) -> int:
        return self._addr

    def element_size(self) -> int:
        return self._element_size

    def stride(self) -> tuple[int, ...]:
        out, acc = [], 1
        for d in reversed(self.shape):
            out.append(acc)
            acc *= d
        return tuple(reversed(out))

    def _check(self, offset: int, n: int) -> None:
        if offset < 0 or n < 0 or offset + n > self.nbytes:
            raise IndexError(f"bytes {offset}..{offset + n} outside a {self.nbytes}-byte tensor")

    def read(self, offset: int, n: int) -> bytes:
        self._check(offset, n)
        return ctypes.string_at(self._addr + offset, n)

    def write(self, offset: int, data: bytes) -> None:
        self._check(offset, len(data))
        ctypes.memmove(self._addr + offset, data, len(data))

    def fill(self, byte: int = 0) -> None:
        ctypes.memset(self._addr, byte, self.nbytes)
