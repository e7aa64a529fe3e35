/*
 * cuGetExportTable: the driver's private tables that the CUDA runtime
 * (libcudart) asks for by UUID. Each table is an array of pointers; where the
 * runtime expects it, slot 0 holds the table's size in bytes. Slots the
 * simulator has no meaning for hold a function that answers
 * CUDA_ERROR_NOT_SUPPORTED (and says which slot on stderr when HAMI_SIM_TRACE
 * is set), so that nothing calls through a null pointer.
 *
 * The tables (UUIDs are the 16 bytes in memory order):
 *
 * runtime interface 6bd5fb6c-5bf4-e74a-8987-d93912fd9df9, 13 slots
 *   1  (CUmodule *, const fat binary wrapper *): load the wrapper's image
 *   2  (CUcontext *, CUdevice): the device's primary context, not retained
 *      (the runtime retains it itself)
 *   6  (CUmodule *, const wrapper *, void *, void *, unsigned): as 1; the
 *      extra arguments (link inputs) must be empty
 *   7  (size_t): a notification that returns nothing
 *   8  (const fat binary header *, CUmodule *, void *, void *, unsigned):
 *      as 6, from the bare header
 *   12 (): make the JIT compilers ready: nothing to load here
 * tools thread-local state 42d85a81-23f6-cb47-8298-f6e78a3aecdc, 4 slots
 *   2 (CUcontext *): the calling thread's current context, as cuCtxGetCurrent
 *      answers it (the two agree on the real driver, context by context);
 *      cuBLASLt 13 asks it at every API call and has no algorithm without it
 * tools callback buffers a094798c-2e74-2e74-93f2-0800200c0a66, 7 slots
 *   2, 6 (void **buffer, size_t *count): zeroed buffers of 1024 and 14
 *      32-bit words that a profiler would fill; nothing fills them here
 * context-local storage c693336e-1121-df11-a8c3-68f355d89593, 4 slots (no size)
 *   0 put (CUcontext or NULL = current, key, value, destructor)
 *   1 delete (CUcontext, key)
 *   2 get (void **value, CUcontext, key): CUDA_ERROR_INVALID_HANDLE if absent
 *   Values live with the context; when it goes (destroy, last primary
 *   release, reset) each destructor is called with (ctx, key, value).
 * context identity 21318c60-9714-3248-8ca6-41ff7324c8f2, 5 slots
 *   4 (CUcontext, unsigned long long *id): the context's id, as cuCtxGetId
 *      answers it (the two agree on the real driver); cuBLASLt 13 asks it
 * driver check d4082055-bde6-704b-8d34-ba123c66e1f2: cu_export_check.c
 * context checks 263e8860-7cd2-6143-92f6-bbd5006dfa7e, 4 slots
 *   2 (CUcontext, unsigned *flags, void **): flags 0 (no special state)
 *   3 (): 0
 * SM layout 1734dc26-800d-4745-8726-c0f1e7dd8bca, 14 slots (NVRTC wants more than 13)
 *   4 (unsigned char **gpcs, size_t *count): the current context's device's TPCs (SM pairs), one
 *     byte each, the GPC it is in (sim_gpc_sms), in a buffer the driver allocates. cuBLASLt 13
 *     reads one byte per two SMs to place thread block clusters (its fp16/bf16 kernels on sm_90)
 *     and assumes the table exists: without it, it calls through a null pointer
 *   13 (void *buffer, size_t): frees a buffer the table gave
 */
#include "sim.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- slots with no meaning here ---- */

static int trace_on(void)
{
    static int on = -1;
    if (on < 0)
        on = getenv("HAMI_SIM_TRACE") != NULL;
    return on;
}

#define SIM_UNSUPPORTED_SLOT(table, slot) \
    static CUresult unsupported_##table##_##slot(void) \
    { \
        if (trace_on()) \
            fprintf(stderr, "hami-sim: export table %s slot %d is not provided\n", #table, slot); \
        return CUDA_ERROR_NOT_SUPPORTED; \
    }

/* ---- runtime interface ---- */

static CUresult rt_module_from_wrapper(CUmodule *module, const void *wrapper)
{
    if (!module || !wrapper)
        return CUDA_ERROR_INVALID_VALUE;
    return cuModuleLoadData(module, wrapper);
}

static CUresult rt_primary_context(CUcontext *pctx, CUdevice dev)
{
    SIM_REQUIRE_INIT();
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    struct sim_ctx *c = sim_ctx_primary(dev);
    if (!c)
        return CUDA_ERROR_INVALID_DEVICE;
    *pctx = (CUcontext)c;
    return CUDA_SUCCESS;
}

static CUresult rt_module_from_wrapper_ex(CUmodule *module, const void *wrapper, void *links, void *link_values,
                                          unsigned link_count)
{
    if (links || link_values || link_count)
        return CUDA_ERROR_NOT_SUPPORTED;  /* device-side linking of separately compiled code */
    return rt_module_from_wrapper(module, wrapper);
}

static void rt_notify(size_t arg) { (void)arg; }

static CUresult rt_module_from_header_ex(const void *header, CUmodule *module, void *links, void *link_values,
                                         unsigned link_count)
{
    return rt_module_from_wrapper_ex(module, header, links, link_values, link_count);
}

static CUresult rt_load_compilers(void) { return CUDA_SUCCESS; }

SIM_UNSUPPORTED_SLOT(runtime, 3)
SIM_UNSUPPORTED_SLOT(runtime, 4)
SIM_UNSUPPORTED_SLOT(runtime, 5)
SIM_UNSUPPORTED_SLOT(runtime, 9)
SIM_UNSUPPORTED_SLOT(runtime, 10)
SIM_UNSUPPORTED_SLOT(runtime, 11)

static const void *runtime_table[13] = {
    (void *)(13 * sizeof(void *)),
    (void *)rt_module_from_wrapper,
    (void *)rt_primary_context,
    (void *)unsupported_runtime_3,
    (void *)unsupported_runtime_4,
    (void *)unsupported_runtime_5,
    (void *)rt_module_from_wrapper_ex,
    (void *)rt_notify,
    (void *)rt_module_from_header_ex,
    (void *)unsupported_runtime_9,
    (void *)unsupported_runtime_10,
    (void *)unsupported_runtime_11,
    (void *)rt_load_compilers,
};

/* ---- tools ---- */

static CUresult tools_current_context(CUcontext *pctx) { return cuCtxGetCurrent(pctx); }

SIM_UNSUPPORTED_SLOT(tools_tls, 1)
SIM_UNSUPPORTED_SLOT(tools_tls, 3)

static const void *tools_tls_table[4] = {
    (void *)(4 * sizeof(void *)), (void *)unsupported_tools_tls_1, (void *)tools_current_context,
    (void *)unsupported_tools_tls_3,
};

static uint32_t callback_buffer_1[1024], callback_buffer_2[14];

static void tools_buffer_1(void **buffer, size_t *count)
{
    *buffer = callback_buffer_1;
    *count = sizeof callback_buffer_1 / sizeof *callback_buffer_1;
}

static void tools_buffer_2(void **buffer, size_t *count)
{
    *buffer = callback_buffer_2;
    *count = sizeof callback_buffer_2 / sizeof *callback_buffer_2;
}

SIM_UNSUPPORTED_SLOT(tools_callbacks, 1)
SIM_UNSUPPORTED_SLOT(tools_callbacks, 3)
SIM_UNSUPPORTED_SLOT(tools_callbacks, 4)
SIM_UNSUPPORTED_SLOT(tools_callbacks, 5)

static const void *tools_callbacks_table[7] = {
    (void *)(7 * sizeof(void *)), (void *)unsupported_tools_callbacks_1, (void *)tools_buffer_1,
    (void *)unsupported_tools_callbacks_3, (void *)unsupported_tools_callbacks_4,
    (void *)unsupported_tools_callbacks_5, (void *)tools_buffer_2,
};

/* ---- context-local storage ---- */

typedef void (*cls_destructor)(CUcontext, void *key, void *value);
struct sim_cls { void *key, *value; cls_destructor dtor; struct sim_cls *next; };
static pthread_mutex_t cls_lock = PTHREAD_MUTEX_INITIALIZER;

static CUresult cls_context(CUcontext ctx, struct sim_ctx **out)
{
    SIM_REQUIRE_INIT();
    *out = ctx ? sim_ctx_check(ctx) : sim_ctx_current();
    return *out ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
}

static CUresult cls_put(CUcontext ctx, void *key, void *value, cls_destructor dtor)
{
    struct sim_ctx *c;
    CUresult rc = cls_context(ctx, &c);
    if (rc != CUDA_SUCCESS)
        return rc;
    pthread_mutex_lock(&cls_lock);
    struct sim_cls *e = c->cls;
    while (e && e->key != key)
        e = e->next;
    if (!e && (e = calloc(1, sizeof *e))) {
        e->key = key;
        e->next = c->cls;
        c->cls = e;
    }
    if (e) {
        e->value = value;
        e->dtor = dtor;
    }
    pthread_mutex_unlock(&cls_lock);
    return e ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

static CUresult cls_delete(CUcontext ctx, void *key)
{
    struct sim_ctx *c;
    CUresult rc = cls_context(ctx, &c);
    if (rc != CUDA_SUCCESS)
        return rc;
    pthread_mutex_lock(&cls_lock);
    struct sim_cls **p = &c->cls;
    while (*p && (*p)->key != key)
        p = &(*p)->next;
    struct sim_cls *e = *p;
    if (e)
        *p = e->next;
    pthread_mutex_unlock(&cls_lock);
    free(e);
    return e ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

static CUresult cls_get(void **value, CUcontext ctx, void *key)
{
    struct sim_ctx *c;
    CUresult rc = cls_context(ctx, &c);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!value)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&cls_lock);
    struct sim_cls *e = c->cls;
    while (e && e->key != key)
        e = e->next;
    if (e)
        *value = e->value;
    pthread_mutex_unlock(&cls_lock);
    return e ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

void sim_ctx_cls_destroy(struct sim_ctx *c)
{
    pthread_mutex_lock(&cls_lock);
    struct sim_cls *e = c->cls;
    c->cls = NULL;
    pthread_mutex_unlock(&cls_lock);
    while (e) {
        struct sim_cls *next = e->next;
        if (e->dtor)
            e->dtor((CUcontext)c, e->key, e->value);
        free(e);
        e = next;
    }
}

SIM_UNSUPPORTED_SLOT(cls, 3)

static const void *cls_table[4] = {
    (void *)cls_put, (void *)cls_delete, (void *)cls_get, (void *)unsupported_cls_3,
};

/* ---- context checks ---- */

static CUresult check_context(CUcontext ctx, unsigned *flags, void **extra)
{
    (void)ctx;
    (void)extra;
    if (flags)
        *flags = 0;
    return CUDA_SUCCESS;
}

static unsigned check_nothing_pending(void) { return 0; }

SIM_UNSUPPORTED_SLOT(checks, 1)

static const void *checks_table[4] = {
    (void *)(4 * sizeof(void *)), (void *)unsupported_checks_1, (void *)check_context,
    (void *)check_nothing_pending,
};

/* ---- context identity ---- */

static CUresult context_id(CUcontext ctx, unsigned long long *id) { return cuCtxGetId(ctx, id); }

SIM_UNSUPPORTED_SLOT(identity, 1)
SIM_UNSUPPORTED_SLOT(identity, 2)
SIM_UNSUPPORTED_SLOT(identity, 3)

static const void *identity_table[5] = {
    (void *)(5 * sizeof(void *)), (void *)unsupported_identity_1, (void *)unsupported_identity_2,
    (void *)unsupported_identity_3, (void *)context_id,
};

/* ---- SM layout ---- */

static CUresult layout_gpc_of_tpc(unsigned char **gpcs, size_t *count)
{
    struct sim_ctx *c;
    CUresult rc = sim_ctx_current_checked(&c);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!gpcs || !count)
        return CUDA_ERROR_INVALID_VALUE;
    size_t tpcs = (size_t)sim_config()->sms / 2, n = 0;
    unsigned char *map = malloc(tpcs ? tpcs : 1);
    if (!map)
        return CUDA_ERROR_OUT_OF_MEMORY;
    for (int g = 0; g < SIM_GPCS; g++)
        for (int t = 0; t < sim_gpc_sms(g) / 2 && n < tpcs; t++)
            map[n++] = (unsigned char)g;
    *gpcs = map;
    *count = n;
    return CUDA_SUCCESS;
}

static void layout_free(void *buffer, size_t size)
{
    (void)size;
    free(buffer);
}

SIM_UNSUPPORTED_SLOT(layout, 1)
SIM_UNSUPPORTED_SLOT(layout, 2)
SIM_UNSUPPORTED_SLOT(layout, 3)
SIM_UNSUPPORTED_SLOT(layout, 5)
SIM_UNSUPPORTED_SLOT(layout, 6)
SIM_UNSUPPORTED_SLOT(layout, 7)
SIM_UNSUPPORTED_SLOT(layout, 8)
SIM_UNSUPPORTED_SLOT(layout, 9)
SIM_UNSUPPORTED_SLOT(layout, 10)
SIM_UNSUPPORTED_SLOT(layout, 11)
SIM_UNSUPPORTED_SLOT(layout, 12)

static const void *layout_table[14] = {
    (void *)(14 * sizeof(void *)), (void *)unsupported_layout_1, (void *)unsupported_layout_2,
    (void *)unsupported_layout_3, (void *)layout_gpc_of_tpc, (void *)unsupported_layout_5,
    (void *)unsupported_layout_6, (void *)unsupported_layout_7, (void *)unsupported_layout_8,
    (void *)unsupported_layout_9, (void *)unsupported_layout_10, (void *)unsupported_layout_11,
    (void *)unsupported_layout_12, (void *)layout_free,
};

/* ---- lookup ---- */

const void *const *sim_export_runtime_table(void) { return runtime_table; }

struct export_table { unsigned char id[16]; const void *const *table; };

static const struct export_table tables[] = {
    {{0x6b, 0xd5, 0xfb, 0x6c, 0x5b, 0xf4, 0xe7, 0x4a, 0x89, 0x87, 0xd9, 0x39, 0x12, 0xfd, 0x9d, 0xf9},
     runtime_table},
    {{0x42, 0xd8, 0x5a, 0x81, 0x23, 0xf6, 0xcb, 0x47, 0x82, 0x98, 0xf6, 0xe7, 0x8a, 0x3a, 0xec, 0xdc},
     tools_tls_table},
    {{0xa0, 0x94, 0x79, 0x8c, 0x2e, 0x74, 0x2e, 0x74, 0x93, 0xf2, 0x08, 0x00, 0x20, 0x0c, 0x0a, 0x66},
     tools_callbacks_table},
    {{0xc6, 0x93, 0x33, 0x6e, 0x11, 0x21, 0xdf, 0x11, 0xa8, 0xc3, 0x68, 0xf3, 0x55, 0xd8, 0x95, 0x93},
     cls_table},
    {{0x26, 0x3e, 0x88, 0x60, 0x7c, 0xd2, 0x61, 0x43, 0x92, 0xf6, 0xbb, 0xd5, 0x00, 0x6d, 0xfa, 0x7e},
     checks_table},
    {{0x21, 0x31, 0x8c, 0x60, 0x97, 0x14, 0x32, 0x48, 0x8c, 0xa6, 0x41, 0xff, 0x73, 0x24, 0xc8, 0xf2},
     identity_table},
    {{0x17, 0x34, 0xdc, 0x26, 0x80, 0x0d, 0x47, 0x45, 0x87, 0x26, 0xc0, 0xf1, 0xe7, 0xdd, 0x8b, 0xca},
     layout_table},
    {{0xd4, 0x08, 0x20, 0x55, 0xbd, 0xe6, 0x70, 0x4b, 0x8d, 0x34, 0xba, 0x12, 0x3c, 0x66, 0xe1, 0xf2}, NULL},
};

CUresult cuGetExportTable(const void **ppExportTable, const CUuuid *pExportTableId)
{
    if (!ppExportTable || !pExportTableId)
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < sizeof tables / sizeof *tables; i++)
        if (!memcmp(tables[i].id, pExportTableId->bytes, 16)) {
            *ppExportTable = tables[i].table ? tables[i].table : sim_export_check_table();
            return CUDA_SUCCESS;
        }
    if (trace_on()) {
        const unsigned char *b = (const unsigned char *)pExportTableId->bytes;
        fprintf(stderr, "hami-sim: no export table %02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-"
                "%02x%02x%02x%02x%02x%02x\n", b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9],
                b[10], b[11], b[12], b[13], b[14], b[15]);
    }
    *ppExportTable = NULL;
    return CUDA_ERROR_INVALID_VALUE;
}
