// MIRROR_PAD: coordinates before the input mirror back into it, without the edge (REFLECT) or
// with it (SYMMETRIC, symmetric = 1); before = padding ahead of each axis (n, y, x, c).
fn source(at: vec4<i32>) -> Src {
  let size = vec4<i32>(p.in0_d.w, p.in0_d.y, p.in0_d.x, p.in0_c);
  let i = at - p.before;
  let low = select(i, -i - vec4<i32>(p.symmetric), i < vec4<i32>(0));
  return Src(0, select(low, 2 * size - 2 + p.symmetric - low, low >= size));
}
