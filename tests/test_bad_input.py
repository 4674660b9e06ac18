"""Malformed models end in one ModelFormatError naming what and where; nothing else escapes."""

import struct
import time
import tracemalloc

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from delegate import ModelFormatError, UnsupportedOpError, read_model
from delegate.tflite.builder import GraphBuilder
from delegate.tflite.writer import write_model
from tests.mediapipe import mediapipe_models

# A mutated model must load or fail within these bounds (the fuzz harness states them too).
MAX_SECONDS_PER_MODEL = 5.0
MAX_ALLOCATION_BYTES = 64 << 20


def small_model() -> bytes:
    b = GraphBuilder()
    x = b.input("x", (1, 4, 4, 3))
    y = b.op("ADD", [x, b.const("c", np.ones((3,), np.float32))], options={"fused_activation_function": "RELU"})
    b.output(b.op("MUL", [y, y], options={"fused_activation_function": "NONE"}))
    return b.to_bytes()


def one_line_error(data: bytes) -> str:
    with pytest.raises(ModelFormatError) as info:
        read_model(data)
    message = str(info.value)
    assert "\n" not in message and message
    return message


def test_truncated():
    data = small_model()
    for cut in (0, 3, 7, 16, len(data) // 4, len(data) // 2):
        one_line_error(data[:cut])


def test_wrong_identifier():
    data = bytearray(small_model())
    data[4:8] = b"NOPE"
    assert "file identifier" in one_line_error(bytes(data))


def test_random_bytes():
    rng = np.random.default_rng(0)
    for _ in range(50):
        blob = bytearray(rng.integers(0, 256, 200, dtype=np.uint8).tobytes())
        blob[4:8] = b"TFL3"
        one_line_error(bytes(blob))


def _mutate_model(mutate) -> bytes:
    model = read_model(small_model())
    mutate(model)
    return write_model(model)


def test_buffer_offset_outside_file():
    data = bytearray(write_model(read_model(small_model()), external_buffers=True))
    # the external payload is the last bytes: chop it so the recorded offset points past the end
    message = one_line_error(bytes(data[:-8]))
    assert "outside" in message or "past" in message


def test_negative_shape():
    def mutate(m):
        m.main.tensors[0].shape = (1, -4, 4, 3)
    assert "tensor 0" in one_line_error(_mutate_model(mutate))


def test_absurd_shape_refused_before_allocating():
    def mutate(m):
        m.main.tensors[0].shape = (1 << 20, 1 << 20, 4, 3)
    assert "bytes allowed" in one_line_error(_mutate_model(mutate))


def test_dangling_tensor_index():
    data = bytearray(small_model())
    model = read_model(bytes(data))
    # rewrite with an op input pointing past the tensor list
    model.main.ops[1].inputs[0] = None
    patched = bytearray(write_model(model))
    marker = struct.pack("<iii", 2, -1, 2)  # MUL inputs vector: length 2, [-1, 2]
    pos = bytes(patched).find(marker)
    assert pos > 0
    patched[pos + 4:pos + 8] = struct.pack("<i", 999)
    message = one_line_error(bytes(patched))
    assert "999" in message and "op #1" in message


def test_cyclic_graph():
    def mutate(m):
        g = m.main
        add, mul = g.ops
        add.inputs[0] = mul.outputs[0]
        g.inputs = []
    message = one_line_error(_mutate_model(mutate))
    assert "cycle" in message


def test_unknown_builtin_reads_and_is_reported_unsupported():
    from delegate.session import RunSettings, Session
    b = GraphBuilder()
    x = b.input("x", (2,))
    b.output(b.op("ABS", [x], shape=(2,)))
    model = read_model(b.to_bytes())
    model.main.ops[0].opcode = "BUILTIN_250"
    with pytest.raises(UnsupportedOpError) as info:
        Session(model, RunSettings())
    assert "op #0" in str(info.value) and "BUILTIN_250" in str(info.value)


def _check_outcome(data: bytes) -> None:
    tracemalloc.start()
    start = time.perf_counter()
    try:
        read_model(data)
    except ModelFormatError:
        pass
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    assert time.perf_counter() - start < MAX_SECONDS_PER_MODEL
    assert peak < MAX_ALLOCATION_BYTES + 4 * len(data)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(data=st.data())
def test_mutated_models_fail_cleanly(data):
    base = small_model()
    blob = bytearray(base)
    for _ in range(data.draw(st.integers(1, 8))):
        pos = data.draw(st.integers(0, len(blob) - 1))
        blob[pos] = data.draw(st.integers(0, 255))
    if data.draw(st.booleans()):
        blob = blob[:data.draw(st.integers(0, len(blob)))]
    _check_outcome(bytes(blob))


@pytest.mark.parametrize("name", ["hand_recrop.tflite", "selfie_segmentation.tflite"])
def test_mutated_real_models_fail_cleanly(name):
    base = mediapipe_models()[name].read_bytes()
    rng = np.random.default_rng(1)
    for _ in range(40):
        blob = bytearray(base)
        for pos in rng.integers(0, 4096, 6):  # the table region, where mutations hit structure
            blob[int(pos)] = int(rng.integers(0, 256))
        _check_outcome(bytes(blob))
