// Sum or maximum over a workgroup (a power of two in size) through workgroup memory: a tree of
// WG / 2, WG / 4, ... combinations.  Every invocation gets the result.
var<workgroup> scratch: array<V, WG>;

fn combine(a: V, b: V, is_max: bool) -> V {
  return select(a + b, max(a, b), is_max);
}

fn workgroup_reduce(v: V, li: u32, is_max: bool) -> V {
  scratch[li] = v;
  for (var step = WG / 2u; step > 0u; step /= 2u) {
    workgroupBarrier();
    if (li < step) {
      scratch[li] = combine(scratch[li], scratch[li + step], is_max);
    }
  }
  workgroupBarrier();
  let result = scratch[0];
  workgroupBarrier();  // before the next call writes scratch again
  return result;
}
