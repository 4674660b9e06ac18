/* The enqueue of a whole OpenCL partition in one call (enqueue.py prepares its arguments once), and
   the bounded wait for a run's last event (values.wait_within).

   No OpenCL headers are needed: the few types below are the ABI of clEnqueueNDRangeKernel, which
   the caller resolves in the ICD loader pyopencl itself loaded and hands in as a pointer, so the
   queue and kernels (pyopencl's own objects, by their int_ptr) go through the same dispatch. */

#include <stddef.h>
#include <stdint.h>
#include <time.h>

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

typedef cl_int (*flush_queue)(cl_command_queue queue);
typedef cl_int (*get_event_info)(cl_event event, cl_uint name, size_t size, void *value, size_t *size_ret);

#define CL_EVENT_COMMAND_EXECUTION_STATUS 0x11D3

static inline void spin_hint(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#else
    __asm__ __volatile__("" ::: "memory");
#endif
}

static int64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

/* Flushes queue, then asks event's execution status until it is complete, failed or limit_ns passed:
   for the first spin_ns with pause_iters spin-loop hints between asks (asking without a break can slow
   the driver's own progress), then sleeping a twentieth of the time waited so far (at most max_sleep_ns)
   between asks.  Returns 0 when complete, 1 when the limit passed first, 2 when the work
   failed (its status in *detail), 3 when clFlush or clGetEventInfo failed (its code in *detail). */
int32_t wait_event(flush_queue flush, get_event_info info, cl_command_queue queue, cl_event event,
                   int64_t spin_ns, int64_t pause_iters, int64_t limit_ns, int64_t max_sleep_ns, int32_t *detail) {
    cl_int code = flush(queue);
    if (code != 0) {
        *detail = code;
        return 3;
    }
    int64_t start = now_ns();
    for (;;) {
        cl_int status = 1;
        code = info(event, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof status, &status, NULL);
        if (code != 0) {
            *detail = code;
            return 3;
        }
        if (status == 0)
            return 0;
        if (status < 0) {
            *detail = status;
            return 2;
        }
        int64_t waited = now_ns() - start;
        if (waited > limit_ns)
            return 1;
        if (waited >= spin_ns) {
            int64_t pause = waited / 20 < max_sleep_ns ? waited / 20 : max_sleep_ns;
            struct timespec t = {(time_t)(pause / 1000000000), (long)(pause % 1000000000)};
            nanosleep(&t, NULL);
        } else {
            for (int64_t i = 0; i < pause_iters; ++i)
                spin_hint();
        }
    }
}

