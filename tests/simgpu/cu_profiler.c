/* Driver API: profiler control. No profiler is ever attached to the simulator, so
 * starting and stopping collection has nothing to do, as on a real driver run
 * without one. */
#include "sim.h"

CUresult cuProfilerStart(void)
{
    struct sim_ctx *ctx;
    return sim_ctx_current_checked(&ctx);
}

CUresult cuProfilerStop(void)
{
    struct sim_ctx *ctx;
    return sim_ctx_current_checked(&ctx);
}
