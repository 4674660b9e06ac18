// AVERAGE_POOL_2D / MAX_POOL_2D over the window clipped to the input (TFLite averages
// only the taps inside the image).  The average accumulates in fp32.
// window = (filter_w, filter_h, stride_x, stride_y); spacing = (pad_x, pad_y, 1, 1), as for a
// convolution without dilation.
__kernel void KERNEL_NAME(ARENA, AT(out), int4 od, int out_channels,
                          AT(in), int4 id, int in_channels,
                          int4 window, int4 spacing, int is_max EPILOGUE_PARAMS) {
  BIND(OUT_STORAGE, out); BIND(const STORAGE, in);
  int x = get_global_id(0), y = get_global_id(1), z = get_global_id(2);
  if (x >= od.x || y >= od.y || z >= od.z * od.w) return;
  int s = z % od.z, n = z / od.z;
  int x0 = x * window.z - spacing.x, y0 = y * window.w - spacing.y;
  int y_begin = max(y0, 0), y_end = min(y0 + window.y, id.y);
  int x_begin = max(x0, 0), x_end = min(x0 + window.x, id.x);
  ACC4 sum = (ACC4)(0.0f);
  FLT4 best = (FLT4)(-INFINITY);
  for (int iy = y_begin; iy < y_end; ++iy) {
    for (int ix = x_begin; ix < x_end; ++ix) {
      FLT4 v = LOAD4(in, vec_index(id, n, iy, ix, s));
      best = max(best, v);
      sum += TO_ACC4(v);
    }
  }
  int count = max((y_end - y_begin) * (x_end - x_begin), 1);
  FLT4 v = is_max ? best : TO_FLT4(sum / (float)count);
  EPILOGUE(v, n, y, x, s);
  STORE_OUT(v, out, od, out_channels, n, y, x, s);
}
