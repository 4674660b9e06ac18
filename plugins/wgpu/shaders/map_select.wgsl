// SELECT and SELECT_V2: input 1 where the condition (input 0) holds, else input 2; each input is
// broadcast to the output by taking coordinates modulo its sizes.
fn broadcast_at(at: vec4<i32>, d: vec4<i32>, channels: i32) -> vec4<i32> {
  return at % vec4<i32>(d.w, d.y, d.x, channels);
}

fn source(at: vec4<i32>) -> Src {
  let c = broadcast_at(at, p.in0_d, p.in0_c);
  if (in0_lane(lidx(p.in0_d, c.x, c.y, c.z, c.w)) != 0.0) {
    return Src(1, broadcast_at(at, p.in1_d, p.in1_c));
  }
  return Src(2, broadcast_at(at, p.in2_d, p.in2_c));
}
