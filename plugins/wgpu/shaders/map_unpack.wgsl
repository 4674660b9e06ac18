// UNPACK: output coordinate (NHWC view, one axis fewer) is the input's with axis `axis` set to
// `index`; the other axes keep their order.
fn source(at: vec4<i32>) -> Src {
  var src = vec4<i32>(0);
  var k = 1;
  for (var j = 0; j < 4; j++) {
    if (j == p.axis) {
      src[j] = p.index;
    } else {
      src[j] = at[k];
      k++;
    }
  }
  return Src(0, src);
}
