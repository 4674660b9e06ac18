/* The enqueue of a whole OpenCL partition in one call (enqueue.py prepares its arguments once).

   No OpenCL headers are needed: the few types below are the ABI of clEnqueueNDRangeKernel, which
   the caller resolves in the ICD loader pyopencl itself loaded and hands in as a pointer, so the
   queue and kernels (pyopencl's own objects, by their int_ptr) go through the same dispatch. */

#include <stddef.h>
#include <stdint.h>

typedef int32_t cl_int;
typedef uint32_t cl_uint;
typedef void *cl_command_queue;
typedef void *cl_kernel;
typedef void *cl_event;

typedef cl_int (*enqueue_nd_range_kernel)(cl_command_queue queue, cl_kernel kernel, cl_uint work_dim,
                                          const size_t *global_offset, const size_t *global_size,
                                          const size_t *local_size, cl_uint events_in_wait_list,
                                          const cl_event *event_wait_list, cl_event *event);

/* Enqueues count kernels in order, with no events: kernel i with dims[i] dimensions of global[3i..]
   and local[3i..] (no local size, the driver's choice, where has_local[i] is 0).  Returns CL_SUCCESS,
   or the first error code with the failing launch's index in *failed (nothing after it is enqueued). */
cl_int enqueue_launches(enqueue_nd_range_kernel enqueue, cl_command_queue queue, const cl_kernel *kernels,
                        const cl_uint *dims, const size_t *global, const size_t *local,
                        const uint8_t *has_local, int64_t count, int64_t *failed) {
    for (int64_t i = 0; i < count; ++i) {
        cl_int status = enqueue(queue, kernels[i], dims[i], NULL, global + 3 * i,
                                has_local[i] ? local + 3 * i : NULL, 0, NULL, NULL);
        if (status != 0) {
            *failed = i;
            return status;
        }
    }
    return 0;
}
