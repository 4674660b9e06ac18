// Shared by every kernel of a program: storage and arithmetic types, PHWC4 addressing, helpers.
//
// Tensors are PHWC4 buffers ([N][S][H][W][4], see delegate.gpu.layout) described by
// an int4 of dimensions (W, H, S, N).  STORAGE is the buffer element type: float, or
// half read and written through vloada_half/vstorea_half, which every OpenCL device has,
// so fp16 storage halves memory traffic even where cl_khr_fp16 is missing.  FLT4 is
// the arithmetic type: half4 only where the device has cl_khr_fp16 and fp16 was
// allowed.  Reductions use float4 (ACC4) whatever the precision.  The activations and binary
// ops (ACT_<op>, BIN_<op>) follow this prelude, rendered from delegate.gpu.dialect.

#if defined(HALF_MATH)
#pragma OPENCL EXTENSION cl_khr_fp16 : enable
typedef half FLT;
typedef half4 FLT4;
#define TO_FLT4(v) convert_half4(v)
#else
typedef float FLT;
typedef float4 FLT4;
#define TO_FLT4(v) (v)
#endif
typedef float4 ACC4;
#define TO_ACC4(v) convert_float4(v)

// A partition's tensors and constants are ranges of one device buffer, its arena (delegate_opencl.arena): a
// kernel takes the arena once, as ARENA, and each tensor as its byte offset, AT(name); BIND(T, name) then
// declares the tensor's pointer and VIEW(T, name) is it as an expression.  NVIDIA's driver charges every
// buffer argument of every launch (~0.4 us) and a scalar argument almost nothing.  Every range starts on a
// 256-byte boundary, as a buffer of its own would, so the aligned vector accesses below stay aligned.
#define ARENA __global uchar* arena
#define AT(name) ulong name##_at
#define VIEW(T, name) ((__global T*)(arena + name##_at))
#define BIND(T, name) __global T* name = VIEW(T, name)

// Buffers start aligned and every vector index is in whole vectors, so vectors move as
// one aligned 16- or 8-byte access: through vector pointers, or without cl_khr_fp16 through
// vloada_half4/vstorea_half4, whose alignment promise vload_half4 (2 bytes) does not give.
#if defined(HALF_STORAGE)
#define STORAGE half
#if defined(HALF_MATH)
#define LOAD4(p, i) (((__global const half4*)(p))[i])
#define STORE4(v, p, i) (((__global half4*)(p))[i] = (v))
#define LOAD1(p, i) ((p)[i])
#define STORE1(v, p, i) ((p)[i] = (v))
#else
#define LOAD4(p, i) vloada_half4((i), (p))
#define STORE4(v, p, i) vstorea_half4_rte((v), (i), (p))
#define LOAD1(p, i) vload_half((i), (p))
#define STORE1(v, p, i) vstore_half_rte((v), (i), (p))
#endif
#else
#define STORAGE float
#define LOAD4(p, i) (((__global const float4*)(p))[i])
#define STORE4(v, p, i) (((__global float4*)(p))[i] = (v))
#define LOAD1(p, i) ((p)[i])
#define STORE1(v, p, i) ((p)[i] = (v))
#endif

// Index of the vector at (n, y, x, slice s) of a tensor with dimensions d = (W, H, S, N).
inline int vec_index(int4 d, int n, int y, int x, int s) {
  return ((n * d.z + s) * d.y + y) * d.x + x;
}

// Index of the scalar channel c at (n, y, x).
inline int lane_index(int4 d, int n, int y, int x, int c) {
  return vec_index(d, n, y, x, c >> 2) * 4 + (c & 3);
}

// Zeroes the lanes past `channels` in slice s: padding lanes always hold zero.
inline FLT4 mask_tail(FLT4 v, int s, int channels) {
  int keep = channels - s * 4;
  if (keep >= 4) return v;
  return (FLT4)(v.x, keep > 1 ? v.y : (FLT)0, keep > 2 ? v.z : (FLT)0, (FLT)0);
}

// Slice s at (n, y, x) of a partition input in host order (NHWC with `channels` channels, d = (W, H,
// S, N)), read by the kernel needing it instead of a converted PHWC4 copy: float32, or a quantized
// input's integers dequantized with q = (scale, zero point) (floats ignore q); lanes past the channels
// are zero.  HOST_READ(T) names the reader of element type T.
#define HOST_VECTOR(T, DEQUANT) \
  inline FLT4 host_vector_##T(__global const T* in, int4 d, int channels, float4 q, int n, int y, int x, int s) { \
    int c = s * 4, left = channels - c; \
    __global const T* p = in + ((n * d.y + y) * d.x + x) * channels + c; \
    float4 v = left >= 4 ? convert_float4(vload4(0, p)) \
                         : (float4)((float)p[0], left > 1 ? (float)p[1] : 0.0f, left > 2 ? (float)p[2] : 0.0f, 0.0f); \
    return mask_tail(TO_FLT4(DEQUANT), s, channels); \
  }
HOST_VECTOR(float, v)
HOST_VECTOR(uchar, (v - q.y) * q.x)
HOST_VECTOR(char, (v - q.y) * q.x)
#define HOST_READ_(T) host_vector_##T
#define HOST_READ(T) HOST_READ_(T)

// A kernel's output vector at (n, y, x), slice s, stored by STORE_OUT (see delegate_opencl.program): as PHWC4
// (OUT_STORAGE the storage type), or for a partition output no kernel of the partition reads (HOST_OUTPUT) its
// channels in host order, NHWC float32 (OUT_STORAGE float), so the host reads them without a conversion kernel.
inline void host_store(float4 v, __global float* out, int4 d, int channels, int n, int y, int x, int s) {
  int c = s * 4, left = channels - c;
  __global float* p = out + ((n * d.y + y) * d.x + x) * channels + c;
  if (left >= 4) {
    vstore4(v, 0, p);
    return;
  }
  p[0] = v.x;
  if (left > 1) p[1] = v.y;
  if (left > 2) p[2] = v.z;
}

// Reads operand t (dimensions d) at an output position, broadcasting dimensions of size 1;
// splat_channel is set when t has a single channel that stands for all of them.
inline FLT4 read_bcast(__global const STORAGE* t, int4 d, int splat_channel, int n, int y, int x, int s) {
  FLT4 v = LOAD4(t, vec_index(d, d.w == 1 ? 0 : n, d.y == 1 ? 0 : y, d.x == 1 ? 0 : x, d.z == 1 ? 0 : s));
  return splat_channel ? (FLT4)(v.x) : v;
}

inline FLT4 fake_quant(FLT4 v, float4 q) {  // q = (scale, zero point, qmin, qmax)
  float4 level = clamp(round(convert_float4(v) / q.x) + q.y, q.z, q.w);
  return TO_FLT4((level - q.y) * q.x);
}

// The input vector feeding depthwise output slice s at (n, iy, ix): the input slice itself, or
// with a channel multiplier the input channel c / multiplier of each output lane c.
inline FLT4 depthwise_input(__global const STORAGE* in, int4 id, int n, int iy, int ix, int s, int multiplier,
                            int out_channels) {
  if (multiplier == 1) return LOAD4(in, vec_index(id, n, iy, ix, s));
  int last = out_channels - 1, c = s * 4;
  return (FLT4)(LOAD1(in, lane_index(id, n, iy, ix, min(c, last) / multiplier)),
                LOAD1(in, lane_index(id, n, iy, ix, min(c + 1, last) / multiplier)),
                LOAD1(in, lane_index(id, n, iy, ix, min(c + 2, last) / multiplier)),
                LOAD1(in, lane_index(id, n, iy, ix, min(c + 3, last) / multiplier)));
}

// One depthwise convolution output vector at (n, y, x), slice s: the bias plus the kh x kw taps
// of its window (weights [S][KH][KW] vectors); taps outside the input count as zero.
// geometry = (kernel_w, kernel_h, stride_x, stride_y); spacing = (pad_x, pad_y, dilation_x,
// dilation_y).  Callers pass kh and kw as compile-time constants, so the taps unroll.
inline FLT4 depthwise_vector(__global const STORAGE* in, int4 id, int multiplier, int out_channels,
                             __global const STORAGE* weights, __global const STORAGE* bias, int4 geometry,
                             int4 spacing, int kh, int kw, int n, int y, int x, int s) {
  FLT4 acc = LOAD4(bias, s);
  int x0 = x * geometry.z - spacing.x, y0 = y * geometry.w - spacing.y;
  for (int ky = 0; ky < kh; ++ky) {
    int iy = y0 + ky * spacing.w;
    if (iy < 0 || iy >= id.y) continue;
    for (int kx = 0; kx < kw; ++kx) {  // a tap left or right of the row reads its edge, times zero
      int ix = x0 + kx * spacing.z;
      FLT inside = ix >= 0 && ix < id.x;
      acc += LOAD4(weights, (s * kh + ky) * kw + kx) * inside *
             depthwise_input(in, id, n, iy, clamp(ix, 0, id.x - 1), s, multiplier, out_channels);
    }
  }
  return acc;
}

// Work-group reductions.  The `size` items (a power of two) of one reduction have put their
// values in scratch[0 .. size); afterwards scratch[0] holds the result.  Every item of the
// work group must call these, with the same size, since they synchronise it.
inline void group_sum(__local float4* scratch, int item, int size) {
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int half_size = size / 2; half_size > 0; half_size /= 2) {
    if (item < half_size) scratch[item] += scratch[item + half_size];
    barrier(CLK_LOCAL_MEM_FENCE);
  }
}

inline void group_max(__local float4* scratch, int item, int size) {
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int half_size = size / 2; half_size > 0; half_size /= 2) {
    if (item < half_size) scratch[item] = max(scratch[item], scratch[item + half_size]);
    barrier(CLK_LOCAL_MEM_FENCE);
  }
}
