"""C libraries of the plugins, built on first use with the machine's C compiler and kept in the cache.

One mechanism for every plugin that has a native part (the CPU kernels' loops, the OpenCL
partition enqueue, the WebGPU dispatch recording): find a compiler, build the source once per source, compiler, flags and
machine in a private temporary directory, keep the library in the kernel cache (core/cache.py:
HMAC-checked entries) and load the verified bytes themselves.  Without a compiler, or when no
flag set builds, the caller gets the reason and runs its Python formulation instead.
"""

from __future__ import annotations

import ctypes
import logging
import os
import platform
import shlex
import shutil
import subprocess
import sysconfig
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import platformdirs

from .cache import EntryStore
from .digest import sha256

log = logging.getLogger(__name__)


@dataclass
class NativeBuild:
    """A loaded library and the flags it was built with, or (library None) why there is none."""

    library: ctypes.CDLL | None
    flags: list[str] = field(default_factory=list)
    reason: str = ""


def load_library(source: Path, flag_sets: Sequence[Sequence[str]], backend: str) -> NativeBuild:
    """``source`` built with the first of ``flag_sets`` the compiler takes (from the cache when it holds
    that build) and loaded; ``backend`` names the cache's subdirectory and the log lines."""
    compiler = find_compiler()
    if compiler is None:
        return _without(backend, "no C compiler found")
    try:
        text = source.read_bytes()
    except OSError as exc:
        return _without(backend, f"the native source is missing ({exc})")
    store = EntryStore(native_cache_dir(), backend, "native")
    for flags in flag_sets:
        flags = list(flags)
        key = entry_key(text, compiler, flags)
        library = store.load(key, "so")
        if library is None:
            library = compile_library(compiler, flags, source)
            if library is None:
                continue
            store.store(key, "so", library)
        try:
            return NativeBuild(open_library(library), flags)
        except OSError as exc:
            return _without(backend, f"the native library did not load ({exc})")
    return _without(backend, f"{' '.join(compiler)} could not build {source.name}")


def _without(backend: str, reason: str) -> NativeBuild:
    log.info("%s: %s; its Python formulation runs instead", backend, reason)
    return NativeBuild(None, reason=reason)


def entry_key(source: bytes, compiler: list[str], flags: list[str]) -> str:
    """The cache key of one build: source, compiler command, flags and machine."""
    return sha256(b"\0".join([source, " ".join(compiler + flags).encode(), _machine().encode()])).hexdigest()


def native_cache_dir() -> Path:
    """Where built libraries are kept (a cache of delegate.cache, with its checks)."""
    return Path(platformdirs.user_cache_dir("delegate")) / "native-loops"


def find_compiler() -> list[str] | None:
    """The C compiler command: $CC, Python's own, else cc, gcc or clang on the path."""
    configured = os.environ.get("CC") or sysconfig.get_config_var("CC") or ""
    for command in (shlex.split(configured), ["cc"], ["gcc"], ["clang"]):
        if command and shutil.which(command[0]):
            return command
    return None


def compile_library(compiler: list[str], flags: list[str], source: Path) -> bytes | None:
    """The library built in a private temporary directory, or None when the compiler fails."""
    with tempfile.TemporaryDirectory(prefix="delegate-native-") as tmp:
        built = Path(tmp) / "native.so"
        command = [*compiler, *flags, "-shared", "-fPIC", "-o", str(built), str(source)]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=120)
        except (OSError, subprocess.TimeoutExpired):
            return None
        if done.returncode != 0:
            log.debug("%s failed: %s", " ".join(command), done.stderr.strip())
            return None
        return built.read_bytes()


_OPEN_LIBRARIES: list[int] = []  # descriptors of the anonymous files libraries were loaded from


def open_library(library: bytes) -> ctypes.CDLL:
    """Load the verified bytes themselves, never a path someone could swap after the check: from an
    anonymous memory file where the system has one, else from a private temporary copy."""
    if not library.startswith(b"\x7fELF") and platform.system() == "Linux":
        raise OSError("not a shared library")
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("delegate-native", os.MFD_CLOEXEC)
        try:
            os.write(fd, library)
            loaded = ctypes.CDLL(f"/proc/self/fd/{fd}")
        except BaseException:
            os.close(fd)
            raise
        # the loader knows a library by its path: were the descriptor closed, the next library given the
        # same number would be taken for this one, so each stays open while the process runs
        _OPEN_LIBRARIES.append(fd)
        return loaded
    with tempfile.TemporaryDirectory(prefix="delegate-native-") as tmp:
        copy = Path(tmp) / "native.so"
        copy.write_bytes(library)
        return ctypes.CDLL(str(copy))


def _machine() -> str:
    """What -march=native depends on: the architecture and the CPU's model and features."""
    try:
        with open("/proc/cpuinfo") as info:
            lines = [line for line in info if line.startswith(("model name", "flags", "Features", "CPU part"))]
    except OSError:
        lines = []
    return platform.machine() + "".join(sorted(set(lines)))
