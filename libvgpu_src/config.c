/* Where the limits come from, decided once when the library loads: in a
 * runtime-made container (HAMI_LIMITS_PATH exists, or this library is the one the
 * runtime mounted) the host's read-only file and fixed paths, and nothing from the
 * environment; otherwise (bare use) the
 * environment, where a bad value is reported in one line and ignored (as if
 * unset), so a typo never crashes a program. */
#include "internal.h"
#include "log.h"

#include <ctype.h>
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <sys/stat.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

struct hami_config hami_config = {.priority = 1, .priority_idle_ms = HAMI_PRIORITY_IDLE_MS_DEFAULT};

int hami_parse_size(const char *text, uint64_t *bytes)
{
    if (!text || !isdigit((unsigned char)text[0]))
        return -1;
    uint64_t value = 0;
    const char *p = text;
    for (; isdigit((unsigned char)*p); p++) {
        uint64_t digit = (uint64_t)(*p - '0');
        if (value > (UINT64_MAX - digit) / 10)
            return -1;
        value = value * 10 + digit;
    }
    unsigned shift = 0;
    switch (tolower((unsigned char)*p)) {
    case '\0': break;
    case 'k': shift = 10; p++; break;
    case 'm': shift = 20; p++; break;
    case 'g': shift = 30; p++; break;
    default: return -1;
    }
    if (*p)
        return -1;
    if (shift && value > (UINT64_MAX >> shift))
        return -1;
    *bytes = value << shift;
    return 0;
}

/* A whole number in [min, max], digits only; 0 on success, -1 on a bad value. */
static int parse_whole(const char *text, unsigned long min, unsigned long max, unsigned long *out)
{
    char *end = NULL;
    if (!text || !isdigit((unsigned char)text[0]))
        return -1;
    unsigned long value = strtoul(text, &end, 10);
    if (*end || value < min || value > max)
        return -1;
    *out = value;
    return 0;
}

static void load_mem_limit(const char *name, uint64_t *out)
{
    const char *text = getenv(name);
    if (!text || !*text)
        return;
    uint64_t bytes;
    if (hami_parse_size(text, &bytes) < 0) {
        hami_error("%s=%s is not a size (bytes or k/m/g suffix); ignored, no memory limit from it",
                   name, text);
        return;
    }
    *out = bytes;
}

static void load_sm_limit(const char *name, uint32_t *out)
{
    const char *text = getenv(name);
    if (!text || !*text)
        return;
    unsigned long percent;
    if (parse_whole(text, 0, 100, &percent) < 0) {
        hami_error("%s=%s is not a percentage 0..100; ignored, no SM limit from it", name, text);
        return;
    }
    *out = (uint32_t)percent;
}

static const char *env_path(const char *name)
{
    const char *text = getenv(name);
    if (!text || !*text)
        return NULL;
    if (text[0] != '/') {
        hami_error("%s=%s is not an absolute path; ignored", name, text);
        return NULL;
    }
    return strdup(text);
}

/* The boards and the own stamps (activity.h); the idle time in ms. */
static void load_boards(struct hami_config *cfg)
{
    cfg->activity_board = env_path("CUDA_ACTIVITY_BOARD");
    cfg->priority_board = env_path("CUDA_PRIORITY_BOARD");
    cfg->activity_stamp_dir = env_path("CUDA_ACTIVITY_STAMP_DIR");
    const char *idle = getenv("CUDA_PRIORITY_IDLE_MS");
    unsigned long ms;
    if (idle && *idle) {
        if (parse_whole(idle, 1, HAMI_PRIORITY_IDLE_MS_MAX, &ms) < 0)
            hami_error("CUDA_PRIORITY_IDLE_MS=%s is not a whole number of ms from 1 to %d; using %d", idle,
                       HAMI_PRIORITY_IDLE_MS_MAX, HAMI_PRIORITY_IDLE_MS_DEFAULT);
        else
            cfg->priority_idle_ms = (uint32_t)ms;
    }
}

/* Where the runtime mounts this library; also where HAMi-core users expect it. */
static const char *const runtime_copies[] = {HAMI_RUNTIME_LIBVGPU, "/usr/local/vgpu/libvgpu.so"};

/* Whether this library was loaded from where the runtime mounts it (by that name, or
 * as the same file under another): the tenant cannot remove or rename that, so a
 * limits file hidden from its fixed path makes the process fail closed, never bare. */
static int loaded_by_the_runtime(void)
{
    Dl_info self;
    struct stat mine, st;
    if (!dladdr((void *)loaded_by_the_runtime, &self) || !self.dli_fname)
        return 0;
    int known = stat(self.dli_fname, &mine) == 0;
    for (size_t i = 0; i < sizeof runtime_copies / sizeof *runtime_copies; i++)
        if (strcmp(self.dli_fname, runtime_copies[i]) == 0 ||
            (known && stat(runtime_copies[i], &st) == 0 && st.st_dev == mine.st_dev && st.st_ino == mine.st_ino))
            return 1;
    return 0;
}

/* The container's own files, at the paths the runtime mounts them: whatever the
 * environment says, which a tenant sets as it likes. */
static int load_runtime_made(struct hami_config *cfg)
{
    struct stat st;
    if (lstat(HAMI_LIMITS_PATH, &st) < 0 && errno == ENOENT && !loaded_by_the_runtime())
        return 0;
    cfg->runtime_made = 1;
    cfg->region_path = HAMI_RUNTIME_REGION_PATH;
    cfg->activity_board = HAMI_RUNTIME_ACTIVITY_BOARD;
    cfg->priority_board = HAMI_RUNTIME_PRIORITY_BOARD;
    cfg->activity_stamp_dir = HAMI_RUNTIME_STAMP_DIR;
    return 1;
}

void hami_config_load(void)
{
    struct hami_config *cfg = &hami_config;
    if (load_runtime_made(cfg))
        return;
    uint64_t all_mem = 0;
    uint32_t all_sm = 0;
    load_mem_limit("CUDA_DEVICE_MEMORY_LIMIT", &all_mem);
    load_sm_limit("CUDA_DEVICE_SM_LIMIT", &all_sm);
    for (int i = 0; i < HAMI_MAX_DEVICES; i++) {
        char name[64];
        cfg->mem_limit[i] = all_mem;
        snprintf(name, sizeof name, "CUDA_DEVICE_MEMORY_LIMIT_%d", i);
        load_mem_limit(name, &cfg->mem_limit[i]);
        cfg->sm_limit[i] = all_sm;
        snprintf(name, sizeof name, "CUDA_DEVICE_SM_LIMIT_%d", i);
        load_sm_limit(name, &cfg->sm_limit[i]);
    }

    const char *policy = getenv("GPU_CORE_UTILIZATION_POLICY");
    if (policy && *policy) {
        if (!strcasecmp(policy, "default"))
            cfg->core_policy = HAMI_POLICY_DEFAULT;
        else if (!strcasecmp(policy, "force"))
            cfg->core_policy = HAMI_POLICY_FORCE;
        else if (!strcasecmp(policy, "disable"))
            cfg->core_policy = HAMI_POLICY_DISABLE;
        else
            hami_error("GPU_CORE_UTILIZATION_POLICY=%s is not default, force or disable; "
                       "using default", policy);
    }

    const char *priority = getenv("CUDA_TASK_PRIORITY");
    if (priority && *priority) {
        if (!strcmp(priority, "0") || !strcmp(priority, "1"))
            cfg->priority = priority[0] - '0';
        else
            hami_error("CUDA_TASK_PRIORITY=%s is not 0 or 1; using 1 (low)", priority);
    }

    const char *spill = getenv("CUDA_OVERSUBSCRIBE");
    if (spill && *spill) {
        if (!strcmp(spill, "true") || !strcmp(spill, "false"))
            cfg->spill = spill[0] == 't';
        else
            hami_error("CUDA_OVERSUBSCRIBE=%s is not true or false; using false", spill);
    }

    const char *path = getenv("CUDA_DEVICE_MEMORY_SHARED_CACHE");
    cfg->region_path = (path && *path) ? strdup(path) : NULL;
    load_boards(cfg);
}

static pthread_once_t init_once = PTHREAD_ONCE_INIT;

static void init_once_body(void)
{
    hami_log_init();
    hami_config_load();
}

void hami_init(void)
{
    pthread_once(&init_once, init_once_body);
}

/* Env only: no driver, no region, no file is touched until a CUDA or NVML call. */
__attribute__((constructor)) static void hami_constructor(void)
{
    hami_init();
}
