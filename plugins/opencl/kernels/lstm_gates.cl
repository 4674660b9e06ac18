// Gates of the basic LSTM cell, after the fully connected layer produced `gates`
// = [input | candidate | forget | output] (4 x units channels) for each batch row:
//   state = sigmoid(i) * tanh(g) + sigmoid(f) * prev_state;  activ = sigmoid(o) * tanh(state)
// Rows lie along x (a rank-2 tensor is (1, 1, rows, channels) in the 4-D view).
__kernel void KERNEL_NAME(__global STORAGE* activ, __global STORAGE* state, int4 od, int units,
                          __global const STORAGE* gates, int4 gd,
                          __global const STORAGE* prev_state EPILOGUE_PARAMS) {
  int x = get_global_id(0), s = get_global_id(1);
  if (x >= od.x || s >= od.z) return;
  FLT a[4] = {0, 0, 0, 0}, c[4] = {0, 0, 0, 0};
  for (int l = 0; l < 4 && s * 4 + l < units; ++l) {
    int u = s * 4 + l;
    float i = LOAD1(gates, lane_index(gd, 0, 0, x, u));
    float g = LOAD1(gates, lane_index(gd, 0, 0, x, units + u));
    float f = LOAD1(gates, lane_index(gd, 0, 0, x, 2 * units + u));
    float o = LOAD1(gates, lane_index(gd, 0, 0, x, 3 * units + u));
    float prev = LOAD1(prev_state, lane_index(od, 0, 0, x, u));
    float next = tanh(g) / (1.0f + exp(-i)) + prev / (1.0f + exp(-f));
    c[l] = next;
    a[l] = tanh(next) / (1.0f + exp(-o));
  }
  STORE4((FLT4)(a[0], a[1], a[2], a[3]), activ, vec_index(od, 0, 0, x, s));
  STORE4((FLT4)(c[0], c[1], c[2], c[3]), state, vec_index(od, 0, 0, x, s));
}
