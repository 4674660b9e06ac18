// SPACE_TO_BATCH_ND: output image b is block offset b / N (row offset, column offset) of input image b % N,
// padded by before = (rows, columns) with zeros; block = (rows, columns).
fn source(at: vec4<i32>) -> Src {
  let images = p.in0_d.w;
  let offset = at.x / images;
  let input_at = vec4<i32>(at.x % images, at.y * p.block.x + offset / p.block.y - p.before.x,
                           at.z * p.block.y + offset % p.block.y - p.before.y, at.w);
  let inside = input_at.y >= 0 && input_at.y < p.in0_d.y && input_at.z >= 0 && input_at.z < p.in0_d.x;
  return Src(select(-1, 0, inside), input_at);
}
