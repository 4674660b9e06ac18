// CONV_2D with few outputs and a long reduction (a detector head: 3x3x256 taps into a 5x5x8
// result): the WG invocations of a workgroup share one output vector, each summing every WG-th
// (tap, input slice) pair in f32, and combine their partial sums (workgroup_reduce).  conv2d.wgsl
// would give each of a handful of invocations the whole reduction, one memory round trip after
// another.  Same bindings, weight layout and window as conv2d.wgsl; one workgroup per output
// vector, along x and wrapping into y past the dispatch limit.
@compute @workgroup_size(WG_X, WG_Y, WG_Z)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
  let i = i32(wid.x + wid.y * groups.x);
  let valid = i < p.count;
  let o = position(min(i, p.count - 1), p.dst_d);
  let d = p.src_d;
  let length = p.window.x * p.window.y * d.z;  // (tap, input slice) pairs
  let ix0 = o.x * p.window.z - p.spacing.x;
  let iy0 = o.y * p.window.w - p.spacing.y;
  let first = o.s * length * 4;  // the output slice's weight blocks, in (tap, input slice) order
  var acc = V(0.0);
  for (var t = i32(li); valid && t < length; t += i32(WG)) {
    let tap = t / d.z;
    let ix = ix0 + (tap % p.window.x) * p.spacing.z;
    let iy = iy0 + (tap / p.window.x) * p.spacing.w;
    if (ix < 0 || ix >= d.x || iy < 0 || iy >= d.y) { continue; }  // padding: zero
    acc += V(weight_block(first + t * 4) * VA(src[vidx(d, o.n, iy, ix, t % d.z)]));
  }
  let total = workgroup_reduce(acc, li, false);
  if (li == 0u && valid) {
    emit(total + bias_at(o.s), o);
  }
}
