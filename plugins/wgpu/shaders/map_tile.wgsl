// TILE: the input element at the output coordinate modulo the input's sizes.
fn source(at: vec4<i32>) -> Src {
  return Src(0, at % vec4<i32>(p.in0_d.w, p.in0_d.y, p.in0_d.x, p.in0_c));
}
