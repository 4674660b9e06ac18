"""Built-in example models made with the builder: no download needed.

Weights are random but scaled (He initialisation, small biases) so that
activations neither die nor explode and outputs vary with the input.
``zoo:NAME`` in a config or on the command line refers to these.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from .tflite.builder import GraphBuilder

ZOO: dict[str, Callable[..., bytes]] = {}


def register(name: str):
    def add(fn: Callable[..., bytes]) -> Callable[..., bytes]:
        ZOO[name] = fn
        return fn
    return add


class _Net:
    """Layer helpers over a GraphBuilder with seeded, variance-preserving weights."""

    def __init__(self, seed: int):
        self.b = GraphBuilder()
        self.rng = np.random.default_rng(seed)
        self.count = 0

    def _name(self, kind: str) -> str:
        self.count += 1
        return f"{kind}_{self.count}"

    def conv(self, x, out_c: int, k: int = 3, stride: int = 1, act: str = "RELU6", padding: str = "SAME",
             dilation: int = 1):
        name = self._name("conv")
        in_c = x.shape[-1]
        w = self.rng.standard_normal((out_c, k, k, in_c)) * np.sqrt(2.0 / (k * k * in_c))
        bias = self.rng.standard_normal(out_c) * 0.05
        return self.b.op("CONV_2D", [x, self.b.const(f"{name}/weights", w), self.b.const(f"{name}/bias", bias)],
                         options={"padding": padding, "stride_w": stride, "stride_h": stride,
                                  "dilation_w_factor": dilation, "dilation_h_factor": dilation,
                                  "fused_activation_function": act}, name=name)

    def depthwise(self, x, k: int = 3, stride: int = 1, act: str = "RELU6", dilation: int = 1):
        name = self._name("depthwise")
        c = x.shape[-1]
        w = self.rng.standard_normal((1, k, k, c)) * np.sqrt(2.0 / (k * k))
        bias = self.rng.standard_normal(c) * 0.05
        return self.b.op("DEPTHWISE_CONV_2D",
                         [x, self.b.const(f"{name}/weights", w), self.b.const(f"{name}/bias", bias)],
                         options={"padding": "SAME", "stride_w": stride, "stride_h": stride, "depth_multiplier": 1,
                                  "dilation_w_factor": dilation, "dilation_h_factor": dilation,
                                  "fused_activation_function": act}, name=name)

    def dense(self, x, units: int, act: str = "NONE"):
        name = self._name("dense")
        in_c = x.shape[-1]
        w = self.rng.standard_normal((units, in_c)) * np.sqrt(2.0 / in_c)
        bias = self.rng.standard_normal(units) * 0.05
        return self.b.op("FULLY_CONNECTED", [x, self.b.const(f"{name}/weights", w), self.b.const(f"{name}/bias", bias)],
                         options={"fused_activation_function": act}, name=name)

    def global_pool(self, x):
        n, h, w, c = x.shape
        return self.b.op("AVERAGE_POOL_2D", [x], options={"padding": "VALID", "stride_w": 1, "stride_h": 1,
                                                          "filter_width": w, "filter_height": h,
                                                          "fused_activation_function": "NONE"},
                         name=self._name("pool"))

    def reshape(self, x, shape):
        return self.b.op("RESHAPE", [x, self.b.const(self._name("shape"), np.array(shape, np.int32))],
                         options={"new_shape": list(shape)}, name=self._name("reshape"))


@register("mobilenet_v1")
def mobilenet_v1(alpha: float = 1.0, classes: int = 1001, size: int = 224, seed: int = 0) -> bytes:
    """MobileNet v1: 13 depthwise-separable blocks, global pooling, a classifier with softmax."""
    net = _Net(seed)
    b = net.b
    x = b.input("input", (1, size, size, 3))

    def ch(c: int) -> int:
        return max(8, int(c * alpha))

    y = net.conv(x, ch(32), stride=2)
    blocks = [(64, 1), (128, 2), (128, 1), (256, 2), (256, 1), (512, 2)] + [(512, 1)] * 5 + [(1024, 2), (1024, 1)]
    for out_c, stride in blocks:
        y = net.depthwise(y, stride=stride)
        y = net.conv(y, ch(out_c), k=1)
    y = net.global_pool(y)
    y = net.reshape(y, (1, y.shape[-1]))
    logits = net.dense(y, classes)
    b.output(b.op("SOFTMAX", [logits], options={"beta": 1.0}, name="predictions"))
    return b.to_bytes()


def build(name: str, **kwargs) -> bytes:
    """Bytes of a zoo model; raises KeyError listing the known names."""
    if name not in ZOO:
        raise KeyError(f"unknown zoo model {name!r}; known: {', '.join(sorted(ZOO))}")
    return ZOO[name](**kwargs)
