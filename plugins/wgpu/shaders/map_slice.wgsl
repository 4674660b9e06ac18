// STRIDED_SLICE: output elements in NHWC order walk the slice (length per axis) from
// start in steps of step.
fn source(at: vec4<i32>) -> Src {
  let flat = flat_index(at);
  let l = p.length;
  let index = vec4<i32>(flat / (l.y * l.z * l.w), (flat / (l.z * l.w)) % l.y, (flat / l.w) % l.z, flat % l.w);
  return Src(0, p.start + index * p.step);
}
