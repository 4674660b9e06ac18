"""SHA-256, SHA-1, BLAKE2b and HMAC-SHA256 from CPython's own hash modules, not OpenSSL's.

``import hashlib`` (and ``hmac``, ``secrets``) loads OpenSSL's libcrypto, 3.5 MB resident, and every
run hashes (cache keys, cost-profile fingerprints, the native library's HMAC check).  CPython's
built-in implementations give the same digests; a Python built without them falls back to hashlib.
"""

from __future__ import annotations

try:
    from _blake2 import blake2b
    from _sha1 import sha1
    try:
        from _sha2 import sha256  # Python 3.12+
    except ImportError:
        from _sha256 import sha256
    from _operator import _compare_digest as compare_digest
except ImportError:  # a build without CPython's own hashes
    from hashlib import blake2b, sha1, sha256
    from hmac import compare_digest

__all__ = ["blake2b", "compare_digest", "hmac_sha256", "sha1", "sha256"]

_BLOCK = 64  # SHA-256's block size in bytes


def hmac_sha256(key: bytes, message: bytes) -> str:
    """HMAC-SHA256 of ``message`` as hex (RFC 2104; equal to ``hmac.new(key, message, "sha256").hexdigest()``)."""
    if len(key) > _BLOCK:
        key = sha256(key).digest()
    key = key.ljust(_BLOCK, b"\0")
    inner = sha256(bytes(b ^ 0x36 for b in key))
    inner.update(message)
    return sha256(bytes(b ^ 0x5C for b in key) + inner.digest()).hexdigest()
