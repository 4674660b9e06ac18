// DEPTH_TO_SPACE: output pixel (y, x) takes channel block (y % b) * b + x % b of input pixel (y / b, x / b).
fn source(at: vec4<i32>) -> Src {
  let b = p.block;
  return Src(0, vec4<i32>(at.x, at.y / b, at.z / b, ((at.y % b) * b + at.z % b) * p.dst_c + at.w));
}
