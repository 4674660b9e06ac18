"""What a CPU run keeps resident: its own hashes instead of OpenSSL's, no schema validator for plain
``--set`` values, and none of the GPU backends' rules though their plugins are discovered (peak RSS against
LiteRT's, issue 20)."""

from __future__ import annotations

import hashlib
import hmac
import os
import subprocess
import sys
from pathlib import Path

from delegate import digest

MODEL = Path(__file__).resolve().parent / "fixtures" / "converter" / "mobilenet_v2_035_96_int8.tflite"


def test_builtin_digests_equal_hashlib_and_hmac():
    for size in (0, 1, 63, 64, 65, 200):
        key, message = os.urandom(size), os.urandom(size * 3 + 1)
        assert digest.hmac_sha256(key, message) == hmac.new(key, message, hashlib.sha256).hexdigest()
        assert digest.sha256(message).hexdigest() == hashlib.sha256(message).hexdigest()
        assert digest.sha1(message).hexdigest() == hashlib.sha1(message).hexdigest()
        assert digest.blake2b(message, digest_size=16).hexdigest() == \
            hashlib.blake2b(message, digest_size=16).hexdigest()
    assert digest.compare_digest("ab", "ab") and not digest.compare_digest("ab", "ac")


def test_a_cpu_run_with_plain_settings_loads_neither_openssl_nor_jsonschema_nor_the_gpu_rules():
    script = f"""
import sys
import numpy as np
import delegate
from delegate.config import load_config
from delegate.inputs import numeric_dtype
from delegate.session import Session, run_settings
settings = run_settings(load_config(None, ["cpu.engine=numpy", "num_threads=2"], backends="cpu").for_model({str(MODEL)!r}))
session = Session(delegate.read_model(open({str(MODEL)!r}, "rb").read()), settings)
session.run_indexed(session.normalize_inputs([np.zeros(t.shape, numeric_dtype(t)) for t in session.graph.inputs]))
print(sorted(m for m in ("_hashlib", "hashlib", "jsonschema", "numpy.random", "delegate.gpu.fusion",
                          "delegate.gpu.support", "statistics", "difflib") if m in sys.modules))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
