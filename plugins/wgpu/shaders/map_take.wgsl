// GATHER with constant indices: output elements in NHWC order are (outer, k, inner); the input's is
// (outer, table[k], inner), walk = (indices, inner size, axis length).  A row outside the axis reads 0.
fn source(at: vec4<i32>) -> Src {
  let flat = flat_index(at);
  let w = p.walk;
  let row = i32(table_lane((flat / w.y) % w.x));
  let e = ((flat / (w.y * w.x)) * w.z + row) * w.y + flat % w.y;
  let s = vec4<i32>(p.in0_d.w, p.in0_d.y, p.in0_d.x, p.in0_c);
  let input_at = vec4<i32>(e / (s.y * s.z * s.w), (e / (s.z * s.w)) % s.y, (e / s.w) % s.z, e % s.w);
  return Src(select(-1, 0, row >= 0 && row < w.z), input_at);
}
