// TRANSPOSE: input axis j (n, y, x, c of its NHWC view) is output axis axes[j].
fn source(at: vec4<i32>) -> Src {
  return Src(0, vec4<i32>(at[p.axes.x], at[p.axes.y], at[p.axes.z], at[p.axes.w]));
}
