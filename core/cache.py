"""The one store of compiled artefacts (native libraries, kernel binaries, plans) that trusts nothing on disk.

What is stored ends up as code running as this user, so every step is checked:

* The directory is created 0700, component by component, without following a
  link; an existing one must belong to this user and be writable by nobody
  else, and a parent we did not create must not be writable by others (unless
  sticky, like /tmp: the ownership and no-link checks cover what others can do
  there).  Anything else is a CacheError (exit 9), a configuration error.
* A cache root carries a manifest (``.delegate-cache``) holding a random key;
  a non-empty directory without one is not a cache we made, and is refused
  (``delegate cache clear`` on a project directory must not delete it).
* All I/O goes through the directory's opened descriptor with ``O_NOFOLLOW``:
  a path swapped for a link after the checks is not followed; only regular
  files of this user, at most MAX_ENTRY_BYTES, are read (a FIFO or device is
  never opened for blocking reads).
* An entry is a JSON header line (format, key, kind, size, an HMAC of the
  payload under the manifest's key) and the payload.  It is returned only when
  all of that matches, so a payload changed and re-summed by anyone without the
  key is rebuilt, never loaded; writes go to a temporary file renamed into place.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import stat
import warnings
import weakref
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from .digest import compare_digest, hmac_sha256, sha256
from .errors import CacheError

FORMAT = "delegate-cache/2"
MANIFEST = ".delegate-cache"
TEMP_PREFIX = ".tmp-"
# Largest entry read or written: a kernel binary or plan is a few MB; anything bigger is not ours.
MAX_ENTRY_BYTES = 1 << 30
_HEADER_BYTES = 4096  # longest header line
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
log = logging.getLogger(__name__)


class CacheWarning(RuntimeWarning):
    """A cache entry was unusable and is being rebuilt."""


def cache_key(fields: dict[str, Any]) -> str:
    """Digest of everything an entry depends on (device, driver, sources, options, model)."""
    return sha256(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()


def ops_fingerprint(ops) -> str:
    """Digest of what ``ops`` compute: codes, versions, options, and every operand's type, quantization and
    constant bytes.  A cached plan keyed by a model token alone would survive new weights (issue 17 #8)."""
    digest = sha256()
    for op in ops:
        digest.update(json.dumps([op.opcode, op.version, op.options, op.custom_options], sort_keys=True,
                                 default=repr).encode())
        for t in [*op.inputs, *op.outputs]:
            if t is None:
                digest.update(b"-")
                continue
            q = t.quantization
            digest.update(json.dumps([t.index, t.dtype.name, t.shape, t.is_variable]).encode())
            if q is not None:
                digest.update(np.ascontiguousarray(q.scale, np.float64).tobytes())
                digest.update(np.ascontiguousarray(q.zero_point, np.int64).tobytes() + str(q.axis).encode())
            if t.data is not None:
                digest.update(np.ascontiguousarray(t.data).tobytes())
    return digest.hexdigest()


def _uid() -> int | None:
    return os.getuid() if hasattr(os, "getuid") else None


def _check_private(fd: int, path: Path) -> None:
    info = os.fstat(fd)
    if not stat.S_ISDIR(info.st_mode):
        raise CacheError(f"cache directory {path} exists and is not a directory")
    mode = stat.S_IMODE(info.st_mode)
    if mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise CacheError(f"cache directory {path} is writable by group or others (mode {mode:o}); "
                         f"refusing to load device code from it; chmod 700 it or choose another directory")
    if _uid() is not None and info.st_uid != _uid():
        raise CacheError(f"cache directory {path} belongs to another user (uid {info.st_uid})")


def _check_parent(fd: int, parent: Path, path: Path) -> None:
    """A directory we did not create but create inside: others must not be able to swap what we make."""
    info = os.fstat(fd)
    mode = stat.S_IMODE(info.st_mode)
    if mode & stat.S_IWOTH and not mode & stat.S_ISVTX:
        raise CacheError(f"cache directory {path}: its parent {parent} is writable by others (mode {mode:o}); "
                         f"choose a directory under your home")
    if _uid() is not None and info.st_uid not in (_uid(), 0) and mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise CacheError(f"cache directory {path}: its parent {parent} belongs to another user "
                         f"(uid {info.st_uid}) who could replace it")


def _open_in(fd: int, name: str, path: Path) -> int:
    """The directory ``name`` inside ``fd``, never through a link."""
    try:
        return os.open(name, _DIR_FLAGS | _NOFOLLOW, dir_fd=fd)
    except OSError as exc:
        if os.path.islink(path):
            raise CacheError(f"cache directory {path} is a symbolic link; give the real directory") from None
        raise CacheError(f"cache directory {path}: cannot open it ({exc.strerror})") from None


def open_private(path: str | os.PathLike) -> int:
    """A descriptor of the directory ``path``, created private where missing (see the module docstring)."""
    path = Path(os.path.abspath(os.path.expanduser(os.fspath(path))))
    existing, missing = path, []
    while not os.path.lexists(existing) and existing != existing.parent:
        missing.append(existing.name)
        existing = existing.parent
    try:
        fd = os.open(existing if missing or not existing.name else existing.parent, _DIR_FLAGS)
    except OSError as exc:
        raise CacheError(f"cache directory {path}: cannot open {existing} ({exc.strerror})") from None
    if not missing:
        if existing.name:
            parent, fd = fd, None
            try:
                fd = _open_in(parent, existing.name, path)
            finally:
                os.close(parent)
        try:
            _check_private(fd, path)
        except BaseException:
            os.close(fd)
            raise
        return fd
    try:
        _check_parent(fd, existing, path)
        for name in reversed(missing):
            try:
                os.mkdir(name, 0o700, dir_fd=fd)
            except FileExistsError:
                pass
            except OSError as exc:
                raise CacheError(f"cache directory {path}: cannot create it ({exc.strerror})") from None
            child = _open_in(fd, name, path)
            os.close(fd)
            fd = child
        _check_private(fd, path)
        return fd
    except BaseException:
        os.close(fd)
        raise


def _read_regular(dir_fd: int, name: str, limit: int | None = None, head: int | None = None) -> bytes | None:
    """The contents (or the first ``head`` bytes) of the regular file ``name`` of this user in ``dir_fd``;
    None when missing.  OSError(why) when it is a link, not a regular file, another user's, or over
    ``limit`` bytes (MAX_ENTRY_BYTES): a FIFO or device is never read from, nor a file past its size."""
    limit = MAX_ENTRY_BYTES if limit is None else limit
    try:
        fd = os.open(name, os.O_RDONLY | _NOFOLLOW | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0),
                     dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise OSError("a symbolic link" if exc.errno == errno.ELOOP else exc.strerror) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise OSError("not a regular file")
        if _uid() is not None and info.st_uid != _uid():
            raise OSError(f"owned by another user (uid {info.st_uid})")
        if info.st_size > limit:
            raise OSError(f"{info.st_size} bytes, more than the {limit} an entry may have")
        chunks, left = [], min(info.st_size, head if head is not None else info.st_size)
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 24))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _write_atomic(dir_fd: int, name: str, data: bytes, *, exclusive: bool = False) -> None:
    """``name`` in ``dir_fd`` holding ``data``, whole or not at all (exclusive: only if it does not exist)."""
    tmp = f"{TEMP_PREFIX}{os.urandom(8).hex()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o600,
                 dir_fd=dir_fd)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        if exclusive:
            os.link(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd, follow_symlinks=False)
        else:
            os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    finally:
        try:
            os.unlink(tmp, dir_fd=dir_fd)
        except FileNotFoundError:
            pass


class CacheRoot:
    """An opened cache directory and its manifest key; creates the manifest in an empty directory."""

    def __init__(self, path: str | os.PathLike, *, create: bool = True):
        self.path = Path(os.path.abspath(os.path.expanduser(os.fspath(path))))
        if not create and not os.path.lexists(self.path):
            raise CacheError(f"cache directory {self.path} does not exist")
        self.fd = open_private(self.path)
        weakref.finalize(self, os.close, self.fd)
        self.key = self._manifest_key(create)

    def _manifest_key(self, create: bool) -> bytes:
        for _ in range(2):
            key = self._read_manifest()
            if key is not None:
                return key
            others = [n for n in os.listdir(self.fd) if n != MANIFEST and not n.startswith(TEMP_PREFIX)]
            if others or not create:
                continue  # perhaps another process is creating it right now: look once more
            doc = {"format": FORMAT, "key": os.urandom(32).hex()}
            try:
                _write_atomic(self.fd, MANIFEST, json.dumps(doc).encode(), exclusive=True)
            except FileExistsError:
                continue
            except OSError as exc:
                raise CacheError(f"cache directory {self.path}: cannot write its manifest ({exc.strerror})") from None
        raise CacheError(f"{self.path} is not a delegate cache (it has no {MANIFEST} manifest"
                         f"{' and is not empty' if create else ''}); give an empty or new directory "
                         f"(one written by an earlier delegate version can simply be deleted)")

    def _read_manifest(self) -> bytes | None:
        try:
            raw = _read_regular(self.fd, MANIFEST, _HEADER_BYTES)
        except OSError as exc:
            raise CacheError(f"cache manifest {self.path / MANIFEST} is unusable: {exc}") from None
        if raw is None:
            return None
        try:
            doc = json.loads(raw)
            if doc.get("format") != FORMAT:
                raise ValueError
            return bytes.fromhex(doc["key"])
        except (ValueError, KeyError, TypeError, AttributeError):
            raise CacheError(f"cache manifest {self.path / MANIFEST} is not one this version wrote; "
                             f"delete the directory to start a new cache") from None

    def subdirectory(self, name: str) -> int:
        """Descriptor of the private directory ``name`` inside the root (created when missing)."""
        try:
            os.mkdir(name, 0o700, dir_fd=self.fd)
        except FileExistsError:
            pass
        except OSError as exc:
            raise CacheError(f"cache directory {self.path / name}: cannot create it ({exc.strerror})") from None
        fd = _open_in(self.fd, name, self.path / name)
        try:
            _check_private(fd, self.path / name)
        except BaseException:
            os.close(fd)
            raise
        return fd


def _header(raw: bytes) -> tuple[dict | None, bytes]:
    head, newline, _ = raw[:_HEADER_BYTES].partition(b"\n")
    try:
        header = json.loads(head) if newline else None
    except ValueError:
        header = None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        return None, b""
    return header, raw[len(head) + 1:]


class EntryStore:
    """Entries of one backend under ``directory/<backend>``, file names prefixed by ``namespace``."""

    def __init__(self, directory: str | os.PathLike, backend: str, namespace: str | None = None):
        self.root = CacheRoot(directory)
        self.fd = self.root.subdirectory(backend)
        weakref.finalize(self, os.close, self.fd)
        self.directory = self.root.path / backend
        self.namespace = "".join(c if c.isalnum() or c in "-_." else "_" for c in (namespace or "shared"))[:64]

    def name(self, key: str, kind: str) -> str:
        return f"{self.namespace}-{key[:32]}.{kind}"

    def path(self, key: str, kind: str) -> Path:
        return self.directory / self.name(key, kind)

    def has(self, key: str, kind: str) -> bool:
        try:
            os.stat(self.name(key, kind), dir_fd=self.fd, follow_symlinks=False)
            return True
        except FileNotFoundError:
            return False

    def _mac(self, key: str, kind: str, payload: bytes) -> str:
        return hmac_sha256(self.root.key, json.dumps([key, kind, len(payload)]).encode() + b"\0" + payload)

    def load(self, key: str, kind: str) -> bytes | None:
        """The payload stored under (key, kind), or None when missing or unusable (with a warning)."""
        name = self.name(key, kind)
        try:
            raw = _read_regular(self.fd, name)
        except OSError as exc:
            return self._unusable(name, f"unreadable ({exc})")
        if raw is None:
            return None
        header, payload = _header(raw)
        if header is None:
            return self._unusable(name, "not an entry of this format")
        if header.get("key") != key or header.get("kind") != kind:
            return self._unusable(name, "written for another device, source or options")
        if header.get("size") != len(payload) or not compare_digest(
                str(header.get("hmac")), self._mac(key, kind, payload)):
            return self._unusable(name, "checksum mismatch (corrupt, truncated or not written by this cache)")
        return payload

    def store(self, key: str, kind: str, payload: bytes) -> Path | None:
        """Write an entry atomically; a failed write is logged and only costs a rebuild later."""
        path = self.path(key, kind)
        if len(payload) > MAX_ENTRY_BYTES - _HEADER_BYTES:
            log.warning("cache: %s not stored: %d bytes is over the entry limit", path, len(payload))
            return None
        header = {"format": FORMAT, "key": key, "kind": kind, "size": len(payload),
                  "hmac": self._mac(key, kind, payload)}
        try:
            _write_atomic(self.fd, path.name, json.dumps(header, sort_keys=True).encode() + b"\n" + payload)
        except OSError as exc:
            log.warning("cache: could not write %s: %s", path, exc)
            return None
        return path

    @staticmethod
    def _unusable(name: str, why: str) -> None:
        warnings.warn(f"cache entry {name} is unusable: {why}; rebuilding it", CacheWarning, stacklevel=3)
        return None


def entries(directory: str | os.PathLike) -> Iterator[tuple[str, str, dict, int]]:
    """(subdirectory, file name, header, bytes) of every entry this cache wrote under ``directory``,
    which must be a cache (CacheError otherwise); what is not an entry of ours is skipped."""
    root = CacheRoot(directory, create=False)
    for sub in sorted(os.listdir(root.fd)):
        try:
            info = os.stat(sub, dir_fd=root.fd, follow_symlinks=False)
        except FileNotFoundError:
            continue
        if not stat.S_ISDIR(info.st_mode) or sub.startswith("."):
            continue
        fd = root.subdirectory(sub)
        try:
            for name in sorted(os.listdir(fd)):
                try:
                    raw = _read_regular(fd, name, head=_HEADER_BYTES)
                    size = os.stat(name, dir_fd=fd, follow_symlinks=False).st_size
                except OSError:
                    continue
                header, _ = _header(raw or b"")
                if header is not None and name.endswith(f".{header.get('kind')}"):
                    yield sub, name, header, size
        finally:
            os.close(fd)


def clear(directory: str | os.PathLike) -> int:
    """Delete the entries this cache wrote under ``directory`` (and its stale temporary files); nothing else.

    Returns how many entries went."""
    root = CacheRoot(directory, create=False)
    removed = 0
    for sub, name, _, _ in list(entries(directory)):
        fd = root.subdirectory(sub)
        try:
            os.unlink(name, dir_fd=fd)
            removed += 1
        except FileNotFoundError:
            pass
        finally:
            os.close(fd)
    return removed
