// RESIZE_BILINEAR as TFLite computes it: source coordinate (y + 0.5) * scale - 0.5 with
// half-pixel centers, else y * scale; the two neighbours are clamped to the input.
fn source_coord(out: i32, scale: f32, size: i32) -> vec3<f32> {
  let at = select(f32(out) * scale, (f32(out) + 0.5) * scale - 0.5, p.half_pixel == 1);
  let low = max(floor(at), 0.0);
  let high = min(ceil(at), f32(size - 1));
  return vec3<f32>(low, high, at - low);
}

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
  let i = flat_id(gid, groups);
  if (i >= p.count) { return; }
  let o = position(i, p.dst_d);
  let d = p.src_d;
  let fy = source_coord(o.y, p.scale.y, d.y);
  let fx = source_coord(o.x, p.scale.x, d.x);
  let y0 = i32(fy.x);
  let y1 = i32(fy.y);
  let x0 = i32(fx.x);
  let x1 = i32(fx.y);
  let top = mix(src_at(vidx(d, o.n, y0, x0, o.s)), src_at(vidx(d, o.n, y0, x1, o.s)), fx.z);
  let bottom = mix(src_at(vidx(d, o.n, y1, x0, o.s)), src_at(vidx(d, o.n, y1, x1, o.s)), fx.z);
  emit(mix(top, bottom, fy.z), o);
}
