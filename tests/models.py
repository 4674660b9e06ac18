"""Test models shared by the per-backend tests (CPU, OpenCL, WebGPU)."""

from __future__ import annotations

import numpy as np

from delegate.ir import DimensionMetadata, Sparsity
from delegate.shapes import transpose_conv_bias_geometry
from delegate.tflite.builder import GraphBuilder


def normal(rng, shape, scale=1.0) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def residual_block(rng, extra_output: bool = False, gate: bool = False) -> GraphBuilder:
    """A chain the GPU backends fuse: CONV_2D+RELU (1, 6, 5, 7) -> 6 channels, ADD of a residual input,
    MUL by a constant (then by a (1, 1, 1, 6) gate input with ``gate``), HARD_SWISH; with
    ``extra_output`` the ADD result is also a model output."""
    b = GraphBuilder()
    x = b.input("x", (1, 6, 5, 7))
    r = b.input("r", (1, 6, 5, 6))
    y = b.op("CONV_2D", [x, b.const("w", normal(rng, (6, 3, 3, 7))), b.const("b", normal(rng, 6))],
             options={"padding": "SAME", "stride_w": 1, "stride_h": 1, "fused_activation_function": "RELU"})
    z = b.op("ADD", [r, y])
    m = b.op("MUL", [z, b.const("k", np.array([0.5], np.float32))])
    if gate:
        m = b.op("MUL", [m, b.input("gate", (1, 1, 1, 6))])
    b.output(b.op("HARD_SWISH", [m]))
    if extra_output:
        b.output(z)
    return b


def transpose_conv_out(size: int, k: int, stride: int, padding: str) -> int:
    return size * stride if padding == "SAME" else (size - 1) * stride + k


def transpose_conv_model(h, w, cin, cout, k, stride, padding, with_bias, rng, version: int = 1) -> bytes:
    """TRANSPOSE_CONV of a (1, h, w, cin) input with random weights (and bias)."""
    kh, kw = k
    out_shape = (1, transpose_conv_out(h, kh, stride, padding), transpose_conv_out(w, kw, stride, padding), cout)
    b = GraphBuilder()
    x = b.input("x", (1, h, w, cin))
    inputs = [b.const("shape", np.array(out_shape, np.int32)),
              b.const("w", rng.standard_normal((cout, kh, kw, cin)).astype(np.float32)), x]
    if with_bias:
        inputs.append(b.const("b", rng.standard_normal(cout).astype(np.float32)))
    b.output(b.op("TRANSPOSE_CONV", inputs, version=version, dtype="float32",
                  options={"padding": padding, "stride_h": stride, "stride_w": stride}))
    return b.to_bytes()


def transpose_conv_bias_pair(h, w, cin, cout, k, stride, padding, rng, builtin_version: int = 1):
    """MediaPipe's Convolution2DTransposeBias and the TRANSPOSE_CONV (with bias) of the same geometry,
    which LiteRT can run as its reference: (custom model, builtin model)."""
    weights = rng.standard_normal((cout, *k, cin)).astype(np.float32)
    bias = rng.standard_normal(cout).astype(np.float32)
    params = np.array([1 if padding == "SAME" else 2, stride, stride], "<i4").tobytes()
    out_shape, _, _ = transpose_conv_bias_geometry((1, h, w, cin), weights.shape, params)
    custom = GraphBuilder()
    x = custom.input("x", (1, h, w, cin))
    custom.output(custom.op("Convolution2DTransposeBias", [x, custom.const("w", weights), custom.const("b", bias)],
                            custom=True, custom_options=params))
    builtin = GraphBuilder()
    x = builtin.input("x", (1, h, w, cin))
    builtin.output(builtin.op("TRANSPOSE_CONV", [builtin.const("shape", np.array(out_shape, np.int32)),
                                                 builtin.const("w", weights), x, builtin.const("b", bias)],
                              version=builtin_version, dtype="float32",
                              options={"padding": padding, "stride_h": stride, "stride_w": stride}))
    return custom.to_bytes(), builtin.to_bytes()


def pool_model(op, batch, h, w, c, kh, kw, sh, sw, padding, act) -> bytes:
    """A 2-D pool; VALID windows are clipped to the input so the output is never empty."""
    if padding == "VALID":
        kh, kw = min(kh, h), min(kw, w)
    b = GraphBuilder()
    x = b.input("x", (batch, h, w, c))
    b.output(b.op(op, [x], options={"padding": padding, "filter_height": kh, "filter_width": kw,
                                    "stride_h": sh, "stride_w": sw, "fused_activation_function": act}))
    return b.to_bytes()


def csr_encode(dense: np.ndarray, block: tuple[int, int] | None = None) -> tuple[np.ndarray, Sparsity]:
    """TFLite sparse storage of ``dense``: its leading dims dense and its last CSR; or a 2-D matrix in
    (r, c) blocks, dense rows of blocks and CSR columns of them."""
    if block is None:
        rows = dense.reshape(-1, dense.shape[-1])
        nz = [np.flatnonzero(row) for row in rows]
        values = np.concatenate([rows[i, idx] for i, idx in enumerate(nz)])
        levels = [DimensionMetadata("DENSE", d) for d in dense.shape[:-1]]
        levels.append(DimensionMetadata("SPARSE_CSR", 0, np.cumsum([0] + [len(i) for i in nz]).astype(np.int32),
                                        np.concatenate(nz).astype(np.int32)))
        return values, Sparsity(list(range(dense.ndim)), [], levels)
    rows, cols = dense.shape
    br, bc = block
    tiles = dense.reshape(rows // br, br, cols // bc, bc).transpose(0, 2, 1, 3)
    keep = [np.flatnonzero(np.abs(tiles[i]).sum(axis=(1, 2))) for i in range(rows // br)]
    values = np.concatenate([tiles[i, k].ravel() for i, k in enumerate(keep)])
    levels = [DimensionMetadata("DENSE", rows // br),
              DimensionMetadata("SPARSE_CSR", 0, np.cumsum([0] + [len(k) for k in keep]).astype(np.int32),
                                np.concatenate(keep).astype(np.int32)),
              DimensionMetadata("DENSE", br), DimensionMetadata("DENSE", bc)]
    return values, Sparsity([0, 1, 2, 3], [0, 1], levels)


def sparse_conv_model(rng, shape=(1, 5, 5, 16), units=6) -> bytes:
    """DENSIFY of sparse float16 weights -> DEQUANTIZE -> 1x1 CONV_2D, as MediaPipe's sparse detectors."""
    dense = normal(rng, (units, 1, 1, shape[-1])).astype(np.float16)
    dense[rng.random(dense.shape) < 0.6] = 0
    values, sparsity = csr_encode(dense)
    b = GraphBuilder()
    x = b.input("x", shape)
    sparse = b.const("w", values)
    sparse.shape, sparse.sparsity = dense.shape, sparsity
    w = b.op("DEQUANTIZE", [b.op("DENSIFY", [sparse], shape=dense.shape)], version=2, dtype="float32")
    b.output(b.op("CONV_2D", [x, w, b.const("b", normal(rng, units))],
                  options={"padding": "VALID", "stride_h": 1, "stride_w": 1, "fused_activation_function": "NONE"}))
    return b.to_bytes()


def squeeze_excitation(rng, batch: int, channels: int, fused_relu: bool) -> GraphBuilder:
    """Global pooling, a one-pixel 1x1 bottleneck (RELU fused or a separate op) and its expansion, the LOGISTIC
    gate applied to the input, then a 1x1 projection to 5 channels."""
    b = GraphBuilder()
    x = b.input("x", (batch, 6, 7, channels))
    pooled = b.op("AVERAGE_POOL_2D", [x], options={"padding": "VALID", "filter_height": 6, "filter_width": 7,
                                                   "stride_h": 1, "stride_w": 1})
    squeeze = channels // 4 + 1
    conv = {"padding": "VALID", "stride_w": 1, "stride_h": 1}
    hidden = b.op("CONV_2D", [pooled, b.const("w1", normal(rng, (squeeze, 1, 1, channels))),
                              b.const("b1", normal(rng, squeeze))],
                  options={**conv, "fused_activation_function": "RELU"} if fused_relu else conv)
    if not fused_relu:
        hidden = b.op("RELU", [hidden])
    gate = b.op("CONV_2D", [hidden, b.const("w2", normal(rng, (channels, 1, 1, squeeze))),
                            b.const("b2", normal(rng, channels))], options=conv)
    gated = b.op("MUL", [x, b.op("LOGISTIC", [gate])])
    b.output(b.op("CONV_2D", [gated, b.const("w3", normal(rng, (5, 1, 1, channels))), b.const("b3", normal(rng, 5))],
                  options=conv))
    return b


def conv_then_relu(rng) -> bytes:
    """A 3x3 convolution of a 3-channel input into 3 channels, both it and the RELU reading it model outputs."""
    b = GraphBuilder()
    x = b.input("x", (1, 6, 5, 3))
    y = b.op("CONV_2D", [x, b.const("w", normal(rng, (3, 3, 3, 3))), b.const("b", normal(rng, (3,)))],
             options={"padding": "SAME", "stride_w": 1, "stride_h": 1}, name="conv")
    b.output(y, b.op("RELU", [y], name="relu"))
    return b.to_bytes()
