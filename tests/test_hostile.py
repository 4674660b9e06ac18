"""Hostile models (issue 17): each malformed one ends in ModelFormatError (exit 3) at the door, before
any kernel, engine or plugin sees it; what LiteRT accepts we compute as it does.

The command line runs them in a subprocess (several crashed the process before validation knew them).
"""

import json
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from flatbuffers import flexbuffers

import delegate
from delegate import CompileError, ExecutionError, ModelFormatError, read_model
from delegate.shapes import has_rule
from delegate.tflite.builder import GraphBuilder
from delegate.validate import OPERANDS, validate_graph

ROOT = Path(__file__).resolve().parents[1]
SAME = {"padding": "SAME", "stride_w": 1, "stride_h": 1}


def _one(opcode, inputs, shape, *, x=(1, 4, 4, 3), dtype="float32", quant=None, out_quant=None, out_dtype=None,
         **kwargs):
    """A model of one op on input ``x`` (passed to ``inputs`` as a builder and the input tensor)."""
    b = GraphBuilder()
    t = b.input("x", x, dtype, quant=quant)
    b.output(b.op(opcode, inputs(b, t), shape=shape, dtype=out_dtype, quant=out_quant, **kwargs))
    return b.to_bytes()


def _conv(opcode="CONV_2D", filt=(4, 3, 3, 3), bias=4, x=(1, 4, 4, 3), shape=(1, 4, 4, 4), **options):
    return _one(opcode, lambda b, t: [t, b.const("w", np.ones(filt, np.float32)),
                                      b.const("b", np.zeros(bias, np.float32))],
                shape, x=x, options={**SAME, **options})


def _int16x8_fully_connected(bias: int) -> bytes:
    """int16 inputs, int8 weights, an int64 bias holding ``bias`` (as the converter's int16x8 models, but for that)."""
    return _one("FULLY_CONNECTED", lambda b, t: [t, b.const("w", np.ones((3, 6), np.int8), quant=(0.01, 0)),
                                                 b.const("b", np.array([0, bias, 5], np.int64), quant=(1e-5, 0))],
                (1, 3), x=(1, 6), dtype="int16", quant=(0.001, 0), out_quant=(0.002, 0))


def _detection(options: bytes, anchors: int = 8, classes: int = 2) -> bytes:
    b = GraphBuilder()
    boxes = b.input("boxes", (1, anchors, 4))
    scores = b.input("scores", (1, anchors, classes + 1))
    prior = b.const("anchors", np.full((anchors, 4), 0.5, np.float32))
    b.output(*b.op("TFLite_Detection_PostProcess", [boxes, scores, prior], custom=True, custom_options=options,
                   shapes=[(1, 10, 4), (1, 10), (1, 10), (1,)]))
    return b.to_bytes()


def _detection_options(**changes) -> bytes:
    options = {"max_detections": 10, "max_classes_per_detection": 1, "detections_per_class": 100,
               "num_classes": 2, "nms_score_threshold": 0.3, "nms_iou_threshold": 0.6, "y_scale": 10.0,
               "x_scale": 10.0, "h_scale": 5.0, "w_scale": 5.0, "use_regular_nms": False, **changes}
    return flexbuffers.Dumps(options)


def _transpose_conv_bias(options: bytes) -> bytes:
    return _one("Convolution2DTransposeBias", lambda b, t: [t, b.const("w", np.ones((2, 3, 3, 3), np.float32)),
                                                            b.const("b", np.zeros(2, np.float32))],
                (1, 8, 8, 2), custom=True, custom_options=options)


def _int8_add(scale, zero_point=0) -> bytes:
    return _one("ADD", lambda b, t: [t, t], (1, 4), x=(1, 4), dtype="int8", quant=(scale, zero_point),
                out_quant=(0.1, 0))


def _diagonal_integer_lstm() -> bytes:
    """The converter's int8 LSTM marked as having diagonal recurrent weights (LiteRT crashes running it)."""
    from delegate.plugin_api import write_model
    model = read_model((ROOT / "tests/fixtures/converter/lstm_sequence_int8.tflite").read_bytes())
    model.main.ops[0].options["diagonal_recurrent_tensors"] = True
    model.main.serialized = None
    return write_model(model)


def _integer_lstm_weight_scale(value: float) -> bytes:
    """The converter's int8 LSTM with its forget gate's input weights at scale ``value``."""
    from delegate.plugin_api import write_model
    model = read_model((ROOT / "tests/fixtures/converter/lstm_sequence_int8.tflite").read_bytes())
    model.main.ops[0].inputs[2].quantization.scale = np.array([value], np.float32)
    model.main.serialized = None
    return write_model(model)


# name -> (malformed model, a word its message must hold)
CASES = {
    "pad negative channels": (_one("PAD", lambda b, t: [t, b.const("p", np.array([[0, 0], [0, 0], [0, 0], [0, -2]],
                                                                                 np.int32))], (1, 4, 4, 1)),
                              "paddings"),
    "pad output of another type": (_one("PAD", lambda b, t: [t, b.const("p", np.array([[0, 0], [0, 0], [0, 0], [0, 2]],
                                                                                     np.int32))], (1, 4, 4, 5),
                                        out_dtype="int8"), "type"),
    "depthwise filter channels": (_conv("DEPTHWISE_CONV_2D", (1, 3, 3, 5), 5, shape=(1, 4, 4, 5)), "multiple"),
    "depthwise with two inputs": (_one("DEPTHWISE_CONV_2D", lambda b, t: [t, b.const("w", np.ones((1, 3, 3, 3),
                                                                                               np.float32))],
                                       (1, 4, 4, 3), options=SAME), "inputs"),
    "conv dilation 0": (_conv(dilation_h_factor=0), "dilation_h_factor"),
    "conv dilation -1": (_conv(dilation_w_factor=-1), "dilation_w_factor"),
    "depthwise dilation 0": (_conv("DEPTHWISE_CONV_2D", (1, 3, 3, 3), 3, shape=(1, 4, 4, 3), dilation_w_factor=0),
                             "dilation_w_factor"),
    "conv stride -2": (_conv(stride_w=-2), "stride_w"),
    "conv stride 0": (_conv(stride_h=0), "stride_h"),
    "conv stride 2^15": (_conv(stride_h=2 ** 15), "stride_h"),
    "conv dilation 2^15": (_conv(dilation_w_factor=2 ** 15), "dilation_w_factor"),
    "depthwise stride 2^15": (_conv("DEPTHWISE_CONV_2D", (1, 3, 3, 3), 3, shape=(1, 1, 4, 3), stride_h=2 ** 15),
                              "stride_h"),
    "depthwise dilation 2^15": (_conv("DEPTHWISE_CONV_2D", (1, 3, 3, 3), 3, shape=(1, 4, 4, 3),
                                      dilation_h_factor=2 ** 15), "dilation_h_factor"),
    "fully connected keep_num_dims": (_one("FULLY_CONNECTED", lambda b, t: [t, b.const("w", np.ones((4, 3),
                                                                                                  np.float32))],
                                           (2, 4), x=(2, 6), options={"keep_num_dims": True}), "keep_num_dims"),
    "fully connected depth": (_one("FULLY_CONNECTED", lambda b, t: [t, b.const("w", np.ones((4, 3), np.float32))],
                                   (3, 4), x=(1, 10)), "multiple"),
    "resize zero height": (_one("RESIZE_BILINEAR", lambda b, t: [t, b.const("s", np.array([8, 8], np.int32))],
                                (1, 8, 8, 3), x=(1, 0, 4, 3)), "pixels"),
    "int8 add scale 0": (_int8_add(0.0), "scale"),
    "int8 add scale inf": (_int8_add(np.inf), "scale"),
    "int8 add scale nan": (_int8_add(np.nan), "scale"),
    "int8 zero point 2^40": (_int8_add(0.5, 2 ** 40), "zero point"),
    # LiteRT aborts the process preparing it (its output multiplier must stay below 1)
    "int8 add input scale 1e38": (_int8_add(1e38), "too small"),
    "int8 add input scale 1e5": (_int8_add(1e5), "too small"),
    "quantize scale 0": (_one("QUANTIZE", lambda b, t: [t], (1, 4), x=(1, 4), out_dtype="int8", out_quant=(0.0, 0)),
                         "scale"),
    "detection max_detections 2^31-1": (_detection(_detection_options(max_detections=2 ** 31 - 1)), "exceeds"),
    "detection garbage options": (_detection(b"\xff\x13garbage\x01"), "flexbuffer"),
    "add 3 inputs": (_one("ADD", lambda b, t: [t, t, t], (1, 4), x=(1, 4)), "inputs"),
    "add 10000 inputs": (_one("ADD", lambda b, t: [t] * 10_000, (1, 4), x=(1, 4)), "inputs"),
    "gather index -1": (_one("GATHER", lambda b, t: [t, b.const("i", np.array([-1], np.int32))], (1, 4, 3),
                             x=(4, 4, 3)), "out of range"),
    "strided slice shrink index past the axis": (
        _one("STRIDED_SLICE", lambda b, t: [t, *(b.const(n, np.array([v], np.int32)) for n, v in
                                                (("b", 2), ("e", 3), ("s", 1)))],
             (), x=(2,), dtype="int32", options={"shrink_axis_mask": 1}), "outside"),
    "offset slice with a mask": (
        _one("STRIDED_SLICE", lambda b, t: [t, *(b.const(n, np.array(v, np.int32)) for n, v in
                                                (("b", [0, 1]), ("e", [2, 1]), ("s", [1, 1])))],
             (2, 1), x=(2, 4), options={"offset": True, "begin_mask": 1, "end_mask": 1}), "masks"),
    "offset slice past the end": (
        _one("STRIDED_SLICE", lambda b, t: [t, *(b.const(n, np.array(v, np.int32)) for n, v in
                                                (("b", [0, 3]), ("e", [2, 3]), ("s", [1, 1])))],
             (2, 3), x=(2, 4), options={"offset": True}), "leaves"),
    "integer lstm with diagonal recurrent weights": (_diagonal_integer_lstm(), "diagonal"),
    "integer lstm weight scale 1e38": (_integer_lstm_weight_scale(1e38), "float32"),
    "int8 add broadcasting a per-channel operand": (
        _one("ADD", lambda b, t: [b.const("c", np.ones((3, 1, 1, 3), np.int8),
                                          quant=(np.full(3, 0.01, np.float32), np.zeros(3, np.int64), 0)), t],
             (3, 4, 4, 3), dtype="int8", quant=(0.05, 0), out_quant=(0.05, 0)), "per channel"),
    "softmax beta nan": (_one("SOFTMAX", lambda b, t: [t], (1, 4), x=(1, 4), options={"beta": float("nan")}), "beta"),
    "strided slice shrinking an axis stepped backwards": (
        _one("STRIDED_SLICE", lambda b, t: [t, *(b.const(n, np.array(v, np.int32)) for n, v in
                                                (("b", [0, -1]), ("e", [0, 0]), ("s", [1, -1])))],
             (2,), x=(2, 4), options={"begin_mask": 1, "end_mask": 1, "shrink_axis_mask": 2}), "positive stride"),
    "average pool filter 0": (_one("AVERAGE_POOL_2D", lambda b, t: [t], (1, 4, 4, 3),
                                   options={**SAME, "filter_height": 0, "filter_width": 2}), "filter_height"),
    "reshape product": (_one("RESHAPE", lambda b, t: [t, b.const("s", np.array([4, 2], np.int32))], (4, 2),
                             x=(1, 6)), "holds"),
    "int16x8 fully connected bias beyond the 64-bit rescale": (_int16x8_fully_connected(1 << 60), "2**47"),
    "int16x8 fully connected bias at the most negative int64": (_int16x8_fully_connected(-(1 << 63)), "2**47"),
    "int8 conv reading a per-channel input": (
        _one("CONV_2D", lambda b, t: [t, b.const("w", np.ones((2, 1, 1, 3), np.int8), quant=(0.01, 0)),
                                      b.const("b", np.zeros(2, np.int32), quant=(1e-4, 0))],
             (1, 4, 4, 2), dtype="int8", quant=(np.full(3, 0.01, np.float32), np.zeros(3, np.int64), 3),
             out_quant=(0.05, 0), options=SAME), "per channel"),
    "int16 mul output scale 1e-45": (
        _one("MUL", lambda b, t: [t, t], (1, 4, 4, 3), dtype="int16", quant=(0.001, 0), out_quant=(1e-45, 0),
             options={"fused_activation_function": "NONE"}), "too small"),
    "conv bias length": (_conv(bias=5), "bias"),
    "conv filter in-channels > input": (_conv(filt=(4, 3, 3, 4), x=(1, 4, 4, 2)), "multiple"),
    "transpose conv bias short options": (_transpose_conv_bias(struct.pack("<ii", 1, 2)), "12"),
    "transpose conv bias stride 0": (_transpose_conv_bias(struct.pack("<iii", 1, 0, 2)), "strides"),
}


@pytest.mark.parametrize("name", CASES)
def test_malformed_model_is_refused_at_the_door(name):
    data, word = CASES[name]
    model = read_model(data)
    with pytest.raises(ModelFormatError) as info:
        validate_graph(model.main)
    message = str(info.value)
    assert "\n" not in message and message.startswith("op #0 (") and word in message, message


# One subprocess for every case: the API (delegate.load) and the command line (delegate run), in turn.
_DRIVER = """
import json, sys
import delegate
from delegate.cli import main
results = {}
for path in sys.argv[1:]:
    try:
        delegate.load(path)
        api = "loaded"
    except Exception as exc:
        api = type(exc).__name__
    results[path] = [api, main(["run", path, "--runs", "1"])]
print(json.dumps(results))
"""


def test_shape_arithmetic_that_fails_at_compile_time_is_a_compile_error():
    """Shape arithmetic the numpy engine computes once at compile time (SHAPE -> GATHER -> RESHAPE) fails as
    a one-line CompileError naming the op, not a Python exception out of delegate.load."""
    b = GraphBuilder()
    x, y = b.input("x", (1, 16)), b.input("y", (1, 7))
    shapes = [b.op("SHAPE", [t], shape=(2,), dtype="int32", options={"out_type": 2}) for t in (x, y)]
    picked = b.op("GATHER", shapes, shape=(2,), dtype="int32", options={"axis": 0, "batch_dims": 0})  # index 7 of 2
    b.output(b.op("RESHAPE", [x, picked], shape=(1, 16), options={"new_shape": [1, 16]}), y)
    with pytest.raises(CompileError) as info:
        delegate.load(b.to_bytes(), backends=["cpu"], **{"cpu.engine": "numpy"})
    assert "\n" not in str(info.value) and "GATHER" in str(info.value), info.value


def test_malformed_models_in_subprocess_end_in_exit_3(tmp_path):
    paths = {}
    for i, (name, (data, _)) in enumerate(CASES.items()):
        paths[name] = tmp_path / f"case{i}.tflite"
        paths[name].write_bytes(data)
    done = subprocess.run([sys.executable, "-c", _DRIVER, *map(str, paths.values())], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    wrong = {name: results[str(p)] for name, p in paths.items() if results[str(p)] != ["ModelFormatError", 3]}
    assert not wrong, wrong
    assert done.stderr.count("delegate: error: op #0") == len(CASES)


def test_every_known_op_has_operand_rules():
    """A new op code cannot skip the door: each one with a shape rule or a CPU kernel has an entry."""
    from delegate_cpu import registry
    registry.load_all()
    known = set(registry.FLOAT_KERNELS) | set(registry.QUANT_KERNELS)
    from delegate.shapes import _RULES
    known |= set(_RULES)
    assert known and not sorted(code for code in known if code not in OPERANDS)
    from delegate.shapes import DECLARED_SHAPES
    assert all(has_rule(code) or code in DECLARED_SHAPES
               for code in set(registry.FLOAT_KERNELS) | set(registry.QUANT_KERNELS))


# -- what LiteRT accepts, we compute ------------------------------------------

@pytest.mark.parametrize("opcode", ["DEPTHWISE_CONV_2D", "CONV_2D"])
def test_window_of_262144_taps_matches_litert(opcode):
    """A 1x262144 filter (a 1 MB model): the native loops' tap lists once overflowed the stack."""
    from tests.oputil import check_against_litert
    rng = np.random.default_rng(0)
    taps = 262_144
    weights = rng.standard_normal((1, 1, taps, 1)).astype(np.float32)
    b = GraphBuilder()
    x = b.input("x", (1, 2, taps + 3, 1))  # VALID: LiteRT refuses SAME padding of half a filter this wide
    b.output(b.op(opcode, [x, b.const("w", weights), b.const("b", np.zeros(1, np.float32))],
                  options={**SAME, "padding": "VALID"}))
    inputs = [rng.standard_normal((1, 2, taps + 3, 1)).astype(np.float32)]
    check_against_litert(b.to_bytes(), inputs, builtin=True, rtol=1e-4)  # float32 sums of 262144 terms


def test_grouped_conv_matches_litert():
    """LiteRT accepts input channels that are a multiple of the filter's (groups): so do we."""
    from tests.oputil import check_against_litert
    rng = np.random.default_rng(1)
    b = GraphBuilder()
    x = b.input("x", (1, 5, 5, 4))
    b.output(b.op("CONV_2D", [x, b.const("w", rng.standard_normal((6, 3, 3, 2)).astype(np.float32)),
                              b.const("b", rng.standard_normal(6).astype(np.float32))], options=SAME))
    check_against_litert(b.to_bytes(), [rng.standard_normal((1, 5, 5, 4)).astype(np.float32)], builtin=True)


def test_depth_multiplier_option_is_ignored_as_litert_does():
    """LiteRT's builtin depthwise kernel takes the multiplier from the filter, whatever the option says."""
    from tests.oputil import check_against_litert
    rng = np.random.default_rng(2)
    b = GraphBuilder()
    x = b.input("x", (1, 4, 4, 3))
    b.output(b.op("DEPTHWISE_CONV_2D", [x, b.const("w", rng.standard_normal((1, 3, 3, 6)).astype(np.float32)),
                                        b.const("b", rng.standard_normal(6).astype(np.float32))],
                  options={**SAME, "depth_multiplier": 5}))
    check_against_litert(b.to_bytes(), [rng.standard_normal((1, 4, 4, 3)).astype(np.float32)], builtin=True)


def test_integer_inputs_outside_their_type_are_refused():
    """300 for an int8 input used to wrap to 44; LiteRT refuses a wrong type outright."""
    import delegate
    b = GraphBuilder()
    x = b.input("x", (1, 4), "int32")
    b.output(b.op("ADD", [x, x]))
    b8 = GraphBuilder()
    x8 = b8.input("x", (1, 4), "int8")
    b8.output(b8.op("MAXIMUM", [x8, x8]))
    session = delegate.load(b8.to_bytes(), backends=["cpu"])
    with pytest.raises(ExecutionError, match="do not fit"):
        session.run([np.array([[300, 0, 1, 2]], np.int64)])
    out = session.run([np.array([[-128, 0, 1, 127]], np.int64)])
    assert list(out.values())[0].tolist() == [[-128, 0, 1, 127]]
    wide = delegate.load(b.to_bytes(), backends=["cpu"])
    with pytest.raises(ExecutionError, match="do not fit"):
        wide.run([np.array([[2 ** 40, 0, 1, 2]], np.int64)])


def test_absent_option_table_means_litert_zeros():
    """SOFTMAX without its option table: LiteRT's beta is 0 (uniform outputs), not 1 (found by the fuzzer)."""
    from tests.oputil import check_against_litert
    b = GraphBuilder()
    x = b.input("x", (1, 8))
    b.output(b.op("SOFTMAX", [x], options={"beta": 1.0}))
    b.ops[0].options, b.ops[0].options_type = {}, None  # written without a table
    data = b.to_bytes()
    assert read_model(data).main.ops[0].options == {"beta": 0.0}
    check_against_litert(data, [np.arange(8, dtype=np.float32)[None]], builtin=True)


def test_litert_refusal_under_engine_auto_is_reported():
    """A validated partition LiteRT refuses (a CONV_2D without bias) runs on the numpy engine, and says why."""
    import delegate
    b = GraphBuilder()
    x = b.input("x", (1, 4, 4, 3))
    b.output(b.op("CONV_2D", [x, b.const("w", np.ones((2, 3, 3, 3), np.float32)), None], options=SAME))
    session = delegate.load(b.to_bytes(), backends=["cpu"], **{"cpu.engine": "auto"})
    described = session.executor.compiled[0].describe()
    assert described["engine"] == "numpy" and "LiteRT could not take partition 0" in described["litert_refused"]
    out = list(session.run([np.ones((1, 4, 4, 3), np.float32)]).values())[0]
    assert out[0, 1, 1].tolist() == [27.0, 27.0]  # an interior pixel: 3x3x3 ones


def _shape_read_twice_at_every_step(depth: int) -> bytes:
    """RESHAPE(RELU(x), s) where s is SHAPE(x) through ``depth`` MAXIMUM(s, s): 2^depth paths back to the SHAPE."""
    b = GraphBuilder()
    x = b.input("x", (1, 4, 4, 8))
    s = b.op("SHAPE", [x], dtype="int32", shape=(4,), options={"out_type": 2})
    for _ in range(depth):
        s = b.op("MAXIMUM", [s, s], dtype="int32", shape=(4,))
    b.output(b.op("RESHAPE", [b.op("RELU", [x]), s], shape=(1, 4, 4, 8)))
    return b.to_bytes()


def test_shape_arithmetic_reading_one_value_twice_at_every_step_is_walked_once_an_op():
    """Compile-time shape arithmetic (``shapes.static_op``) visits each op once: a crafted chain reading one value
    twice at every step has 2^n paths (40 steps: a search by paths would never end), and a chain deeper than
    STATIC_DEPTH is left to run (searched no deeper, so thousands of ops cannot exhaust Python's stack)."""
    from delegate.shapes import STATIC_DEPTH, static_op, static_value

    graph = read_model(_shape_read_twice_at_every_step(40)).main
    last = graph.ops[-3]
    assert static_op(last) and list(static_value(last.outputs[0])) == [1, 4, 4, 8]
    x = np.random.default_rng(0).standard_normal((1, 4, 4, 8)).astype(np.float32)
    session = delegate.load(_shape_read_twice_at_every_step(40), backends=["cpu"], **{"cpu.engine": "numpy"})
    np.testing.assert_array_equal(list(session.run([x]).values())[0], np.maximum(x, 0))
    for depth, static in ((STATIC_DEPTH - 1, True), (STATIC_DEPTH, False), (5000, False)):
        graph = read_model(_shape_read_twice_at_every_step(depth)).main
        assert static_op(graph.ops[-3]) is static
