"""On-disk kernel cache: program binaries and tuned work-group sizes, safe to share nothing.

Each entry is one file: a JSON header line (what the entry is for, the length
and SHA-256 of the payload) followed by the payload.  An entry is used only
when its header names exactly the key asked for and the payload matches its
checksum; anything else (a truncated write, bit rot, a file from another
driver) is reported with a warning and rebuilt, never loaded into a driver.
Writes go to a temporary file in the same directory and are renamed into
place, so readers see a whole entry or none.  The directory holds executable
code for the device, so it is created private (0700) and refused when other
users could write to it.
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

from delegate.errors import CacheError

MAGIC = "delegate-opencl-cache"
FORMAT = 1
log = logging.getLogger(__name__)


def cache_key(fields: dict[str, Any]) -> str:
    """Stable digest of everything an entry depends on."""
    return hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()


def secure_directory(path: Path) -> Path:
    """Create ``path`` private to this user, or refuse it when others may write there."""
    path = Path(path).expanduser()
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = path.stat()
    except OSError as exc:
        raise CacheError(f"kernel cache directory {path}: cannot create it ({exc.strerror})") from None
    if not stat.S_ISDIR(info.st_mode):
        raise CacheError(f"kernel cache directory {path}: exists and is not a directory")
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise CacheError(f"kernel cache directory {path} is writable by group or others "
                         f"(mode {stat.S_IMODE(info.st_mode):o}); refusing to load device code from it. "
                         f"Use chmod 700 or another directory")
    if hasattr(os, "getuid") and info.st_uid != os.getuid():
        raise CacheError(f"kernel cache directory {path} belongs to another user (uid {info.st_uid})")
    return path


class KernelCache:
    """Entries of one model (``namespace``, from the model token) in a private directory."""

    def __init__(self, directory: str | os.PathLike, namespace: str | None = None):
        self.directory = secure_directory(secure_directory(Path(directory)) / "opencl")
        self.namespace = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in (namespace or "shared"))

    def path(self, key: str, kind: str) -> Path:
        return self.directory / f"{self.namespace}-{key[:40]}.{kind}"

    def load(self, key: str, kind: str) -> bytes | None:
        """The payload stored under ``key``, or None (missing, or broken: then a warning)."""
        path = self.path(key, kind)
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            self._reject(path, f"unreadable ({exc.strerror})")
            return None
        head, sep, payload = raw.partition(b"\n")
        try:
            header = json.loads(head) if sep else None
        except ValueError:
            header = None
        if not isinstance(header, dict) or header.get("magic") != MAGIC or header.get("format") != FORMAT:
            self._reject(path, "not a cache entry of this format")
            return None
        if header.get("key") != key or header.get("kind") != kind:
            self._reject(path, "written for another device, driver, source or options")
            return None
        if header.get("size") != len(payload) or header.get("sha256") != hashlib.sha256(payload).hexdigest():
            self._reject(path, "checksum mismatch (corrupt or truncated)")
            return None
        return payload

    def store(self, key: str, kind: str, payload: bytes) -> None:
        """Write an entry atomically; a failure to write only costs a rebuild next time."""
        header = {"magic": MAGIC, "format": FORMAT, "key": key, "kind": kind, "size": len(payload),
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
            log.warning("kernel cache: could not write %s: %s", path, exc)

    def _reject(self, path: Path, why: str) -> None:
        warnings.warn(f"kernel cache entry {path.name} is unusable: {why}; rebuilding it", RuntimeWarning,
                      stacklevel=3)
