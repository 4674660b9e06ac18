"""The native loops' tests (and the hostile models that reach them) under AddressSanitizer.

The loader builds an instrumented library under its own cache key when
DELEGATE_NATIVE_SANITIZE=address; a Python host needs libasan preloaded, so
the tests run in a subprocess.  Any out-of-bounds access aborts it with ASan's
report, which this test shows.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NATIVE_HOSTILE = ("door or 262144 or grouped or depth_multiplier or every_known_op or outside_their_type"
                  " or test_integer_lstm or whole_rows_match or whatever_the_weights or moves_every_item"
                  " or rows_columns_or_one_value or batch_matmul_in_the_native_loops or numpys_formulation")
# Proves the instrumented library is the one loaded: built with the sanitizer, and calling into ASan (its
# report functions resolve only with libasan loaded, which they are here through LD_PRELOAD).
PROBE = ("from delegate_cpu.kernels import native; loops = native.native_loops(); "
         "assert loops is not None, 'no native loops'; "
         "assert '-fsanitize=address' in loops.flags, 'not an ASan build'")


def _libasan() -> str | None:
    compiler = shutil.which("gcc") or shutil.which("cc")
    if compiler is None:
        return None
    path = subprocess.run([compiler, "-print-file-name=libasan.so"], capture_output=True, text=True).stdout.strip()
    return path if os.path.isabs(path) and os.path.exists(path) else None


@pytest.mark.skipif(_libasan() is None, reason="no compiler with AddressSanitizer (libasan) on this machine")
def test_native_loops_under_address_sanitizer():
    env = dict(os.environ, DELEGATE_NATIVE_SANITIZE="address", LD_PRELOAD=_libasan(),
               ASAN_OPTIONS="detect_leaks=0:abort_on_error=1", PYTHONFAULTHANDLER="1")
    probe = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, env=env, capture_output=True, text=True,
                           timeout=300)
    assert probe.returncode == 0, probe.stderr[-3000:]
    # Of the hostile tests, those that reach the native loops or only validate: under ASan's
    # interceptor a C++ exception LiteRT throws (a model it refuses) aborts the process.
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                           "tests/ops/test_native.py", "tests/test_hostile.py", "tests/ops/test_lstm.py",
                           "tests/ops/test_shape_ops.py", "tests/ops/test_elementwise_smoke.py", "tests/ops/test_conv.py",
                           "tests/ops/test_hybrid.py", "-k",
                           NATIVE_HOSTILE],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    assert " passed" in done.stdout
