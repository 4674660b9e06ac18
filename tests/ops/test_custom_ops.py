"""Golden tests of the custom ops: TFLite_Detection_PostProcess (regular and fast NMS) and MediaPipe's
Convolution2DTransposeBias and MaxUnpooling2D (indices of any value)."""

from pathlib import Path

import numpy as np
import pytest
from flatbuffers import flexbuffers
from hypothesis import given, strategies as st

from delegate import load
from delegate.tflite.builder import GraphBuilder
from tests.models import transpose_conv_bias_pair
from tests.conformance_cases import mediapipe_pool_options
from tests.oputil import assert_close, delegate_run, litert_run, require_backend

CPU_CONFIG = Path(__file__).resolve().parents[2] / "configs" / "cpu.yaml"


def _detection_model(num_boxes, num_classes, background, anchors, options):
    b = GraphBuilder()
    boxes = b.input("boxes", (1, num_boxes, 4))
    scores = b.input("scores", (1, num_boxes, num_classes + background))
    outs = b.op("TFLite_Detection_PostProcess", [boxes, scores, b.const("anchors", anchors)], custom=True,
                custom_options=flexbuffers.Dumps(options), num_outputs=4, dtype="float32")
    b.output(*outs)
    return b.to_bytes()


def _anchors(rng, n):
    centres = rng.uniform(0.1, 0.9, (n, 2))
    sizes = rng.uniform(0.05, 0.4, (n, 2))
    return np.concatenate([centres, sizes], axis=1).astype(np.float32)


@given(num_boxes=st.integers(1, 40), num_classes=st.integers(1, 5), background=st.integers(0, 1),
       regular=st.booleans(), max_detections=st.integers(1, 10), per_detection=st.integers(1, 3),
       per_class=st.integers(1, 6), score_threshold=st.sampled_from([0.0, 0.3, 0.6]),
       iou_threshold=st.sampled_from([0.3, 0.6, 1.0]), seed=st.integers(0, 2**16))
def test_detection_postprocess(num_boxes, num_classes, background, regular, max_detections, per_detection,
                               per_class, score_threshold, iou_threshold, seed):
    rng = np.random.default_rng(seed)
    options = {"max_detections": max_detections, "max_classes_per_detection": per_detection,
               "detections_per_class": per_class, "use_regular_nms": regular, "nms_score_threshold": score_threshold,
               "nms_iou_threshold": iou_threshold, "num_classes": num_classes, "y_scale": 10.0, "x_scale": 10.0,
               "h_scale": 5.0, "w_scale": 5.0}
    model = _detection_model(num_boxes, num_classes, background, _anchors(rng, num_boxes), options)
    inputs = [rng.standard_normal((1, num_boxes, 4)).astype(np.float32),
              rng.random((1, num_boxes, num_classes + background)).astype(np.float32)]
    actual, expected = delegate_run(model, inputs), litert_run(model, inputs)
    assert_close(actual[3:], expected[3:])
    # Only the reported detections' slots are defined; LiteRT leaves the others unwritten.  Fast NMS gives
    # each kept anchor ``per_detection`` slots, of which its top classes fill the first ones.
    count = int(expected[3][0])
    if regular:
        slots = np.arange(count)
    else:
        slots = (np.arange(count)[:, None] * per_detection + np.arange(min(per_detection, num_classes))).ravel()
    assert_close([a[:, slots] for a in actual[:3]], [e[:, slots] for e in expected[:3]])


@given(h=st.integers(1, 9), w=st.integers(1, 9), cin=st.integers(1, 6), cout=st.integers(1, 4),
       k=st.sampled_from([(2, 2), (3, 3), (4, 4), (1, 1), (3, 2)]), stride=st.integers(1, 3),
       padding=st.sampled_from(["SAME", "VALID"]), seed=st.integers(0, 2**16))
def test_convolution_2d_transpose_bias(h, w, cin, cout, k, stride, padding, seed):
    """MediaPipe's op, which LiteRT cannot run, against LiteRT's TRANSPOSE_CONV with the same geometry."""
    rng = np.random.default_rng(seed)
    custom, builtin = transpose_conv_bias_pair(h, w, cin, cout, k, stride, padding, rng)
    data = rng.standard_normal((1, h, w, cin)).astype(np.float32)
    assert_close(delegate_run(custom, [data]), litert_run(builtin, [data], builtin=True))


def test_detection_postprocess_with_uint8_inputs():
    """Quantized SSD heads feed uint8 encodings and scores (and anchors); they are dequantized first."""
    rng = np.random.default_rng(5)
    num_boxes, num_classes = 30, 3
    options = {"max_detections": 5, "max_classes_per_detection": 1, "use_regular_nms": False,
               "nms_score_threshold": 0.2, "nms_iou_threshold": 0.5, "num_classes": num_classes,
               "y_scale": 10.0, "x_scale": 10.0, "h_scale": 5.0, "w_scale": 5.0}
    anchors = np.round(_anchors(rng, num_boxes) / 0.004).astype(np.uint8)
    b = GraphBuilder()
    boxes = b.input("boxes", (1, num_boxes, 4), "uint8", quant=(0.05, 128))
    scores = b.input("scores", (1, num_boxes, num_classes + 1), "uint8", quant=(1 / 255, 0))
    outs = b.op("TFLite_Detection_PostProcess", [boxes, scores, b.const("anchors", anchors, quant=(0.004, 0))],
                custom=True, custom_options=flexbuffers.Dumps(options), num_outputs=4, dtype="float32")
    b.output(*outs)
    inputs = [rng.integers(0, 256, (1, num_boxes, 4)).astype(np.uint8),
              rng.integers(0, 256, (1, num_boxes, num_classes + 1)).astype(np.uint8)]
    actual, expected = delegate_run(b.to_bytes(), inputs), litert_run(b.to_bytes(), inputs)
    count = int(expected[3][0])
    assert count > 0
    assert_close(actual[3:], expected[3:])
    assert_close([a[:, :count] for a in actual[:3]], [e[:, :count] for e in expected[:3]])


@pytest.mark.parametrize("declared", [[(1, 1, 4), (1, 1), (1, 1), (1,)], [(), (), (), ()],
                                      [(1, 10, 4), (1, 10), (1, 10), (1,)]])
def test_detection_postprocess_outputs_sized_as_litert_sizes_them(declared):
    """The file's output shapes are placeholders (converters write [] or [1, 1]); LiteRT's Prepare sizes
    the outputs from the options, and so does loading here (the numpy engine once failed to broadcast)."""
    rng = np.random.default_rng(2)
    options = {"max_detections": 5, "max_classes_per_detection": 1, "use_regular_nms": False,
               "nms_score_threshold": 0.2, "nms_iou_threshold": 0.5, "num_classes": 3,
               "y_scale": 10.0, "x_scale": 10.0, "h_scale": 5.0, "w_scale": 5.0}
    b = GraphBuilder()
    boxes, scores = b.input("boxes", (1, 20, 4)), b.input("scores", (1, 20, 4))
    outs = b.op("TFLite_Detection_PostProcess", [boxes, scores, b.const("anchors", _anchors(rng, 20))], custom=True,
                custom_options=flexbuffers.Dumps(options), shapes=declared, dtype="float32")
    b.output(*outs)
    model = b.to_bytes()
    inputs = {"boxes": rng.standard_normal((1, 20, 4)).astype(np.float32),
              "scores": rng.random((1, 20, 4)).astype(np.float32)}
    expected = litert_run(model, list(inputs.values()))
    session = load(model, CPU_CONFIG, **{"cpu.engine": "numpy"})
    actual = list(session.run(inputs).values())
    assert [a.shape for a in actual] == [e.shape for e in expected] == [(1, 5, 4), (1, 5), (1, 5), (1,)]
    count = int(expected[3][0])
    assert_close([a[:, :count] for a in actual[:3]] + actual[3:], [e[:, :count] for e in expected[:3]] + expected[3:])


def _unpooling_loop(x, places, stride, window, top, left, in_window_only):
    """MediaPipe's MaxUnpooling2D loop: C's truncating division decodes each index, destinations outside the
    output are skipped, and a later input pixel overwrites; ``in_window_only`` keeps only indices naming a
    place of their own window (what the GPUs write)."""
    n, h, w, c = x.shape
    oh, ow = h * window[0], w * window[1]
    out = np.zeros((n, oh, ow, c), np.float32)
    for b, iy, ix, ch in np.ndindex(n, h, w, c):
        index = int(places[b, iy, ix, ch])
        dy = int(index / window[1])
        dx = index - dy * window[1]
        if in_window_only and not (0 <= dy < window[0] and 0 <= dx < window[1]):
            continue
        oy, ox = iy * stride[0] - top + dy, ix * stride[1] - left + dx
        if 0 <= oy < oh and 0 <= ox < ow:
            out[b, oy, ox, ch] = x[b, iy, ix, ch]
    return out


@pytest.mark.parametrize("backend", ["cpu", "opencl", "wgpu"])
def test_max_unpooling_of_any_indices_stays_inside_its_tensors(backend):
    """Indices from the model's input, negative, fractional, past the window and past the output: the CPU
    follows MediaPipe's loop; the GPUs gather, so they read only their inputs' pixels and write only
    the indices naming a place of their window, which is every index MaxPoolingWithArgmax2D gives."""
    require_backend(backend)
    rng = np.random.default_rng(7)
    shape, stride, window = (2, 5, 4, 6), (2, 2), (3, 3)
    b = GraphBuilder()
    b.output(b.op("MaxUnpooling2D", [b.input("x", shape), b.input("places", shape)], custom=True,
                  custom_options=mediapipe_pool_options("SAME", stride, window)))
    x = rng.standard_normal(shape).astype(np.float32)
    places = rng.uniform(-12, 40, shape).astype(np.float32)
    places[0, :, :, :2] = rng.integers(0, 9, (5, 4, 2)) + np.float32(0.1)  # indices a pooling gives
    top = max(((shape[1] - 1) * stride[0] + window[0] - shape[1] * window[0]) // 2, 0)
    left = max(((shape[2] - 1) * stride[1] + window[1] - shape[2] * window[1]) // 2, 0)
    expected = _unpooling_loop(x, places, stride, window, top, left, in_window_only=backend != "cpu")
    (actual,) = delegate_run(b.to_bytes(), [x, places], backend)
    np.testing.assert_array_equal(actual, expected)
