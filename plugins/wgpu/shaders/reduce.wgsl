// SUM, MEAN, REDUCE_PROD, REDUCE_MAX, REDUCE_MIN, REDUCE_ANY and REDUCE_ALL: each output lane combines
// its region in f32 (INIT, COMBINE, FINISH from delegate.gpu.dialect).  keep = the output shape with the
// reduced axes kept as 1 (n, h, w, c order), reduce = 1 for each reduced axis; lanes are matched
// to keep through their position in NHWC order, which dropping axes does not change.
fn lane_value(element: i32) -> f32 {
  let k = p.keep;
  let at = vec4<i32>(element / (k.y * k.z * k.w), (element / (k.z * k.w)) % k.y, (element / k.w) % k.z,
                     element % k.w);
  let d = p.src_d;
  let first = select(at, vec4<i32>(0), p.reduce == vec4<i32>(1));
  let last = select(at + 1, vec4<i32>(d.w, d.y, d.x, p.src_c), p.reduce == vec4<i32>(1));
  var total: f32 = $INIT;
  for (var n = first.x; n < last.x; n++) {
    for (var y = first.y; y < last.y; y++) {
      for (var x = first.z; x < last.z; x++) {
        for (var c = first.w; c < last.w; c++) {
          let value = src_lane(lidx(d, n, y, x, c));
          total = $COMBINE;
        }
      }
    }
  }
  let count = f32((last.x - first.x) * (last.y - first.y) * (last.z - first.z) * (last.w - first.w));
  return $FINISH;
}
