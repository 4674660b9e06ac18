// Rows times a weight matrix: FULLY_CONNECTED, 1x1 CONV_2D with stride 1, and convolutions
// whose window covers the whole input.  Output vector (row r, slice s) = bias[s] + the sum
// over input vectors k of in(r, k) . W[s][k].  An operand with `plane` rows per image holds
// row r, vector k at (r / plane) * depth * plane + k * plane + r % plane (a pixel's slices
// for a 1x1 convolution; a whole image, plane 1, when the window covers it).
// weights: [S_out][depth][4 input lanes] vectors of 4 output channels.
//
// A work group of WG_P x WG_S items computes a tile of 2 * WG_P rows by 2 * WG_S output
// slices.  Per step it stages CHUNK input vectors of its rows and the matching weights in
// local memory, so each value read from global memory serves a whole row or column of the
// tile.  Item (i, j) computes rows i and i + WG_P of slices j and j + WG_S: neighbouring
// items read and write neighbouring rows, and items of one row share the weights they read.
// The 2 x 2 block is held in named registers (some compilers keep private arrays in memory).
// With SPLIT > 1 the group has SPLIT such layers (local dimension 2), each summing every
// SPLIT-th chunk of the input vectors into its own block, and the first adds the others'
// blocks from local memory before the epilogue: a product of few rows and long sums (a 7x7
// layer of 960 channels) gives too few tiles to keep a large GPU busy otherwise.
//
// Two producers read only by the product are computed where it stages its input, so their
// results are never stored:
// - DEPTHWISE_INPUT: `in` is the input (dimensions id) of a depthwise convolution and each
//   staged vector is its output (with its activation DEPTHWISE_ACT) at the row's pixel;
//   mid = (width, channels) of that output;
// - GATED_INPUT: the rows of `in` times one gate vector per input vector (and per image
//   when gate_stride is the depth), as a squeeze-and-excitation block scales its input; with
//   GATE_GRID each product rounded onto gate_grid (an integer model's float view).
#if defined(DEPTHWISE_INPUT)
#ifndef DEPTHWISE_GRIDS  // the grids DEPTHWISE_ACT rounds onto (an integer model's float view)
#define DEPTHWISE_GRIDS
#endif
#define INPUT_PARAMS , int4 id, int multiplier, AT(dw_weights), AT(dw_bias), \
    int4 geometry, int4 spacing, int2 mid DEPTHWISE_GRIDS
#define INPUT_BIND BIND(const STORAGE, dw_weights); BIND(const STORAGE, dw_bias)
#elif defined(GATED_INPUT) && defined(GATE_GRID)
#define INPUT_PARAMS , AT(gate), int gate_stride, float4 gate_grid
#define INPUT_BIND BIND(const STORAGE, gate)
#elif defined(GATED_INPUT)
#define INPUT_PARAMS , AT(gate), int gate_stride
#define INPUT_BIND BIND(const STORAGE, gate)
#else
#define INPUT_PARAMS
#define INPUT_BIND
#endif
#define TILE_P (2 * WG_P)
#define TILE_S (2 * WG_S)
#define GROUP (WG_P * WG_S)
#ifndef SPLIT
#define SPLIT 1
#endif
#ifndef MATMUL_TAP  // once per program, however many variants of this template it holds
#define MATMUL_TAP(acc, v, taps) acc += (v).x * (taps)[0] + (v).y * (taps)[1] + (v).z * (taps)[2] + (v).w * (taps)[3]
#endif

__kernel __attribute__((reqd_work_group_size(WG_P, WG_S, SPLIT)))
void KERNEL_NAME(ARENA, AT(out), int4 od, int out_channels, AT(weights), AT(bias), int rows, int depth,
                 int in_plane, int out_plane, AT(in) INPUT_PARAMS EPILOGUE_PARAMS) {
  BIND(OUT_STORAGE, out); BIND(const STORAGE, weights); BIND(const STORAGE, bias); BIND(const STORAGE, in);
  INPUT_BIND;
  __local FLT4 a_tiles[SPLIT][CHUNK][TILE_P];
  __local FLT4 w_tiles[SPLIT][TILE_S][CHUNK * 4];
  int li = get_local_id(0), lj = get_local_id(1), lz = get_local_id(2), item = lj * WG_P + li;
  int row0 = get_group_id(0) * TILE_P, s0 = get_group_id(1) * TILE_S;
  // What this item stages each step: one row at every GROUP / TILE_P-th vector of the chunk,
  // and one vector of the chunk at every GROUP / (CHUNK * 4)-th slice of the tile.
  int a_row = item % TILE_P, a_k = item / TILE_P, r = row0 + a_row;
#if defined(DEPTHWISE_INPUT)
  int a_n = r / in_plane, a_y = r % in_plane / mid.x, a_x = r % in_plane % mid.x;
#define STAGED(k) DEPTHWISE_ACT(depthwise_vector(in, id, multiplier, mid.y, dw_weights, dw_bias, geometry, spacing, \
                                                 KH, KW, a_n, a_y, a_x, (k)))
#elif defined(GATED_INPUT)
  int a_base = (r / in_plane) * depth * in_plane + r % in_plane, a_gate = r / in_plane * gate_stride;
#if defined(GATE_GRID)
#define STAGED(k) fake_quant(LOAD4(in, a_base + (k) * in_plane) * LOAD4(gate, a_gate + (k)), gate_grid)
#else
#define STAGED(k) (LOAD4(in, a_base + (k) * in_plane) * LOAD4(gate, a_gate + (k)))
#endif
#else
  int a_base = (r / in_plane) * depth * in_plane + r % in_plane;
#define STAGED(k) LOAD4(in, a_base + (k) * in_plane)
#endif
  int w_part = item % (CHUNK * 4), w_slice = item / (CHUNK * 4);
  int s_lo = s0 + lj, s_hi = s_lo + WG_S;
  FLT4 lo0 = lz == 0 && s_lo < od.z ? LOAD4(bias, s_lo) : (FLT4)(0), lo1 = lo0;  // slice s_lo, rows i and i + WG_P
  FLT4 hi0 = lz == 0 && s_hi < od.z ? LOAD4(bias, s_hi) : (FLT4)(0), hi1 = hi0;  // slice s_hi
  for (int step = 0; step < depth; step += SPLIT * CHUNK) {  // the same steps for every layer: barriers
    int k0 = step + lz * CHUNK;
    for (int kk = a_k; kk < CHUNK; kk += GROUP / TILE_P) {
      int k = k0 + kk;
      a_tiles[lz][kk][a_row] = r < rows && k < depth ? STAGED(k) : (FLT4)(0);
    }
    int k = k0 + w_part / 4;
    for (int sl = w_slice; sl < TILE_S; sl += GROUP / (CHUNK * 4)) {
      int s = s0 + sl;
      w_tiles[lz][sl][w_part] = s < od.z && k < depth ? LOAD4(weights, (s * depth + k0) * 4 + w_part) : (FLT4)(0);
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int kk = 0; kk < CHUNK; ++kk) {
      FLT4 a0 = a_tiles[lz][kk][li], a1 = a_tiles[lz][kk][li + WG_P];
      __local const FLT4* w_lo = w_tiles[lz][lj] + kk * 4;
      __local const FLT4* w_hi = w_tiles[lz][lj + WG_S] + kk * 4;
      MATMUL_TAP(lo0, a0, w_lo);
      MATMUL_TAP(lo1, a1, w_lo);
      MATMUL_TAP(hi0, a0, w_hi);
      MATMUL_TAP(hi1, a1, w_hi);
    }
    barrier(CLK_LOCAL_MEM_FENCE);
  }
#if SPLIT > 1
  __local FLT4 partial[SPLIT - 1][4][GROUP];
  if (lz > 0) {
    partial[lz - 1][0][item] = lo0;
    partial[lz - 1][1][item] = hi0;
    partial[lz - 1][2][item] = lo1;
    partial[lz - 1][3][item] = hi1;
  }
  barrier(CLK_LOCAL_MEM_FENCE);
  if (lz > 0) return;
  for (int z = 0; z < SPLIT - 1; ++z) {
    lo0 += partial[z][0][item];
    hi0 += partial[z][1][item];
    lo1 += partial[z][2][item];
    hi1 += partial[z][3][item];
  }
#endif
  FLT4 results[4] = {lo0, hi0, lo1, hi1};
  for (int i = 0; i < 4; ++i) {
    int row = row0 + li + (i >> 1) * WG_P, s = (i & 1) ? s_hi : s_lo;
    if (row >= rows || s >= od.z) continue;
    int n = row / out_plane, p = row % out_plane, y = p / od.x, x = p % od.x;
    FLT4 v = results[i];
    EPILOGUE(v, n, y, x, s);
    STORE_OUT(v, out, od, out_channels, n, y, x, s);
  }
}

#undef INPUT_PARAMS
#undef INPUT_BIND
#undef DEPTHWISE_GRIDS
#undef STAGED
#undef TILE_P
#undef TILE_S
#undef GROUP
#undef SPLIT
