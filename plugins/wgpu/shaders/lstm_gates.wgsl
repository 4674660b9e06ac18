// The basic LSTM cell after its matrix product: gates = [input, candidate, forget, output]
// pre-activations (4 * units channels per row).  dst = new activation, state = new cell state.
@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
  let i = flat_id(gid, groups);
  if (i >= p.count) { return; }
  let o = position(i, p.dst_d);
  let units = p.dst_c;
  var activation = V(0.0);
  var state = V(0.0);
  for (var lane = 0; lane < min(4, units - o.s * 4); lane++) {
    let c = o.s * 4 + lane;
    let input_gate = 1.0 / (1.0 + exp(-gates_lane(lidx(p.gates_d, o.n, o.y, o.x, c))));
    let candidate = tanh(clamp(gates_lane(lidx(p.gates_d, o.n, o.y, o.x, units + c)), -10.0, 10.0));
    let forget_gate = 1.0 / (1.0 + exp(-gates_lane(lidx(p.gates_d, o.n, o.y, o.x, 2 * units + c))));
    let output_gate = 1.0 / (1.0 + exp(-gates_lane(lidx(p.gates_d, o.n, o.y, o.x, 3 * units + c))));
    let cell = input_gate * candidate + forget_gate * prev_state_lane(lidx(p.prev_state_d, o.n, o.y, o.x, c));
    state[lane] = cell;
    activation[lane] = output_gate * tanh(clamp(cell, -10.0, 10.0));
  }
  state_store(vidx(p.state_d, o.n, o.y, o.x, o.s), state);
  emit(activation, o);
}
