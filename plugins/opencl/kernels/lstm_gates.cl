// Gates of the basic LSTM cell, after the fully connected layer produced `gates`
// = [input | candidate | forget | output] (4 x units channels) for each batch row:
//   state = sigmoid(i) * tanh(g) + sigmoid(f) * prev_state;  out = sigmoid(o) * tanh(state)
// One work item per output vector; the new cell state is stored at the same position of `state`.
__kernel void KERNEL_NAME(__global STORAGE* out, int4 od, int units,
                          __global const STORAGE* gates, int4 gd, int gates_channels,
                          __global const STORAGE* prev_state, int4 pd, int prev_channels,
                          __global STORAGE* state, int4 sd, int state_channels EPILOGUE_PARAMS) {
  int x = get_global_id(0), y = get_global_id(1), z = get_global_id(2);
  if (x >= od.x || y >= od.y || z >= od.z * od.w) return;
  int s = z % od.z, n = z / od.z;
  FLT a[4] = {0, 0, 0, 0}, c[4] = {0, 0, 0, 0};
  for (int l = 0; l < 4 && s * 4 + l < units; ++l) {
    int u = s * 4 + l;
    float i = LOAD1(gates, lane_index(gd, n, y, x, u));
    float g = LOAD1(gates, lane_index(gd, n, y, x, units + u));
    float f = LOAD1(gates, lane_index(gd, n, y, x, 2 * units + u));
    float o = LOAD1(gates, lane_index(gd, n, y, x, 3 * units + u));
    float prev = LOAD1(prev_state, lane_index(pd, n, y, x, u));
    float next = tanh(g) / (1.0f + exp(-i)) + prev / (1.0f + exp(-f));
    c[l] = next;
    a[l] = tanh(next) / (1.0f + exp(-o));
  }
  FLT4 v = (FLT4)(a[0], a[1], a[2], a[3]);
  EPILOGUE(v, n, y, x, s);
  STORE4(v, out, vec_index(od, n, y, x, s));
  STORE4((FLT4)(c[0], c[1], c[2], c[3]), state, vec_index(sd, n, y, x, s));
}
