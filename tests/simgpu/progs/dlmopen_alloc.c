/*
 * A process that reaches the driver without passing libvgpu: a second copy of
 * libcuda.so.1 loaded with dlmopen into a new link-map namespace (where neither
 * /etc/ld.so.preload nor LD_PRELOAD is loaded), its entry points found by reading
 * that copy's dynamic symbol table by hand (so no dlsym interposer answers). It
 * stands in for a static binary or a program that drives the device with raw
 * ioctls: the driver counts what it takes, the container's region does not.
 *
 *   dlmopen_alloc [-d <device>] <MiB> ... [@<path>] ... [spin <seconds>]
 *
 * Makes a context on the device (0 unless -d says), then allocates each <MiB> and prints
 * "alloc <MiB> <result>"; `@<path>` waits until <path> exists (at most 60 s),
 * holding what it has; `@` alone waits forever. Prints "held" before each wait.
 * `spin <seconds>` launches the simulator's 10 ms test kernel back to back for
 * that long (the whole GPU, whatever share the container has) and prints
 * "spun <kernels>".
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef int (*init_fn)(unsigned);
typedef int (*device_get_fn)(int *, int);
typedef int (*ctx_create_fn)(void **, unsigned, int);
typedef int (*mem_alloc_fn)(unsigned long long *, size_t);
typedef int (*module_load_fn)(void **, const void *);
typedef int (*get_function_fn)(void **, void *, const char *);
typedef int (*launch_fn)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void *,
                         void **, void **);
typedef int (*sync_fn)(void);

static uint32_t gnu_hash(const char *name)
{
    uint32_t h = 5381;
    for (; *name; name++)
        h = h * 33 + (unsigned char)*name;
    return h;
}

/* A dynamic entry's address: glibc relocates them in place where the section is writable. */
static uintptr_t dyn_ptr(const struct link_map *lm, ElfW(Addr) value)
{
    return value < lm->l_addr ? lm->l_addr + value : value;
}

/* The address of `name` in the object `lm`, found in its GNU hash table by hand. */
static void *by_hand(const struct link_map *lm, const char *name)
{
    const ElfW(Sym) *symtab = NULL;
    const char *strtab = NULL;
    const uint32_t *table = NULL;
    for (const ElfW(Dyn) *d = lm->l_ld; d->d_tag != DT_NULL; d++) {
        if (d->d_tag == DT_SYMTAB)
            symtab = (const ElfW(Sym) *)dyn_ptr(lm, d->d_un.d_ptr);
        else if (d->d_tag == DT_STRTAB)
            strtab = (const char *)dyn_ptr(lm, d->d_un.d_ptr);
        else if (d->d_tag == DT_GNU_HASH)
            table = (const uint32_t *)dyn_ptr(lm, d->d_un.d_ptr);
    }
    if (!symtab || !strtab || !table)
        return NULL;
    uint32_t nbuckets = table[0], symoffset = table[1], bloom_size = table[2];
    const uint32_t *buckets = (const uint32_t *)((const ElfW(Addr) *)(table + 4) + bloom_size);
    const uint32_t *chain = buckets + nbuckets;
    uint32_t h = gnu_hash(name);
    uint32_t index = buckets[h % nbuckets];
    if (index < symoffset)
        return NULL;
    for (;; index++) {
        uint32_t link = chain[index - symoffset];
        if ((h | 1) == (link | 1) && strcmp(strtab + symtab[index].st_name, name) == 0 &&
            symtab[index].st_value)
            return (void *)(lm->l_addr + symtab[index].st_value);
        if (link & 1)
            return NULL;
    }
}

/* Kernels of 10 ms, back to back, for `seconds`; how many ran (-1: the kernel was not found). */
static long spin(const struct link_map *lm, double seconds)
{
    module_load_fn load = (module_load_fn)by_hand(lm, "cuModuleLoadData");
    get_function_fn get = (get_function_fn)by_hand(lm, "cuModuleGetFunction");
    launch_fn launch = (launch_fn)by_hand(lm, "cuLaunchKernel");
    sync_fn sync = (sync_fn)by_hand(lm, "cuCtxSynchronize");
    void *module = NULL, *kernel = NULL;
    if (!load || !get || !launch || !sync || load(&module, "test image") != 0 || get(&kernel, module, "spin") != 0)
        return -1;
    uint64_t us = 10000;
    void *params[] = {&us};
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    long count = 0;
    do {
        if (launch(kernel, 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL) != 0 || sync() != 0)
            return -1;
        count++;
        clock_gettime(CLOCK_MONOTONIC, &t);
    } while ((double)(t.tv_sec - t0.tv_sec) + (double)(t.tv_nsec - t0.tv_nsec) / 1e9 < seconds);
    return count;
}

static void wait_for(const char *path)
{
    struct timespec pause = {0, 20000000};
    printf("held\n");
    fflush(stdout);
    for (int tries = 0; !*path || (tries < 3000 && access(path, F_OK) != 0); tries++)
        nanosleep(&pause, NULL);
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);  /* each line as it is said, also into a file */
    void *copy = dlmopen(LM_ID_NEWLM, "libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    struct link_map *lm = NULL;
    if (!copy || dlinfo(copy, RTLD_DI_LINKMAP, &lm) != 0 || !lm) {
        printf("dlmopen failed: %s\n", dlerror());
        return 2;
    }
    init_fn init = (init_fn)by_hand(lm, "cuInit");
    device_get_fn device_get = (device_get_fn)by_hand(lm, "cuDeviceGet");
    ctx_create_fn ctx_create = (ctx_create_fn)by_hand(lm, "cuCtxCreate_v2");
    mem_alloc_fn mem_alloc = (mem_alloc_fn)by_hand(lm, "cuMemAlloc_v2");
    if (!init || !device_get || !ctx_create || !mem_alloc) {
        printf("symbols not found\n");
        return 2;
    }
    int dev = 0, ordinal = 0, rc, first = 1;
    if (argc > 2 && !strcmp(argv[1], "-d")) {
        ordinal = atoi(argv[2]);
        first = 3;
    }
    void *ctx = NULL;
    if ((rc = init(0)) != 0 || (rc = device_get(&dev, ordinal)) != 0 || (rc = ctx_create(&ctx, 0, dev)) != 0) {
        printf("init %d\n", rc);
        return 2;
    }
    printf("context %d\n", (int)getpid());
    for (int i = first; i < argc; i++) {
        if (!strcmp(argv[i], "spin") && i + 1 < argc) {
            printf("spun %ld\n", spin(lm, strtod(argv[++i], NULL)));
            fflush(stdout);
            continue;
        }
        if (argv[i][0] == '@') {
            wait_for(argv[i] + 1);
            continue;
        }
        unsigned long long ptr = 0;
        size_t mib = strtoull(argv[i], NULL, 10);
        printf("alloc %zu %d\n", mib, mem_alloc(&ptr, mib << 20));
    }
    fflush(stdout);
    return 0;
}
