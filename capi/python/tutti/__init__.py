"""tutti: KV-cache tensors on NVMe drives, from Python.

A ctypes binding over libtutti (the C ABI in ``capi/include/tutti.h``) and a
vLLM KV connector (:mod:`tutti.vllm`). The library is loaded on first use
(see :mod:`tutti._lib` for where it is looked for; ``$TUTTI_LIB`` wins).
"""

from .errors import (
    AbiMismatch,
    BadHandle,
    BufferTooSmall,
    Busy,
    InternalError,
    InvalidArgument,
    IoError,
    LibraryNotFound,
    NotFound,
    NotRegistered,
    NullPointer,
    Panic,
    PoolError,
    PoolFull,
    ProfileError,
    StructSizeError,
    Timeout,
    TuttiError,
    Unsupported,
)
from .jobs import Job, JobStatus, Store, StoreReport
from .runtime import (
    DataPath,
    Geometry,
    Lookup,
    Runtime,
    RuntimeInfo,
    Stats,
    TableSizes,
    abi_version,
    chain_hashes,
    clock_ns,
)
from .tensors import HostTensor, TensorView, view

__all__ = [
    "AbiMismatch",
    "DataPath",
    "BadHandle",
    "BufferTooSmall",
    "Busy",
    "InternalError",
    "InvalidArgument",
    "IoError",
    "LibraryNotFound",
    "NotFound",
    "NotRegistered",
    "NullPointer",
    "Panic",
    "PoolError",
    "PoolFull",
    "ProfileError",
    "StructSizeError",
    "Timeout",
    "TuttiError",
    "Unsupported",
    "Geometry",
    "Job",
    "JobStatus",
    "Lookup",
    "Runtime",
    "RuntimeInfo",
    "Stats",
    "Store",
    "StoreReport",
    "TableSizes",
    "abi_version",
    "chain_hashes",
    "clock_ns",
    "HostTensor",
    "TensorView",
    "view",
]
