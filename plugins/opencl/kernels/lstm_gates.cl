// Gates of the basic LSTM cell, after the fully connected layer produced `gates`
// = [input | candidate | forget | output] (4 x units channels) for each batch row:
//   state = sigmoid(i) * tanh(g) + sigmoid(f) * prev_state;  out = sigmoid(o) * tanh(state)
// One work item per output vector; the new cell state is stored at the same position of `state`.
__kernel void KERNEL_NAME(ARENA, AT(out), int4 od, int units,
                          AT(gates), int4 gd, int gates_channels,
                          AT(prev_state), int4 pd, int prev_channels,
                          AT(state), int4 sd, int state_channels EPILOGUE_PARAMS) {
  BIND(STORAGE, out); BIND(const STORAGE, gates); BIND(const STORAGE, prev_state); BIND(STORAGE, state);
  int x = get_global_id(0), y = get_global_id(1), z = get_global_id(2);
  if (x >= od.x || y >= od.y || z >= od.z * od.w) return;
  int s = z % od.z, n = z / od.z;
  // the four units of this vector lane by lane (padding lanes stay 0: their gates read as 0 give 0), then the
  // gates through the kit's LOGISTIC and TANH, the same formulas every dialect renders
  float i[4] = {0, 0, 0, 0}, g[4] = {0, 0, 0, 0}, f[4] = {0, 0, 0, 0}, o[4] = {0, 0, 0, 0}, p[4] = {0, 0, 0, 0};
  for (int l = 0; l < 4 && s * 4 + l < units; ++l) {
    int u = s * 4 + l;
    i[l] = LOAD1(gates, lane_index(gd, n, y, x, u));
    g[l] = LOAD1(gates, lane_index(gd, n, y, x, units + u));
    f[l] = LOAD1(gates, lane_index(gd, n, y, x, 2 * units + u));
    o[l] = LOAD1(gates, lane_index(gd, n, y, x, 3 * units + u));
    p[l] = LOAD1(prev_state, lane_index(pd, n, y, x, u));
  }
  FLT4 next = ACT_TANH(TO_FLT4(((float4)(g[0], g[1], g[2], g[3])))) * ACT_LOGISTIC(TO_FLT4(((float4)(i[0], i[1], i[2], i[3]))))
            + TO_FLT4(((float4)(p[0], p[1], p[2], p[3]))) * ACT_LOGISTIC(TO_FLT4(((float4)(f[0], f[1], f[2], f[3]))));
  FLT4 v = ACT_TANH(next) * ACT_LOGISTIC(TO_FLT4(((float4)(o[0], o[1], o[2], o[3]))));
  EPILOGUE(v, n, y, x, s);
  STORE4(v, out, vec_index(od, n, y, x, s));
  STORE4(next, state, vec_index(sd, n, y, x, s));
}
