// Two 1x1 convolutions of one pixel per image (the bottleneck of a squeeze-and-excitation block) in
// one launch: the first's result, through HIDDEN_ACT (its activations), stays in local memory for the
// second.  One work group of GROUP items per image; items take output slices in turn.  weights: both
// layers' vectors as matvec.cl reads them ([S_out][S_in][4 input lanes]), the second's from vector
// `second`; bias: both layers' biases, the second's after the first's HIDDEN slices.  HIDDEN_PARAMS: the
// grids HIDDEN_ACT rounds onto (an integer model's float view).
#ifndef HIDDEN_PARAMS
#define HIDDEN_PARAMS
#endif
__kernel __attribute__((reqd_work_group_size(GROUP, 1, 1)))
void KERNEL_NAME(ARENA, AT(out), int4 od, int out_channels, AT(in), int4 id,
                 int in_channels, AT(weights), AT(bias),
                 int hidden_channels, int second HIDDEN_PARAMS EPILOGUE_PARAMS) {
  BIND(OUT_STORAGE, out); BIND(const STORAGE, in); BIND(const STORAGE, weights); BIND(const STORAGE, bias);
  __local ACC4 hidden[HIDDEN];
  int t = get_local_id(0), n = get_group_id(0);
  for (int s = t; s < HIDDEN; s += GROUP) {
    ACC4 acc = (ACC4)(0.0f);
    for (int si = 0, w = s * id.z * 4; si < id.z; ++si, w += 4) {
      ACC4 v = TO_ACC4(LOAD4(in, vec_index(id, n, 0, 0, si)));
      acc += v.x * TO_ACC4(LOAD4(weights, w)) + v.y * TO_ACC4(LOAD4(weights, w + 1)) +
             v.z * TO_ACC4(LOAD4(weights, w + 2)) + v.w * TO_ACC4(LOAD4(weights, w + 3));
    }
    FLT4 h = TO_FLT4(acc) + LOAD4(bias, s);
    hidden[s] = TO_ACC4(mask_tail(HIDDEN_ACT(h), s, hidden_channels));
  }
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int s = t; s < od.z; s += GROUP) {
    ACC4 acc = (ACC4)(0.0f);
    for (int si = 0, w = second + s * HIDDEN * 4; si < HIDDEN; ++si, w += 4) {
      ACC4 v = hidden[si];
      acc += v.x * TO_ACC4(LOAD4(weights, w)) + v.y * TO_ACC4(LOAD4(weights, w + 1)) +
             v.z * TO_ACC4(LOAD4(weights, w + 2)) + v.w * TO_ACC4(LOAD4(weights, w + 3));
    }
    FLT4 v = TO_FLT4(acc) + LOAD4(bias, HIDDEN + s);
    EPILOGUE(v, n, 0, 0, s);
    STORE_OUT(v, out, od, out_channels, n, 0, 0, s);
  }
}
#undef HIDDEN_PARAMS
