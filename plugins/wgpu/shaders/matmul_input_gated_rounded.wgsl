// Input vector i of a matrix product scaled by its image's gate for that input slice and rounded onto the
// product's grid: a MUL by a per-channel vector (a squeeze-and-excitation gate) of an integer model, in the
// float view, folded into the product reading its result.
fn matmul_input(i: i32, image: i32, slice: i32) -> VA {
  let g = p.gate_d;
  return VA(fake_quant(V(src[i]) * V(gate[select(image, 0, g.w == 1) * g.z + slice]), p.gate_grid));
}
