/* What the parts of libvgpu offer each other. */
#ifndef HAMI_INTERNAL_H
#define HAMI_INTERNAL_H

#include "cuda_api.h"
#include "region.h"

#define HAMI_EXPORT __attribute__((visibility("default")))

/* symbols.c: the real driver's entry point for `name` (never one of our hooks), or NULL. */
void *hami_driver_symbol(const char *name);

/* region.c: the mapped region (NULL when none could be had: then nothing is limited),
 * this process's slot in it, and the region's device index for a driver device
 * (matched by UUID, so CUDA_VISIBLE_DEVICES reordering cannot mix devices up; -1 if none). */
struct hami_region *hami_region_get(void);
struct hami_proc_slot *hami_region_self(void);
int hami_region_device_index(CUdevice dev);

#endif
