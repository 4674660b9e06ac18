// SPACE_TO_DEPTH: output channel block (dy * b + dx) of pixel (y, x) is input pixel (y * b + dy, x * b + dx).
fn source(at: vec4<i32>) -> Src {
  let b = p.block;
  let tap = at.w / p.in0_c;
  return Src(0, vec4<i32>(at.x, at.y * b + tap / b, at.z * b + tap % b, at.w % p.in0_c));
}
