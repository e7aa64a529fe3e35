/*
 * A library that reaches the driver past libvgpu: loaded with RTLD_DEEPBIND, its
 * references bind to its own dependency (libcuda) before the preloaded hooks. It
 * stands in for memory the driver takes on its own (a context growing as modules
 * load, graph memory), which libvgpu must still count.
 */
#include "cuda_api.h"

__attribute__((visibility("default"))) int helper_alloc(size_t bytes, CUdeviceptr *out)
{
    return (int)cuMemAlloc_v2(out, bytes);
}
