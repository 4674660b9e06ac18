// A partition output leaves as NHWC float32: converted on the device so the host reads
// exactly the caller's array, without padding lanes.
__kernel void KERNEL_NAME(ARENA, AT(in), int4 id, int in_channels, AT(out)) {
  BIND(const STORAGE, in); BIND(float, out);
  int x = get_global_id(0), y = get_global_id(1), z = get_global_id(2);
  if (x >= id.x || y >= id.y || z >= id.z * id.w) return;
  int s = z % id.z, n = z / id.z, c = s * 4;
  float4 v = TO_ACC4(LOAD4(in, vec_index(id, n, y, x, s)));
  __global float* dst = out + ((n * id.y + y) * id.x + x) * in_channels + c;
  if (c + 4 <= in_channels) {
    vstore4(v, 0, dst);
  } else {
    int left = in_channels - c;
    dst[0] = v.x;
    if (left > 1) dst[1] = v.y;
    if (left > 2) dst[2] = v.z;
  }
}
