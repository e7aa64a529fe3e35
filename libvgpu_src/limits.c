/* The container's limits (struct hami_limits, region.h): in a runtime-made
 * container the host's file, mapped read-only and checked to be the read-only
 * mount the runtime made; in bare use, filled from the environment. Also how the
 * runtime's files (the limits, the region) are mapped: as the runtime made them. */
#include "internal.h"
#include "log.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

void *hami_map_runtime_file(const char *path, size_t size, int writable, const char *what, char *why,
                            size_t len)
{
    int fd = open(path, (writable ? O_RDWR : O_RDONLY) | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        snprintf(why, len, "%s %s: %s", what, path, strerror(errno));
        return NULL;
    }
    void *p = NULL;
    struct stat st;
    struct statvfs vfs;
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || (size_t)st.st_size != size) {
        snprintf(why, len, "%s %s: not the runtime's (a regular file of %zu bytes)", what, path, size);
    } else if (!writable && (fstatvfs(fd, &vfs) < 0 || !(vfs.f_flag & ST_RDONLY))) {
        /* the runtime mounts it read-only: anything writable was made inside */
        snprintf(why, len, "%s %s: writable, not the runtime's read-only mount", what, path);
    } else if ((p = mmap(NULL, size, writable ? PROT_READ | PROT_WRITE : PROT_READ, MAP_SHARED, fd, 0)) ==
               MAP_FAILED) {
        p = NULL;
        snprintf(why, len, "%s %s: mmap: %s", what, path, strerror(errno));
    }
    close(fd);
    return p;
}

static struct hami_limits env_limits;

const struct hami_limits *hami_limits_from_env(void)
{
    struct hami_limits *l = &env_limits;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    l->magic = HAMI_LIMITS_MAGIC;
    l->version = HAMI_LIMITS_VERSION;
    l->device_count = HAMI_MAX_DEVICES;   /* bare: indices are CUDA ordinals */
    l->core_policy = hami_config.core_policy;
    l->priority = hami_config.priority;
    l->priority_idle_ms = hami_config.priority_idle_ms;
    l->created_ns = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
    for (int i = 0; i < HAMI_MAX_DEVICES; i++) {
        l->devices[i].mem_limit = hami_config.mem_limit[i];
        l->devices[i].sm_limit = hami_config.sm_limit[i];
        l->devices[i].flags = hami_config.spill ? HAMI_DEVICE_SPILL : 0;
    }
    return l;
}

/* What is wrong with a limits file's content (written to buf), or NULL: each
 * field in the range the runtime writes. */
static const char *limits_problem(const struct hami_limits *l, char *buf, size_t len)
{
    if (l->magic != HAMI_LIMITS_MAGIC || l->version != HAMI_LIMITS_VERSION)
        snprintf(buf, len, "magic %#llx version %u, expected %#llx version %u",
                 (unsigned long long)l->magic, l->version, (unsigned long long)HAMI_LIMITS_MAGIC,
                 HAMI_LIMITS_VERSION);
    else if (l->device_count < 1 || l->device_count > HAMI_MAX_DEVICES)
        snprintf(buf, len, "device_count %u", l->device_count);
    else if (l->core_policy > HAMI_POLICY_DISABLE)
        snprintf(buf, len, "core_policy %u", l->core_policy);
    else if (l->priority != 0 && l->priority != 1)
        snprintf(buf, len, "priority %d", l->priority);
    else if (l->priority_idle_ms < 1 || l->priority_idle_ms > HAMI_PRIORITY_IDLE_MS_MAX)
        snprintf(buf, len, "priority_idle_ms %u", l->priority_idle_ms);
    else
        buf[0] = '\0';
    for (uint32_t i = 0; !buf[0] && i < l->device_count; i++) {
        const struct hami_device_limit *d = &l->devices[i];
        if (!d->uuid[0] || memchr(d->uuid, '\0', HAMI_UUID_LEN) == NULL)
            snprintf(buf, len, "devices[%u].uuid is not a UUID", i);
        else if (d->sm_limit > 100 || (d->flags & ~(uint32_t)HAMI_DEVICE_SPILL))
            snprintf(buf, len, "devices[%u]: sm_limit %u, flags %#x", i, d->sm_limit, d->flags);
    }
    return buf[0] ? buf : NULL;
}

const struct hami_limits *hami_limits_map(const char *path, char *why, size_t len)
{
    struct hami_limits *l = hami_map_runtime_file(path, sizeof *l, 0, "limits", why, len);
    char problem[160];
    if (l && limits_problem(l, problem, sizeof problem)) {
        snprintf(why, len, "limits %s: %s", path, problem);
        munmap(l, sizeof *l);
        l = NULL;
    }
    return l;
}
