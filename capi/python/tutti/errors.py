"""Status codes of libtutti and the exceptions they become.

Every libtutti call returns an ``int32_t`` status: 0 ok, 1 in progress,
negative an error. Each negative status has a Python exception class; the
exception carries the status value, its name as libtutti spells it
(``tutti_status_name``), the name of the C function that failed, and the
thread-local message libtutti left for this thread (``tutti_last_error``),
which says what exactly was wrong.
"""

from __future__ import annotations

OK = 0
IN_PROGRESS = 1


class TuttiError(Exception):
    """A libtutti call failed.

    Attributes:
        status: the negative status code.
        status_name: e.g. ``"TUTTI_E_INVALID_ARG"``.
        message: libtutti's last-error message for this thread.
        call: the C function that returned the status.
    """

    status: int = 0

    def __init__(self, status: int, status_name: str, message: str, call: str = ""):
        self.status = status
        self.status_name = status_name
        self.message = message
        self.call = call
        # libtutti's messages usually start with the function's name already.
        text = message or "(no message)"
        if call and not text.startswith(call):
            text = f"{call}: {text}"
        super().__init__(f"{text} [{status_name}]")


class InvalidArgument(TuttiError, ValueError):
    """A value is out of range, inconsistent, or an unknown enum value."""

    status = -1


class NullPointer(TuttiError, ValueError):
    """A required pointer was NULL."""

    status = -2


class StructSizeError(TuttiError):
    """A size-prefixed struct does not have the size this library expects (ABI mismatch)."""

    status = -3


class BadHandle(TuttiError):
    """The handle is not live (closed, destroyed twice, or of another type)."""

    status = -4


class NotFound(TuttiError, LookupError):
    """An unknown pin id."""

    status = -5


class NotRegistered(TuttiError):
    """No KV memory is registered on the runtime."""

    status = -6


class Timeout(TuttiError, TimeoutError):
    """A wait's deadline passed before the job or layer finished.

    ``job_status`` holds the job's progress at the deadline when libtutti
    reported it (waits fill the status even on a timeout).
    """

    status = -7
    job_status = None


class Busy(TuttiError):
    """Jobs or stores in flight prevent the call (e.g. re-registering KV memory)."""

    status = -8


class PoolFull(TuttiError):
    """No pool file is available."""

    status = -9


class IoError(TuttiError):
    """A device, driver or gio_uring error."""

    status = -10


class PoolError(TuttiError):
    """Pool metadata problem: no pool on the drives, mismatching geometry, corruption."""

    status = -11


class BufferTooSmall(TuttiError):
    """A caller buffer was too small."""

    status = -12


class Unsupported(TuttiError):
    """Not available in this build or on this machine (e.g. CUDA memory without a GPU)."""

    status = -13


class ProfileError(TuttiError):
    """Profiler or slack-table error."""

    status = -14


class InternalError(TuttiError):
    """The runtime's internal state is poisoned; the runtime is unusable."""

    status = -15


class Panic(TuttiError):
    """A Rust panic was caught at the C boundary."""

    status = -16


class AbiMismatch(RuntimeError):
    """The loaded libtutti speaks another ABI version than this package."""


class LibraryNotFound(OSError):
    """libtutti.so could not be found or loaded."""


_BY_STATUS: dict[int, type[TuttiError]] = {
    cls.status: cls
    for cls in (
        InvalidArgument,
        NullPointer,
        StructSizeError,
        BadHandle,
        NotFound,
        NotRegistered,
        Timeout,
        Busy,
        PoolFull,
        IoError,
        PoolError,
        BufferTooSmall,
        Unsupported,
        ProfileError,
        InternalError,
        Panic,
    )
}


def exception_class(status: int) -> type[TuttiError]:
    """The exception class for a negative status (``TuttiError`` for one this package does not know)."""
    return _BY_STATUS.get(status, TuttiError)
