// CONV_2D with few outputs and a long reduction (a detector head: 3x3x256 taps into a 5x5x8
// result): GROUP work items (local dimension 0) share one output vector (global dimension 1
// picks it), each summing every GROUP-th (tap, input slice) pair, and add their partial sums.
// conv2d.cl would give each of a handful of work items the whole reduction, one memory
// round trip after another.  Same arguments and weight layout as conv2d.cl.
__kernel __attribute__((reqd_work_group_size(GROUP, 1, 1)))
void KERNEL_NAME(ARENA, AT(out), int4 od, int out_channels,
                 AT(in), int4 id, int in_channels,
                 AT(weights), AT(bias),
                 int4 geometry, int4 spacing EPILOGUE_PARAMS) {
  BIND(OUT_STORAGE, out); BIND(const STORAGE, in); BIND(const STORAGE, weights); BIND(const STORAGE, bias);
  __local float4 scratch[GROUP];
  int t = get_local_id(0), o = get_global_id(1);
  int x = o % od.x, y = o / od.x % od.y, z = o / (od.x * od.y);
  int s = z % od.z, n = z / od.z;
  bool valid = z < od.z * od.w;
  int depth = id.z, length = geometry.x * geometry.y * depth;
  int ix0 = x * geometry.z - spacing.x, iy0 = y * geometry.w - spacing.y;
  ACC4 sum = (ACC4)(0.0f);
  for (int i = t; valid && i < length; i += GROUP) {
    int si = i % depth, tap = i / depth, kx = tap % geometry.x, ky = tap / geometry.x;
    int ix = ix0 + kx * spacing.z, iy = iy0 + ky * spacing.w;
    if (ix < 0 || ix >= id.x || iy < 0 || iy >= id.y) continue;  // padding: zero
    int w = (((s * geometry.y + ky) * geometry.x + kx) * depth + si) * 4;
    FLT4 v = LOAD4(in, vec_index(id, n, iy, ix, si));
    sum += TO_ACC4(v.x * LOAD4(weights, w) + v.y * LOAD4(weights, w + 1) + v.z * LOAD4(weights, w + 2) +
                   v.w * LOAD4(weights, w + 3));
  }
  scratch[t] = sum;
  group_sum(scratch, t, GROUP);
  if (t > 0 || !valid) return;
  FLT4 v = TO_FLT4(scratch[0]) + LOAD4(bias, s);
  EPILOGUE(v, n, y, x, s);
  STORE_OUT(v, out, od, out_channels, n, y, x, s);
}
