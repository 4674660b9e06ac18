"""The IR's textual form (golden), producer/use links, topological order and the arena planner."""

import numpy as np
import pytest

from delegate import read_model
from delegate.memory import ALIGNMENT, aligned_zeros, plan_arena
from delegate.tflite.builder import GraphBuilder

GOLDEN = """\
subgraph 'main' (%0 'x': float32[?,4,4,3])
  #0 %3 'conv': float32[1,4,4,2] = CONV_2D.v1(%0, %1:const float32[2,1,1,3], %2:const float32[2]) \
{padding=SAME, stride_w=1, stride_h=1, fused_activation_function=RELU6, dilation_w_factor=1, dilation_h_factor=1, \
quantized_bias_type=0}
  #1 %5 'reshape': float32[1,32] = RESHAPE.v1(%3, %4:const int32[2]) {new_shape=[1,32]}
  #2 %6 'softmax': float32[1,32] = SOFTMAX.v1(%5) {beta=1}
  return %6"""


def build():
    b = GraphBuilder()
    x = b.input("x", (1, 4, 4, 3), shape_signature=(-1, 4, 4, 3))
    y = b.op("CONV_2D", [x, b.const("w", np.ones((2, 1, 1, 3))), b.const("b", np.zeros(2))],
             options={"padding": "SAME", "stride_w": 1, "stride_h": 1, "fused_activation_function": "RELU6"},
             name="conv")
    y = b.op("RESHAPE", [y, b.const("shape", np.array([1, 32], np.int32))], options={"new_shape": [1, 32]})
    b.output(b.op("SOFTMAX", [y], options={"beta": 1.0}))
    return read_model(b.to_bytes())


def test_text_form_golden():
    assert str(build().main) == GOLDEN


def test_links_and_order():
    g = build().main
    conv, reshape, softmax = g.ops
    assert g.tensors[3].producer is conv and g.tensors[3].uses == [reshape]
    assert g.tensors[1].is_constant and not g.tensors[0].is_constant
    assert g.topological_order() == [conv, reshape, softmax]
    assert g.opcode_counts() == {"CONV_2D": 1, "RESHAPE": 1, "SOFTMAX": 1}


def test_constants_are_views_of_the_model_bytes():
    b = GraphBuilder()
    x = b.input("x", (4,))
    b.output(b.op("ADD", [x, b.const("c", np.arange(4, dtype=np.float32))], options={}))
    data = b.to_bytes()
    model = read_model(data)
    const = model.main.tensors[1].data
    assert not const.flags.owndata and not const.flags.writeable
    np.testing.assert_array_equal(const, np.arange(4))


def test_arena_reuses_memory_by_lifetime():
    b = GraphBuilder()
    t = b.input("x", (1, 64))
    for _ in range(6):
        t = b.op("RELU", [t])
    b.output(t)
    g = read_model(b.to_bytes()).main
    intermediates = [op.outputs[0] for op in g.ops[:-1]]
    arena, views = plan_arena(g.ops, intermediates)
    assert arena.nbytes <= 2 * 256  # five 256-byte tensors, at most two alive at once
    for a, b_ in zip(g.ops[:-2], g.ops[1:-1]):  # producer and consumer never share memory
        assert not np.shares_memory(views[a.outputs[0].index], views[b_.outputs[0].index])
    # every view starts on a cache line (64-byte vectors never straddle two)
    assert all(view.ctypes.data % ALIGNMENT == 0 for view in views.values())


def test_aligned_zeros_start_on_a_cache_line():
    for shape, dtype in (((3, 5), np.float32), (7, np.int8), ((), np.float64), ((0,), np.int32)):
        a = aligned_zeros(shape, dtype)
        assert a.shape == np.zeros(shape, dtype).shape and a.dtype == dtype and a.flags.c_contiguous
        assert (a.size == 0 or a.ctypes.data % ALIGNMENT == 0) and not a.any()
    with pytest.raises(ValueError, match="negative"):
        aligned_zeros((-1, 3), np.float32)  # as np.zeros: never a reshape that infers the -1


def test_sessions_have_glibc_keep_freed_memory():
    """A session sets glibc's thresholds once, so a run's dropped outputs are reused, not unmapped."""
    import platform

    from delegate import memory
    from delegate.session import Session
    from tests.models import conv_then_relu

    Session(read_model(conv_then_relu(np.random.default_rng(0)))).close()
    glibc = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"
    assert memory._allocator_set is glibc
    assert memory.keep_freed_host_memory() is glibc
