// One input of a CONCATENATION: copies it into the output at `offset` = (x, y, channel, n).
// Inputs are copied in order, so when the channel offset is a multiple of 4 a whole
// vector may be stored: its padding lanes land where the next input is written later.
__kernel void KERNEL_NAME(__global STORAGE* out, int4 od, int out_channels,
                          __global const STORAGE* in, int4 id, int in_channels, int4 offset EPILOGUE_PARAMS) {
  int x = get_global_id(0), y = get_global_id(1), z = get_global_id(2);
  if (x >= id.x || y >= id.y || z >= id.z * id.w) return;
  int s = z % id.z, n = z / id.z;
  FLT4 v = LOAD4(in, vec_index(id, n, y, x, s));
  int ox = x + offset.x, oy = y + offset.y, on = n + offset.w;
  EPILOGUE(v, on, oy, ox, s);
  v = mask_tail(v, s, in_channels);
  if ((offset.z & 3) == 0) {
    STORE4(v, out, vec_index(od, on, oy, ox, s + (offset.z >> 2)));
    return;
  }
  FLT lanes[4] = {v.x, v.y, v.z, v.w};
  for (int l = 0; l < 4 && s * 4 + l < in_channels; ++l) {
    STORE1(lanes[l], out, lane_index(od, on, oy, ox, offset.z + s * 4 + l));
  }
  // The input ending the channels zeroes the padding lanes after them: the buffer may be shared
  // with an earlier tensor, whose values there would reach the kernels reading whole vectors.
  if (s == id.z - 1 && offset.z + in_channels == out_channels) {
    for (int c = out_channels; c < od.z * 4; ++c) {
      STORE1((FLT)0, out, lane_index(od, on, oy, ox, c));
    }
  }
}
