// Input vector i of a matrix product (in image `image`, input slice `slice`), as stored.
fn matmul_input(i: i32, image: i32, slice: i32) -> VA {
  return VA(src[i]);
}
