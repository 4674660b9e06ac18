"""Golden tests of the custom ops: TFLite_Detection_PostProcess (regular and fast NMS) and MediaPipe's
Convolution2DTransposeBias."""

from pathlib import Path

import numpy as np
import pytest
from flatbuffers import flexbuffers
from hypothesis import given, strategies as st

from delegate import load
from delegate.tflite.builder import GraphBuilder
from tests.models import transpose_conv_bias_pair
from tests.oputil import assert_close, delegate_run, litert_run

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
