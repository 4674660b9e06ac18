// Input vector i of a matrix product scaled by its image's gate for that input slice: a MUL by a
// per-channel vector (a squeeze-and-excitation gate) folded into the product reading its result.
fn matmul_input(i: i32, image: i32, slice: i32) -> VA {
  let g = p.gate_d;
  return VA(src[i]) * VA(gate[select(image, 0, g.w == 1) * g.z + slice]);
}
