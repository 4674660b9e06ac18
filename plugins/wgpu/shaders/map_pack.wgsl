// PACK: output axis `axis` (NHWC view) says which input holds the element; its coordinate there
// is the output's without that axis.
fn source(at: vec4<i32>) -> Src {
  var src = vec4<i32>(0);
  var k = 1;
  for (var j = 0; j < 4; j++) {
    if (j != p.axis) {
      src[k] = at[j];
      k++;
    }
  }
  return Src(at[p.axis], src);
}
