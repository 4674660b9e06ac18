"""A private, checksummed store of compiled artefacts (kernel sources, plans, binaries) per backend.

An entry is one file: a JSON header line (format, key, payload length and
SHA-256) followed by the payload.  It is returned only when the header names
the key asked for and the payload matches its checksum; otherwise the caller
gets None and a warning, and rebuilds.  Entries are written to a temporary
file in the same directory and renamed into place, so a reader sees a whole
entry or nothing.  What is stored ends up on the device, so the directory is
created 0700 and refused when group or others can write to it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import stat
import tempfile
import warnings
from pathlib import Path
from typing import Any

from ..errors import CacheError

FORMAT = "delegate-gpu-cache/1"
log = logging.getLogger(__name__)


class CacheWarning(RuntimeWarning):
    """A cache entry was unusable and is being rebuilt."""


def cache_key(fields: dict[str, Any]) -> str:
    """Digest of everything an entry depends on (device, driver, sources, options, model)."""
    return hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()


def private_directory(path: str | os.PathLike) -> Path:
    """``path`` created private to this user; CacheError when others could write into it."""
    path = Path(path).expanduser()
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = path.stat()
    except OSError as exc:
        raise CacheError(f"cache directory {path}: cannot create it ({exc.strerror})") from None
    if not stat.S_ISDIR(info.st_mode):
        raise CacheError(f"cache directory {path} exists and is not a directory")
    mode = stat.S_IMODE(info.st_mode)
    if mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise CacheError(f"cache directory {path} is writable by group or others (mode {mode:o}); "
                         f"refusing to load device code from it; chmod 700 it or choose another directory")
    if hasattr(os, "getuid") and info.st_uid != os.getuid():
        raise CacheError(f"cache directory {path} belongs to another user (uid {info.st_uid})")
    return path


class EntryStore:
    """Entries of one backend under ``directory/<backend>``, file names prefixed by ``namespace``."""

    def __init__(self, directory: str | os.PathLike, backend: str, namespace: str | None = None):
        self.directory = private_directory(private_directory(directory) / backend)
        self.namespace = "".join(c if c.isalnum() or c in "-_." else "_" for c in (namespace or "shared"))[:64]

    def path(self, key: str, kind: str) -> Path:
        return self.directory / f"{self.namespace}-{key[:32]}.{kind}"

    def load(self, key: str, kind: str) -> bytes | None:
        """The payload stored under (key, kind), or None when missing or unusable (with a warning)."""
        path = self.path(key, kind)
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            return self._unusable(path, f"unreadable ({exc.strerror})")
        head, newline, payload = raw.partition(b"\n")
        try:
            header = json.loads(head) if newline else None
        except ValueError:
            header = None
        if not isinstance(header, dict) or header.get("format") != FORMAT:
            return self._unusable(path, "not an entry of this format")
        if header.get("key") != key or header.get("kind") != kind:
            return self._unusable(path, "written for another device, source or options")
        if header.get("size") != len(payload) or header.get("sha256") != hashlib.sha256(payload).hexdigest():
            return self._unusable(path, "checksum mismatch (corrupt or truncated)")
        return payload

    def store(self, key: str, kind: str, payload: bytes) -> Path | None:
        """Write an entry atomically; a failed write is logged and only costs a rebuild later."""
        header = {"format": FORMAT, "key": key, "kind": kind, "size": len(payload),
                  "sha256": hashlib.sha256(payload).hexdigest()}
        path = self.path(key, kind)
        try:
            fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=self.directory)
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(json.dumps(header, sort_keys=True).encode() + b"\n" + payload)
                os.replace(tmp, path)
            except BaseException:
                os.unlink(tmp)
                raise
        except OSError as exc:
            log.warning("cache: could not write %s: %s", path, exc)
            return None
        return path

    @staticmethod
    def _unusable(path: Path, why: str) -> None:
        warnings.warn(f"cache entry {path.name} is unusable: {why}; rebuilding it", CacheWarning, stacklevel=3)
        return None
