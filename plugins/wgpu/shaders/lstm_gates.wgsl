// The basic LSTM cell after its matrix product: gates = [input, candidate, forget, output]
// pre-activations (4 * units channels per row).  dst = new activation, state = new cell state:
//   state = sigmoid(i) * tanh(g) + sigmoid(f) * prev_state;  out = sigmoid(o) * tanh(state)
// with the kit's LOGISTIC and TANH (unary_LOGISTIC, unary_TANH: delegate.gpu.dialect's table, as
// every epilogue uses them), four units at a time.

// The output slice's four units of the gate whose pre-activations start at channel `first`.
fn gate(o: Pos, first: i32) -> V {
  var v = V(0.0);
  for (var lane = 0; lane < min(4, p.dst_c - o.s * 4); lane++) {
    v[lane] = gates_lane(lidx(p.gates_d, o.n, o.y, o.x, first + o.s * 4 + lane));
  }
  return v;
}

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
  let i = flat_id(gid, groups);
  if (i >= p.count) { return; }
  let o = position(i, p.dst_d);
  let units = p.dst_c;
  let previous = prev_state_at(vidx(p.prev_state_d, o.n, o.y, o.x, o.s));
  let state = mask_tail(unary_LOGISTIC(gate(o, 0)) * unary_TANH(gate(o, units))
                        + unary_LOGISTIC(gate(o, 2 * units)) * previous, o.s, units);
  state_store(vidx(p.state_d, o.n, o.y, o.x, o.s), state);
  emit(unary_LOGISTIC(gate(o, 3 * units)) * unary_TANH(state), o);
}
