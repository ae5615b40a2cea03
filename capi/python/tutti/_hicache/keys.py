"""SGLang page keys as tutti chunk hashes.

SGLang names a page by a hex SHA-256 string that already chains the whole prefix
(``get_hash_str(tokens, prior_hash)``), so a key maps to a 16-byte tutti hash with no
chaining of our own. A 64-digit hex key becomes the first 16 bytes it encodes; any other
string (keys of other shapes, tools that name pages themselves) becomes its BLAKE2b-128.
The rule is per key, so one key maps to one hash whatever batch it comes in.

The common case (every key 64 hex digits) is converted for the whole batch at once: one
join, one ``bytes.fromhex``, one strided copy; no Python code runs per key.
"""

from __future__ import annotations

import hashlib
from typing import Sequence

HEX_KEY_CHARS = 64
HASH_BYTES = 16
_PERSON = b"tutti-sglang"


class KeyTypeError(TypeError):
    """A key is not a string."""


def _check_list(keys) -> None:
    if isinstance(keys, (str, bytes)) or not isinstance(keys, Sequence):
        raise KeyTypeError(
            f"tutti.sglang: keys must be a list of str (SGLang page hashes), got {type(keys).__name__}"
        )


def _bad_key(keys: Sequence) -> KeyTypeError:
    for i, k in enumerate(keys):
        if not isinstance(k, str):
            return KeyTypeError(
                f"tutti.sglang: key {i} is {type(k).__name__} ({k!r:.60}), not str; SGLang names pages by "
                "hex hash strings"
            )
    return KeyTypeError("tutti.sglang: keys must be str")


def _one(key: str) -> bytes:
    if len(key) == HEX_KEY_CHARS:
        try:
            return bytes.fromhex(key)[:HASH_BYTES]
        except ValueError:
            pass
    return hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=HASH_BYTES, person=_PERSON).digest()


def key_hashes(keys: Sequence[str]) -> bytes:
    """``len(keys)`` tutti hashes laid end to end (:func:`tutti.runtime.packed_hashes` takes them).

    Raises :class:`KeyTypeError` naming the first key that is not a string.
    """
    _check_list(keys)
    n = len(keys)
    if n == 0:
        return b""
    try:
        joined = "".join(keys)
    except TypeError:
        raise _bad_key(keys) from None
    if len(joined) == n * HEX_KEY_CHARS and set(map(len, keys)) == {HEX_KEY_CHARS}:
        try:
            raw = bytes.fromhex(joined)
        except ValueError:
            raw = None
        if raw is not None:
            # Every key's first 16 of its 32 bytes, sliced by builtins (no bytecode per key).
            step = 2 * HASH_BYTES
            cuts = map(slice, range(0, n * step, step), range(HASH_BYTES, n * step, step))
            return b"".join(map(raw.__getitem__, cuts))
    return b"".join(map(_one, keys))
