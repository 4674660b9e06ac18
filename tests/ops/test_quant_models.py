"""Whole full-int8 networks, shaped like converter output, against LiteRT's builtin kernels.

Each model quantizes a float input, runs a small stack of the layers that
MobileNet-style classifiers, segmentation/detection heads and transformer
blocks are made of, and dequantizes at the end; every output must agree
within one quantization step.  Weight scales are chosen so that each layer
keeps activations at about unit spread, so the int8 values stay mostly in
range instead of saturating.
"""

from functools import lru_cache

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from delegate import read_model, zoo
from delegate.tflite.builder import GraphBuilder
from tests.ops.test_quantized_ops import random_q
from tests.oputil import check_against_litert

RELU6_QUANT = (6 / 255, -128)
PROBABILITY_QUANT = (1 / 256, -128)


class Int8Net:
    """A GraphBuilder wrapper that adds converter-style int8 layers with unit-spread scaling."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.b = GraphBuilder()

    def quant(self, spread: float = 1.0):
        """(scale, zero point) covering about +-4 * spread, with a small offset as calibration gives."""
        return 4 * spread / 127, int(self.rng.integers(-10, 10))

    def _weights(self, shape, axis, taps):
        """int8 weights whose real values have spread 1/sqrt(taps), per-channel scales along ``axis``."""
        channels = shape[axis]
        scales = (self.rng.uniform(0.7, 1.3, channels) / (74 * np.sqrt(taps))).astype(np.float32)
        w = self.b.const("w", random_q(self.rng, shape), quant=(scales, np.zeros(channels, np.int64), axis))
        return w, scales

    def _bias(self, x, scales):
        bias_scales = (np.float32(x.quantization.scale[0]) * scales).astype(np.float32)
        values = self.rng.integers(-200, 200, scales.size).astype(np.int32)
        return self.b.const("bias", values, quant=(bias_scales, np.zeros(scales.size, np.int64), 0))

    def conv(self, x, out_channels, kernel=1, stride=1, act="NONE", quant=None):
        in_channels = x.shape[3]
        w, scales = self._weights((out_channels, kernel, kernel, in_channels), 0, kernel * kernel * in_channels)
        return self.b.op("CONV_2D", [x, w, self._bias(x, scales)], dtype="int8",
                         quant=quant or (RELU6_QUANT if act == "RELU6" else self.quant()),
                         options={"padding": "SAME", "stride_h": stride, "stride_w": stride,
                                  "fused_activation_function": act})

    def depthwise(self, x, stride=1, act="RELU6"):
        channels = x.shape[3]
        w, scales = self._weights((1, 3, 3, channels), 3, 9)
        return self.b.op("DEPTHWISE_CONV_2D", [x, w, self._bias(x, scales)], dtype="int8",
                         quant=RELU6_QUANT if act == "RELU6" else self.quant(),
                         options={"padding": "SAME", "stride_h": stride, "stride_w": stride,
                                  "depth_multiplier": 1, "fused_activation_function": act})

    def dense(self, x, units, act="NONE"):
        depth = x.shape[-1]
        w, scales = self._weights((units, depth), 0, depth)
        return self.b.op("FULLY_CONNECTED", [x, w, self._bias(x, scales)], dtype="int8", quant=self.quant(),
                         options={"keep_num_dims": True, "fused_activation_function": act})

    def add(self, x, y, act="NONE"):
        return self.b.op("ADD", [x, y], dtype="int8", quant=self.quant(1.4), options={"fused_activation_function": act})

    def check(self, inputs, output_quant):
        """Compare with LiteRT; float outputs may differ by one step of the int8 tensor they came from."""
        check_against_litert(self.b.to_bytes(), inputs, builtin=True, lsb=1, atol=output_quant[0] * 1.001)


@given(seed=st.integers(0, 2**16))
def test_mobilenet_like_classifier(seed):
    """QUANTIZE -> conv/depthwise/inverted-residual blocks -> pooling -> FC -> softmax -> DEQUANTIZE."""
    net = Int8Net(seed)
    b = net.b
    image = b.input("image", (1, 16, 16, 3))
    x = b.op("QUANTIZE", [image], dtype="int8", quant=(2 / 255, -1))
    x = net.conv(x, 8, kernel=3, stride=2, act="RELU6")
    x = net.depthwise(x)
    block_in = net.conv(x, 8)
    expanded = net.conv(block_in, 16, act="RELU6")
    expanded = net.depthwise(expanded)
    x = net.add(block_in, net.conv(expanded, 8))
    x = b.op("HARD_SWISH", [x], dtype="int8", quant=net.quant())
    x = net.depthwise(x, stride=2, act="RELU")
    pooled = b.op("AVERAGE_POOL_2D", [x], dtype="int8", quant=x.quantization,
                  options={"padding": "VALID", "stride_h": 1, "stride_w": 1, "filter_height": 4, "filter_width": 4})
    logits = net.dense(b.op("RESHAPE", [pooled, b.const("shape", np.array([1, 8], np.int32))],
                            dtype="int8", quant=pooled.quantization), 10)
    probabilities = b.op("SOFTMAX", [logits], dtype="int8", quant=PROBABILITY_QUANT, options={"beta": 1.0})
    b.output(b.op("DEQUANTIZE", [probabilities], dtype="float32"))
    net.check([net.rng.uniform(-1, 1, (1, 16, 16, 3)).astype(np.float32)], PROBABILITY_QUANT)


@given(seed=st.integers(0, 2**16))
def test_segmentation_and_detection_heads(seed):
    """Encoder features upsampled with RESIZE_BILINEAR and concatenated with a skip branch (shared
    quantization, as int8 CONCATENATION requires), then a logistic score map and a class map."""
    net = Int8Net(seed)
    b = net.b
    image = b.input("image", (1, 12, 12, 3))
    x = b.op("QUANTIZE", [image], dtype="int8", quant=(1 / 255, -128))
    skip_quant = net.quant()
    skip = net.conv(x, 6, kernel=3, act="RELU", quant=skip_quant)
    padded = b.op("PAD", [skip, b.const("pads", np.array([[0, 0], [0, 1], [0, 1], [0, 0]], np.int32))],
                  dtype="int8", quant=skip_quant)
    deep = b.op("MAX_POOL_2D", [padded], dtype="int8", quant=skip_quant,
                options={"padding": "VALID", "stride_h": 2, "stride_w": 2, "filter_height": 3, "filter_width": 3})
    deep = net.depthwise(deep, act="RELU")
    deep = net.conv(deep, 6, act="RELU", quant=skip_quant)
    up = b.op("RESIZE_BILINEAR", [deep, b.const("size", np.array([12, 12], np.int32))], dtype="int8",
              quant=skip_quant, options={"half_pixel_centers": True})
    merged = b.op("CONCATENATION", [up, skip], dtype="int8", quant=skip_quant, options={"axis": 3})
    logits = net.conv(merged, 4)
    scores = b.op("LOGISTIC", [logits], dtype="int8", quant=PROBABILITY_QUANT)
    boxes = b.op("RESHAPE", [scores, b.const("shape", np.array([1, 144, 4], np.int32))], dtype="int8",
                 quant=PROBABILITY_QUANT)
    b.output(b.op("DEQUANTIZE", [boxes], dtype="float32"))
    b.output(b.op("ARG_MAX", [logits, b.const("axis", np.array([3], np.int32))], dtype="int32",
                  options={"output_type": 2}))
    net.check([net.rng.uniform(0, 1, (1, 12, 12, 3)).astype(np.float32)], PROBABILITY_QUANT)


@given(seed=st.integers(0, 2**16))
def test_transformer_block(seed):
    """Embedding GATHER -> two-head self-attention (FC, RESHAPE, TRANSPOSE, BATCH_MATMUL, SOFTMAX)
    -> output projection with a residual ADD -> feed-forward -> MEAN pooling -> DEQUANTIZE."""
    net = Int8Net(seed)
    b = net.b
    tokens, width, heads = 8, 16, 2
    ids = b.input("ids", (1, tokens), "int32")
    table = b.const("embedding", random_q(net.rng, (32, width)), quant=net.quant())
    x = b.op("GATHER", [table, ids], dtype="int8", quant=table.quantization, options={"axis": 0})

    def split_heads(t):
        t = b.op("RESHAPE", [t, b.const("shape", np.array([1, tokens, heads, width // heads], np.int32))],
                 dtype="int8", quant=t.quantization)
        return b.op("TRANSPOSE", [t, b.const("perm", np.array([0, 2, 1, 3], np.int32))], dtype="int8",
                    quant=t.quantization)

    q, k, v = (split_heads(net.dense(x, width)) for _ in range(3))
    scores = b.op("BATCH_MATMUL", [q, k], dtype="int8", quant=net.quant(2.0), options={"adj_y": True})
    attention = b.op("SOFTMAX", [scores], dtype="int8", quant=PROBABILITY_QUANT, options={"beta": 0.35})
    mixed = b.op("BATCH_MATMUL", [attention, v], dtype="int8", quant=net.quant(0.5))
    mixed = b.op("TRANSPOSE", [mixed, b.const("perm", np.array([0, 2, 1, 3], np.int32))], dtype="int8",
                 quant=mixed.quantization)
    mixed = b.op("RESHAPE", [mixed, b.const("shape", np.array([1, tokens, width], np.int32))], dtype="int8",
                 quant=mixed.quantization)
    x = net.add(x, net.dense(mixed, width))
    x = net.add(x, net.dense(net.dense(x, 2 * width, act="RELU"), width))
    pooled_quant = net.quant()
    pooled = b.op("MEAN", [x, b.const("axis", np.array([1], np.int32))], dtype="int8", quant=pooled_quant,
                  options={"keep_dims": False})
    b.output(b.op("DEQUANTIZE", [pooled], dtype="float32"))
    net.check([net.rng.integers(0, 32, (1, tokens)).astype(np.int32)], pooled_quant)


ZOO_INT8 = {"mobilenet_v1": dict(alpha=0.25, size=96, classes=20), "deeplab_v3": dict(size=65, classes=5),
            "posenet": dict(size=65), "yolo_tiny": dict(size=96, classes=4),
            "transformer_block": dict(tokens=16, width=32, heads=2)}


@lru_cache(maxsize=None)
def _zoo_int8(name: str) -> bytes:
    return zoo.build(name, "int8", **ZOO_INT8[name])


@pytest.mark.parametrize("name", sorted(ZOO_INT8))
@settings(max_examples=3)
@given(seed=st.integers(0, 2**16))
def test_zoo_models_post_training_quantized(name, seed):
    """The zoo's converter-style full-int8 models (calibrated per-channel weights, int8 activations,
    fixed-scale softmax/logistic, RSQRT and GELU in layer norms and MLPs) end to end."""
    data = _zoo_int8(name)
    graph = read_model(data).main
    rng = np.random.default_rng(seed)
    inputs = [rng.uniform(-1, 1, t.shape).astype(np.float32) for t in graph.inputs]
    # Float outputs may differ by one step of the int8 tensor each was dequantized from.
    steps = [op.inputs[0].quantization.scale[0] for op in graph.ops
             if op.opcode == "DEQUANTIZE" and op.outputs[0] in graph.outputs]
    check_against_litert(data, inputs, builtin=True, lsb=1, atol=max(steps) * 1.001)
