// BATCH_TO_SPACE_ND: pixel (y, x) + before of output image n is pixel (y / block, x / block) of input image
// ((y % block.x) * block.y + x % block.y) * N + n; block = (rows, columns), before = the crop (rows, columns).
fn source(at: vec4<i32>) -> Src {
  let y = at.y + p.before.x;
  let x = at.z + p.before.y;
  return Src(0, vec4<i32>(((y % p.block.x) * p.block.y + x % p.block.y) * p.dst_d.w + at.x, y / p.block.x,
                          x / p.block.y, at.w));
}
