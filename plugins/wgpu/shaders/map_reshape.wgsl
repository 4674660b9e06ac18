// RESHAPE: the element at the same position in NHWC order.
fn source(at: vec4<i32>) -> Src {
  let flat = flat_index(at);
  let d = p.in0_d;
  let rest = flat / p.in0_c;
  return Src(0, vec4<i32>(rest / (d.x * d.y), (rest / d.x) % d.y, rest % d.x, flat % p.in0_c));
}
