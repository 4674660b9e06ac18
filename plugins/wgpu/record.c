/* A partition's dispatches recorded into a compute pass in one call (compiled.py prepares the arrays once).

   No WebGPU headers are needed: the handles are opaque pointers, and the three entry points are
   wgpu-native's own (the library wgpu-py loaded), handed in as pointers by the caller. */

#include <stddef.h>
#include <stdint.h>

typedef void (*set_pipeline_fn)(void *pass, void *pipeline);
typedef void (*set_bind_group_fn)(void *pass, uint32_t index, void *group, size_t dynamic_offset_count,
                                  const uint32_t *dynamic_offsets);
typedef void (*dispatch_fn)(void *pass, uint32_t x, uint32_t y, uint32_t z);

/* Dispatch i: pipelines[i] (set only where it changes), bind group groups[i] at index 0, workgroups
   counts[3i..3i+2]. */
void record_dispatches(set_pipeline_fn set_pipeline, set_bind_group_fn set_bind_group, dispatch_fn dispatch,
                       void *pass, void *const *pipelines, void *const *groups, const uint32_t *counts,
                       int64_t count) {
    void *current = NULL;
    for (int64_t i = 0; i < count; ++i) {
        if (pipelines[i] != current) {
            set_pipeline(pass, pipelines[i]);
            current = pipelines[i];
        }
        set_bind_group(pass, 0, groups[i], 0, NULL);
        dispatch(pass, counts[3 * i], counts[3 * i + 1], counts[3 * i + 2]);
    }
}
