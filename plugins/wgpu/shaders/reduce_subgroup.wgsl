// Sum or maximum over a workgroup with subgroup operations: each subgroup combines its values in
// registers, then every invocation combines the subgroups' results.  Subgroups are taken to be
// consecutive invocations (the backend checked that on this adapter before choosing this variant).
var<workgroup> scratch: array<V, WG>;

fn combine(a: V, b: V, is_max: bool) -> V {
  return select(a + b, max(a, b), is_max);
}

fn workgroup_reduce(v: V, li: u32, is_max: bool) -> V {
  let size = subgroupAdd(1u);
  var part: V;
  if (is_max) {
    part = subgroupMax(v);
  } else {
    part = subgroupAdd(v);
  }
  if (li % size == 0u) {
    scratch[li / size] = part;
  }
  workgroupBarrier();
  var result = scratch[0];
  for (var i = 1u; i < WG / size; i++) {
    result = combine(result, scratch[i], is_max);
  }
  workgroupBarrier();  // before the next call writes scratch again
  return result;
}
