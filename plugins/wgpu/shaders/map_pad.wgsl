// PAD and PADV2: before = padding ahead of each axis (n, y, x, c); outside the input, fill (read_vec's default).
fn source(at: vec4<i32>) -> Src {
  let input_at = at - p.before;
  let size = vec4<i32>(p.in0_d.w, p.in0_d.y, p.in0_d.x, p.in0_c);
  return Src(select(0, -1, any(input_at < vec4<i32>(0)) || any(input_at >= size)), input_at);
}
