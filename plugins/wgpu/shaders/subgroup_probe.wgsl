// Whether subgroups are runs of consecutive invocations aligned to their size, as the subgroup
// reductions assume: each invocation writes 1 when the first invocation of its subgroup is where
// that layout puts it.
@group(0) @binding(0) var<storage, read_write> consecutive: array<u32>;

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) li: u32) {
  let size = subgroupAdd(1u);
  consecutive[li] = u32(subgroupBroadcastFirst(li) == li - li % size && 256u % size == 0u);
}
