// Shared by every kernel: types, PHWC4 addressing, rounding onto a quantization grid.
//
// Tensors are PHWC4 buffers ([N][S][H][W] vectors of 4 channels, see delegate.gpu.layout)
// described by dims d = (W, H, S, N).  S is the storage element type (f32, or f16 when
// fp16 is allowed); epilogues, reductions and softmax use V = vec4<f32>.  The multiply-adds
// of convolutions and matrix products use VA = vec4<A>, A being f16 only when fp16 is allowed
// (half the registers and twice the arithmetic rate on most GPUs).
// Lanes past a tensor's channel count hold zero, and every store keeps them so.

$ENABLE
alias S = $STORAGE;
alias V = vec4<f32>;
alias A = $ARITH;
alias VA = vec4<A>;
// Workgroup shape: flat kernels are WG x 1 x 1, tiled kernels choose their own.
const WG_X: u32 = ${WG_X}u;
const WG_Y: u32 = ${WG_Y}u;
const WG_Z: u32 = ${WG_Z}u;
const WG: u32 = WG_X * WG_Y * WG_Z;

// Output position of one work item: image n, row y, column x, channel slice s.
struct Pos { n: i32, y: i32, x: i32, s: i32 }

// The flat work item index; dispatches wider than 65535 workgroups wrap into gid.y.
fn flat_id(gid: vec3<u32>, groups: vec3<u32>) -> i32 {
  return i32(gid.x + gid.y * groups.x * WG);
}

fn position(i: i32, d: vec4<i32>) -> Pos {
  let plane = d.x * d.y;
  let rest = i / plane;
  return Pos(rest / d.z, (i % plane) / d.x, i % d.x, rest % d.z);
}

fn vidx(d: vec4<i32>, n: i32, y: i32, x: i32, s: i32) -> i32 {
  return ((n * d.z + s) * d.y + y) * d.x + x;
}

// Index of channel c at (n, y, x) counted in scalars.
fn lidx(d: vec4<i32>, n: i32, y: i32, x: i32, c: i32) -> i32 {
  return vidx(d, n, y, x, c >> 2u) * 4 + (c & 3);
}

// v with the lanes of slice s past the channel count replaced by fill.
fn fill_tail(v: V, s: i32, channels: i32, fill: f32) -> V {
  return select(V(fill), v, vec4<i32>(0, 1, 2, 3) < vec4<i32>(channels - s * 4));
}

fn mask_tail(v: V, s: i32, channels: i32) -> V {
  return fill_tail(v, s, channels, 0.0);
}

// Rounds onto a quantization grid q = (scale, zero point, qmin, qmax), ties away from zero.
fn fake_quant(v: V, q: V) -> V {
  let scaled = v / q.x;
  let level = clamp(sign(scaled) * floor(abs(scaled) + 0.5) + q.y, V(q.z), V(q.w));
  return (level - q.y) * q.x;
}

// The activations and binary ops (unary_<op>, binary_<op>) follow, rendered from delegate.gpu.dialect.
