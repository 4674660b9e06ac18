"""Built-in example models made with the builder: no download needed.

Weights are random but scaled (He initialisation, small biases) so that
activations neither die nor explode and outputs vary with the input.
``zoo:NAME`` in a config, on the command line or in ``delegate.load`` refers to these.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from .errors import ModelFormatError
from .tflite.builder import GraphBuilder

PREFIX = "zoo:"
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
             dilation: int = 1, head: bool = False):
        """``head``: a prediction head without bias whose k x k kernels (one per output and input channel) are
        double-centred: every row and every column sums to zero.  The features below it are non-negative with
        per-channel means, so kernels with non-zero sums would give each class a constant offset and one class
        would win everywhere; these respond only to how the features vary, and still sum to zero where SAME
        padding cuts off a border row or column."""
        name = self._name("conv")
        in_c = x.shape[-1]
        w = self.rng.standard_normal((out_c, k, k, in_c)) * np.sqrt(2.0 / (k * k * in_c))
        bias = self.rng.standard_normal(out_c) * 0.05
        if head:
            w = w - w.mean(axis=1, keepdims=True) - w.mean(axis=2, keepdims=True) + w.mean(axis=(1, 2), keepdims=True)
            bias = np.zeros(out_c)
        return self.b.op("CONV_2D", [x, self.b.const(f"{name}/weights", w), self.b.const(f"{name}/bias", bias)],
                         options={"padding": padding, "stride_w": stride, "stride_h": stride,
                                  "dilation_w_factor": dilation, "dilation_h_factor": dilation,
                                  "fused_activation_function": act}, name=name)

    def depthwise(self, x, k: int = 3, stride: int = 1, act: str = "RELU6", dilation: int = 1,
                  padding: str = "SAME"):
        name = self._name("depthwise")
        c = x.shape[-1]
        w = self.rng.standard_normal((1, k, k, c)) * np.sqrt(2.0 / (k * k))
        bias = self.rng.standard_normal(c) * 0.05
        return self.b.op("DEPTHWISE_CONV_2D",
                         [x, self.b.const(f"{name}/weights", w), self.b.const(f"{name}/bias", bias)],
                         options={"padding": padding, "stride_w": stride, "stride_h": stride, "depth_multiplier": 1,
                                  "dilation_w_factor": dilation, "dilation_h_factor": dilation,
                                  "fused_activation_function": act}, name=name)

    def dense(self, x, units: int, act: str = "NONE", gain: float = 1.0):
        """``gain`` widens the logits of a classifier, so its softmax is peaked rather than near uniform."""
        name = self._name("dense")
        in_c = x.shape[-1]
        w = self.rng.standard_normal((units, in_c)) * np.sqrt(2.0 / in_c) * gain
        bias = self.rng.standard_normal(units) * 0.05
        return self.b.op("FULLY_CONNECTED", [x, self.b.const(f"{name}/weights", w), self.b.const(f"{name}/bias", bias)],
                         options={"fused_activation_function": act}, name=name)

    def dense_3d(self, x, units: int, act: str = "NONE"):
        """FULLY_CONNECTED over the last axis of a [batch, tokens, features] tensor."""
        name = self._name("dense")
        in_c = x.shape[-1]
        w = self.rng.standard_normal((units, in_c)) * np.sqrt(1.0 / in_c)
        bias = self.rng.standard_normal(units) * 0.02
        return self.b.op("FULLY_CONNECTED", [x, self.b.const(f"{name}/weights", w), self.b.const(f"{name}/bias", bias)],
                         options={"fused_activation_function": act, "keep_num_dims": True}, name=name)

    def global_pool(self, x):
        n, h, w, c = x.shape
        return self.b.op("AVERAGE_POOL_2D", [x], options={"padding": "VALID", "stride_w": 1, "stride_h": 1,
                                                          "filter_width": w, "filter_height": h,
                                                          "fused_activation_function": "NONE"},
                         name=self._name("pool"))

    def add(self, a, b, act: str = "NONE"):
        return self.b.op("ADD", [a, b], options={"fused_activation_function": act}, name=self._name("add"))

    def concat(self, tensors, axis: int = -1):
        return self.b.op("CONCATENATION", list(tensors), options={"axis": axis % len(tensors[0].shape),
                                                                  "fused_activation_function": "NONE"},
                         name=self._name("concat"))

    def resize_bilinear(self, x, h: int, w: int):
        return self.b.op("RESIZE_BILINEAR", [x, self.b.const(self._name("size"), np.array([h, w], np.int32))],
                         options={"align_corners": False, "half_pixel_centers": True}, name=self._name("resize"))

    def max_pool(self, x, k: int = 2, stride: int = 2, padding: str = "SAME"):
        return self.b.op("MAX_POOL_2D", [x], options={"padding": padding, "stride_w": stride, "stride_h": stride,
                                                      "filter_width": k, "filter_height": k,
                                                      "fused_activation_function": "NONE"},
                         name=self._name("maxpool"))

    def leaky_relu(self, x, alpha: float = 0.1):
        return self.b.op("LEAKY_RELU", [x], options={"alpha": alpha}, name=self._name("leaky"))

    def pad(self, x, before: int, after: int):
        """Zero padding of the two spatial axes, as Keras' ZeroPadding2D converts."""
        pads = np.array([[0, 0], [before, after], [before, after], [0, 0]], np.int32)
        return self.b.op("PAD", [x, self.b.const(self._name("paddings"), pads)], name=self._name("pad"))

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
    logits = net.dense(y, classes, gain=4.0)
    b.output(b.op("SOFTMAX", [logits], options={"beta": 1.0}, name="predictions"))
    return b.to_bytes()


@register("mobilenet_v2")
def mobilenet_v2(classes: int = 1000, size: int = 224, seed: int = 6) -> bytes:
    """MobileNetV2 (alpha 1.0) laid out as TFLite's converter emits Keras' model: inverted residual blocks
    (1x1 expansion, depthwise, linear 1x1 projection, residual ADD where shapes allow), an explicit PAD before
    each stride-2 depthwise, a 1280-channel head, global pooling and a softmax classifier."""
    net = _Net(seed)
    b = net.b
    x = b.input("input", (1, size, size, 3))
    y = net.conv(x, 32, stride=2)
    settings = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
                (6, 320, 1, 1)]  # expansion, output channels, repeats, first stride
    for expansion, out_c, repeats, first_stride in settings:
        for i in range(repeats):
            stride = first_stride if i == 0 else 1
            block_in = y
            if expansion != 1:
                y = net.conv(y, block_in.shape[-1] * expansion, k=1)
            if stride == 2:
                y = net.depthwise(net.pad(y, 0, 1), stride=2, padding="VALID")
            else:
                y = net.depthwise(y)
            y = net.conv(y, out_c, k=1, act="NONE")
            if stride == 1 and block_in.shape[-1] == out_c:
                y = net.add(block_in, y)
    y = net.conv(y, 1280, k=1)
    y = net.reshape(net.global_pool(y), (1, 1280))
    logits = net.dense(y, classes, gain=4.0)
    b.output(b.op("SOFTMAX", [logits], options={"beta": 1.0}, name="predictions"))
    return b.to_bytes()


def _mobilenet_features(net: _Net, x, alpha: float, blocks):
    y = net.conv(x, max(8, int(32 * alpha)), stride=2)
    for out_c, stride, dilation in blocks:
        y = net.depthwise(y, stride=stride, dilation=dilation)
        y = net.conv(y, max(8, int(out_c * alpha)), k=1)
    return y


@register("deeplab_v3")
def deeplab_v3(classes: int = 21, size: int = 257, seed: int = 1) -> bytes:
    """DeepLab-v3-style segmenter: dilated MobileNet backbone (output stride 16), ASPP, bilinear upsampling."""
    net = _Net(seed)
    b = net.b
    x = b.input("input", (1, size, size, 3))
    blocks = [(64, 1, 1), (128, 2, 1), (128, 1, 1), (256, 2, 1), (256, 1, 1), (320, 2, 1),
              (320, 1, 2), (320, 1, 2)]
    features = _mobilenet_features(net, x, 0.5, blocks)
    h, w = features.shape[1:3]
    branches = [net.conv(features, 64, k=1, act="RELU")]
    for rate in (2, 4, 6):  # atrous convolutions at several rates
        branches.append(net.conv(features, 64, k=3, act="RELU", dilation=rate))
    pooled = net.global_pool(features)
    pooled = net.conv(pooled, 64, k=1, act="RELU")
    branches.append(net.resize_bilinear(pooled, h, w))
    y = net.conv(net.concat(branches), 64, k=1, act="RELU")
    logits = net.conv(y, classes, k=1, act="NONE")
    b.output(net.resize_bilinear(logits, size, size))
    return b.to_bytes()


def _ssd_anchors(sizes, scales=(0.2, 0.35, 0.5)) -> np.ndarray:
    """Centre-size anchors (y, x, h, w) over the feature maps, two aspect ratios per cell."""
    anchors = []
    for (fh, fw), scale in zip(sizes, scales):
        for i in range(fh):
            for j in range(fw):
                for ratio in (1.0, 2.0):
                    anchors.append([(i + 0.5) / fh, (j + 0.5) / fw, scale / np.sqrt(ratio), scale * np.sqrt(ratio)])
    return np.array(anchors, np.float32)


@register("mobilenet_ssd")
def mobilenet_ssd(classes: int = 10, size: int = 300, seed: int = 2) -> bytes:
    """MobileNet-SSD: box and class heads on three feature maps, then TFLite_Detection_PostProcess."""
    from flatbuffers import flexbuffers

    net = _Net(seed)
    b = net.b
    x = b.input("normalized_input_image_tensor", (1, size, size, 3))
    blocks = [(64, 1, 1), (128, 2, 1), (128, 1, 1), (256, 2, 1), (256, 1, 1), (512, 2, 1), (512, 1, 1)]
    f1 = _mobilenet_features(net, x, 0.5, blocks)
    f2 = net.conv(net.depthwise(f1, stride=2), 256, k=1)
    f3 = net.conv(net.depthwise(f2, stride=2), 256, k=1)
    boxes, scores, sizes = [], [], []
    for f in (f1, f2, f3):
        n_cells = f.shape[1] * f.shape[2] * 2
        sizes.append(f.shape[1:3])
        boxes.append(net.reshape(net.conv(f, 2 * 4, k=3, act="NONE", head=True), (1, n_cells, 4)))
        scores.append(net.reshape(net.conv(f, 2 * (classes + 1), k=3, act="NONE", head=True),
                                  (1, n_cells, classes + 1)))
    box_encodings = net.concat(boxes, axis=1)
    class_scores = b.op("LOGISTIC", [net.concat(scores, axis=1)], name="class_predictions")
    anchors = b.const("anchors", _ssd_anchors(sizes))
    options = flexbuffers.Dumps({
        "max_detections": 10, "max_classes_per_detection": 1, "detections_per_class": 100,
        "use_regular_nms": False, "nms_score_threshold": 0.3, "nms_iou_threshold": 0.6,
        "num_classes": classes, "y_scale": 10.0, "x_scale": 10.0, "h_scale": 5.0, "w_scale": 5.0})
    outs = b.op("TFLite_Detection_PostProcess", [box_encodings, class_scores, anchors], custom=True,
                custom_options=bytes(options), shapes=[(1, 10, 4), (1, 10), (1, 10), (1,)],
                name="TFLite_Detection_PostProcess")
    b.output(*outs)
    return b.to_bytes()


@register("posenet")
def posenet(keypoints: int = 17, size: int = 257, seed: int = 3) -> bytes:
    """PoseNet-style multi-head keypoint model: heatmaps, offsets and forward/backward displacements."""
    net = _Net(seed)
    b = net.b
    x = b.input("image", (1, size, size, 3))
    blocks = [(64, 1, 1), (128, 2, 1), (128, 1, 1), (256, 2, 1), (256, 1, 1), (512, 2, 1), (512, 1, 1)]
    features = _mobilenet_features(net, x, 0.5, blocks)
    heatmaps = b.op("LOGISTIC", [net.conv(features, keypoints, k=1, act="NONE")], name="heatmaps")
    offsets = net.conv(features, 2 * keypoints, k=1, act="NONE")
    edges = keypoints - 1
    forward = net.conv(features, 2 * edges, k=1, act="NONE")
    backward = net.conv(features, 2 * edges, k=1, act="NONE")
    b.output(heatmaps, offsets, forward, backward)
    return b.to_bytes()


@register("yolo_tiny")
def yolo_tiny(classes: int = 20, size: int = 416, seed: int = 4) -> bytes:
    """YOLOv3-tiny-style detector: conv + leaky ReLU + max-pool backbone, two heads, nearest upsampling.

    The leaky ReLUs and nearest-neighbour resize are ops the LiteRT GPU list lacks, so they sit between
    large supported regions: the case where placing by cost beats "largest partition wins".
    """
    net = _Net(seed)
    b = net.b
    x = b.input("input", (1, size, size, 3))
    y = x
    route = None
    for i, width in enumerate((16, 32, 64, 128, 256)):
        y = net.leaky_relu(net.conv(y, width, act="NONE"))
        if i == 4:
            route = y
        y = net.max_pool(y)
    y = net.leaky_relu(net.conv(y, 512, act="NONE"))
    y = net.leaky_relu(net.conv(y, 256, k=1, act="NONE"))
    head1 = net.conv(net.leaky_relu(net.conv(y, 512, act="NONE")), 3 * (5 + classes), k=1, act="NONE")
    up = net.leaky_relu(net.conv(y, 128, k=1, act="NONE"))
    h, w = route.shape[1:3]
    up = b.op("RESIZE_NEAREST_NEIGHBOR", [up, b.const("up_size", np.array([h, w], np.int32))],
              options={"align_corners": False, "half_pixel_centers": False}, name="upsample")
    y2 = net.leaky_relu(net.conv(net.concat([up, route]), 256, act="NONE"))
    head2 = net.conv(y2, 3 * (5 + classes), k=1, act="NONE")
    b.output(head1, head2)
    return b.to_bytes()


@register("blazeface")
def blazeface(size: int = 128, anchors: int = 2, seed: int = 7) -> bytes:
    """BlazeFace-style detector, as MediaPipe's face, palm and pose detectors are laid out: 5x5 depthwise blocks
    whose shortcut is max-pooled where the block strides and zero-padded along the channels where it widens
    (PAD of the last axis), a residual ADD and ReLU, then box and score heads on two scales reshaped and
    concatenated."""
    net = _Net(seed)
    b = net.b
    x = b.input("input", (1, size, size, 3))
    y = net.conv(x, 24, k=5, stride=2, act="RELU")

    def block(t, out_c: int, stride: int):
        shortcut = net.max_pool(t) if stride == 2 else t
        in_c = t.shape[-1]
        if out_c > in_c:
            pads = np.array([[0, 0], [0, 0], [0, 0], [0, out_c - in_c]], np.int32)
            shortcut = b.op("PAD", [shortcut, b.const(net._name("paddings"), pads)], name=net._name("pad"))
        t = net.conv(net.depthwise(t, k=5, stride=stride, act="NONE"), out_c, k=1, act="NONE")
        return net.add(t, shortcut, act="RELU")

    for out_c, stride in [(24, 1), (28, 1), (32, 2), (36, 1), (42, 1), (48, 2), (56, 1), (64, 1), (72, 1),
                          (80, 1), (88, 1)]:
        y = block(y, out_c, stride)
    small = y
    for out_c, stride in [(96, 2), (96, 1), (96, 1), (96, 1), (96, 1)]:
        y = block(y, out_c, stride)
    boxes, scores = [], []
    for f in (small, y):
        cells = f.shape[1] * f.shape[2] * anchors
        scores.append(net.reshape(net.conv(f, anchors, k=1, act="NONE"), (1, cells, 1)))
        boxes.append(net.reshape(net.conv(f, anchors * 16, k=1, act="NONE"), (1, cells, 16)))
    b.output(net.concat(boxes, axis=1), net.concat(scores, axis=1))
    return b.to_bytes()


@register("transformer_block")
def transformer_block(tokens: int = 64, width: int = 128, heads: int = 4, seed: int = 5) -> bytes:
    """One pre-norm transformer encoder block: layer norm, multi-head self-attention, GELU MLP."""
    net = _Net(seed)
    b = net.b
    x = b.input("tokens", (1, tokens, width))
    head = width // heads

    def layer_norm(t):
        axis = b.const(net._name("axis"), np.array([-1 % 3], np.int32))
        mean = b.op("MEAN", [t, axis], options={"keep_dims": True}, name=net._name("mean"))
        centred = b.op("SUB", [t, mean], options={"fused_activation_function": "NONE"}, name=net._name("centre"))
        var = b.op("MEAN", [b.op("MUL", [centred, centred], options={"fused_activation_function": "NONE"},
                                 name=net._name("square")), axis], options={"keep_dims": True},
                   name=net._name("var"))
        eps = b.const(net._name("eps"), np.array([1e-5], np.float32))
        inv = b.op("RSQRT", [net.add(var, eps)], name=net._name("rsqrt"))
        return b.op("MUL", [centred, inv], options={"fused_activation_function": "NONE"}, name=net._name("norm"))

    def project(t, units):
        return net.dense_3d(t, units)

    h = layer_norm(x)
    q, k, v = (net.reshape(project(h, width), (1, tokens, heads, head)) for _ in range(3))
    perm = b.const("perm", np.array([0, 2, 1, 3], np.int32))
    q, k, v = (b.op("TRANSPOSE", [t, perm], name=net._name("heads")) for t in (q, k, v))
    scores = b.op("BATCH_MATMUL", [q, k], options={"adj_x": False, "adj_y": True}, name="scores")
    scale = b.const("scale", np.array([1.0 / np.sqrt(head)], np.float32))
    scores = b.op("MUL", [scores, scale], options={"fused_activation_function": "NONE"}, name="scaled")
    attn = b.op("SOFTMAX", [scores], options={"beta": 1.0}, name="attention")
    ctx = b.op("BATCH_MATMUL", [attn, v], options={"adj_x": False, "adj_y": False}, name="context")
    ctx = net.reshape(b.op("TRANSPOSE", [ctx, perm], name="merge"), (1, tokens, width))
    x = net.add(x, project(ctx, width))
    m = b.op("GELU", [project(layer_norm(x), 2 * width)], options={"approximate": True}, name="gelu")
    b.output(net.add(x, project(m, width)))
    return b.to_bytes()


@register("lstm_classifier")
def lstm_classifier(steps: int = 16, features: int = 32, units: int = 64, classes: int = 10, seed: int = 8) -> bytes:
    """A sequence classifier: one LSTM layer over ``steps`` time steps (its output and cell states variable
    tensors, as the converter writes them) and a dense layer on each step's output."""
    net = _Net(seed)
    b, rng = net.b, net.rng
    x = b.input("sequence", (1, steps, features))

    def weights(name, *shape):
        return b.const(name, (rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32))
    gates = ("input", "forget", "cell", "output")
    operands = ([weights(f"{g}_w", units, features) for g in gates] + [weights(f"{g}_r", units, units) for g in gates]
                + [None] * 3  # no peepholes
                + [b.const(f"{g}_b", np.full(units, 1.0 if g == "forget" else 0.0, np.float32)) for g in gates]
                + [None, None]  # no projection
                + [b.tensor("output_state", (1, units), is_variable=True),
                   b.tensor("cell_state", (1, units), is_variable=True)]
                + [None] * 4)  # no layer norm
    h = b.op("UNIDIRECTIONAL_SEQUENCE_LSTM", [x] + operands, options={"fused_activation_function": "TANH",
                                                                       "time_major": False}, name="lstm")
    b.output(net.dense_3d(h, classes))
    return b.to_bytes()


def build(name: str, quant: str = "fp32", **kwargs) -> bytes:
    """Bytes of a zoo model, as built (``fp32``) or post-training quantized (``fp16`` weights, full ``int8``).

    Raises KeyError listing the known names, ValueError listing the quantization modes.
    """
    if name not in ZOO:
        raise KeyError(f"unknown zoo model {name!r}; known: {', '.join(sorted(ZOO))}")
    data = ZOO[name](**kwargs)
    if quant == "fp32":
        return data
    from .quantize import quantize
    from .tflite.reader import read_model
    from .tflite.writer import write_model
    return write_model(quantize(read_model(data), quant))


def from_spec(spec: str) -> bytes:
    """Bytes of the model a ``zoo:NAME`` string names; ModelFormatError listing the names when unknown."""
    try:
        return build(spec.removeprefix(PREFIX))
    except KeyError as exc:
        raise ModelFormatError(str(exc.args[0])) from None
