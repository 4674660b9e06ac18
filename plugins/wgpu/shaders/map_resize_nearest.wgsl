// RESIZE_NEAREST_NEIGHBOR: the input pixel under the output pixel; scale = input pixels per output
// pixel (x, y), rounding as LiteRT's kernel does (half away from zero with align_corners).
fn nearest(o: i32, scale: f32, size: i32) -> i32 {
  let at = (f32(o) + select(0.0, 0.5, p.half_pixel == 1)) * scale;
  let i = i32(select(floor(at), floor(at + 0.5), p.align == 1));
  return max(min(i, size - 1), 0);
}

fn source(at: vec4<i32>) -> Src {
  return Src(0, vec4<i32>(at.x, nearest(at.y, p.scale.y, p.in0_d.y), nearest(at.z, p.scale.x, p.in0_d.x), at.w));
}
