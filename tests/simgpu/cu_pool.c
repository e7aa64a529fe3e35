/* Driver API: stream-ordered allocation pools (filled in below). */
#include "sim.h"

void sim_pools_release_ctx(struct sim_ctx *ctx) { (void)ctx; }
void sim_pools_sync_trim(int dev) { (void)dev; }
CUresult sim_pool_free(struct sim_alloc *a, struct sim_stream *s) { (void)a; (void)s; return CUDA_ERROR_INVALID_VALUE; }
