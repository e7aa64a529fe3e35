/*
 * Stand-ins for what libvgpu gives the SM limiter, so that sm_limiter.c can
 * be linked into sm_load and driven directly: the driver's symbols (dlsym on
 * the libcuda the program links), limits from CUDA_DEVICE_SM_LIMIT and
 * GPU_CORE_UTILIZATION_POLICY, a region file mapped from
 * CUDA_DEVICE_MEMORY_SHARED_CACHE, and a slot in it.
 */
#ifndef SM_HARNESS_H
#define SM_HARNESS_H

#include <dlfcn.h>
#include <fcntl.h>
#include <stdarg.h>
#include <sys/file.h>
#include <sys/mman.h>

#include "internal.h"
#include "log.h"
#include "sm_limiter.h"

int hami_log_level = HAMI_LOG_ERROR;

void hami_log_write(int level, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "[hami] %d ", level);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

void *hami_driver_symbol(const char *name)
{
    static void *nvml;
    if (strncmp(name, "nvml", 4))
        return dlsym(RTLD_DEFAULT, name);
    if (!nvml)
        nvml = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    return nvml ? dlsym(nvml, name) : NULL;
}

static struct hami_region *harness_region;
static struct hami_proc_slot *harness_slot;
static struct hami_limits harness_limits;

const struct hami_limits *hami_limits_get(void)
{
    struct hami_limits *l = &harness_limits;
    if (l->magic)
        return l;
    const char *sm = getenv("CUDA_DEVICE_SM_LIMIT"), *policy = getenv("GPU_CORE_UTILIZATION_POLICY");
    l->device_count = HAMI_MAX_DEVICES;
    for (int i = 0; i < HAMI_MAX_DEVICES; i++)
        l->devices[i].sm_limit = sm ? (uint32_t)atoi(sm) : 0;
    l->core_policy = !policy ? HAMI_POLICY_DEFAULT
                     : !strcmp(policy, "force") ? HAMI_POLICY_FORCE
                     : !strcmp(policy, "disable") ? HAMI_POLICY_DISABLE : HAMI_POLICY_DEFAULT;
    l->magic = HAMI_LIMITS_MAGIC;
    return l;
}

struct hami_region *hami_region_get(void)
{
    if (harness_region)
        return harness_region;
    const char *path = getenv("CUDA_DEVICE_MEMORY_SHARED_CACHE");
    if (!path)
        return NULL;
    int fd = open(path, O_RDWR | O_CREAT, 0600);
    if (fd < 0 || flock(fd, LOCK_EX) || ftruncate(fd, sizeof(struct hami_region)))
        die("region file", CUDA_ERROR_OPERATING_SYSTEM);
    struct hami_region *r = mmap(NULL, sizeof(*r), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (r == MAP_FAILED)
        die("region mmap", CUDA_ERROR_OPERATING_SYSTEM);
    if (r->magic != HAMI_REGION_MAGIC) {
        r->version = HAMI_REGION_VERSION;
        r->magic = HAMI_REGION_MAGIC;
        r->state = HAMI_REGION_READY;
    }
    flock(fd, LOCK_UN);
    close(fd);
    for (int i = 0; i < HAMI_MAX_PROCS && !harness_slot; i++) {
        uint64_t expect = 0;
        if (__atomic_compare_exchange_n(&r->procs[i].owner, &expect, (uint64_t)getpid(), 0,
                                        __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
            harness_slot = &r->procs[i];
            harness_slot->pid = getpid();
        }
    }
    harness_region = r;
    return r;
}

struct hami_proc_slot *hami_region_self(void) { return harness_slot; }
struct hami_proc_slot *hami_slot_begin(void) { return harness_slot; }
void hami_slot_end(void) {}

int hami_region_has_pid(unsigned int pid)
{
    for (int i = 0; harness_region && i < HAMI_MAX_PROCS; i++)
        if ((unsigned int)harness_region->procs[i].pid == pid && pid)
            return 1;
    return 0;
}

#define HARNESS_BEFORE(stream) hami_sm_before_launch(dev_index, (stream))
#define HARNESS_AFTER(stream, r) hami_sm_after_launch(dev_index, (stream), (r))

#endif
