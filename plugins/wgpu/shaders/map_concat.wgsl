// CONCATENATION along axis (0..3 = n, y, x, c): input k holds the output range [end_{k-1}, end_k).
fn source(at: vec4<i32>) -> Src {
  let along = at[p.axis];
  var start = 0;
$CASES
  return Src(-1, at);
}
