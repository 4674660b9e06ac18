// ONE_HOT: output elements in NHWC order are (outer, d, inner), walk = (depth, inner size); each is
// `on_value` where the index at (outer, inner) of `src` (the float view of the indices) equals d, else `off_value`.
fn lane_value(element: i32) -> f32 {
  let w = p.walk;
  let d = (element / w.y) % w.x;
  let i = (element / (w.x * w.y)) * w.y + element % w.y;
  let s = p.src_d;
  let index = src_lane(lidx(s, i / (s.y * s.x * p.src_c), (i / (s.x * p.src_c)) % s.y, (i / p.src_c) % s.x,
                            i % p.src_c));
  return select(p.off_value, p.on_value, index == f32(d));
}
