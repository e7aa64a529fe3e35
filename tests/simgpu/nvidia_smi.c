/*
 * A small nvidia-smi: the devices, their memory and utilisation and the processes
 * using them, read through whatever libnvidia-ml.so.1 the dynamic loader finds
 * (so a preloaded libvgpu virtualises what it shows).
 *   nvidia-smi
 *   nvidia-smi -L
 *   nvidia-smi --query-gpu=index,name,uuid,memory.total,memory.used,memory.free,utilization.gpu
 *              --format=csv[,noheader][,nounits]
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nvml_api.h"

#define NVML_FUNCTIONS(X) \
    X(nvmlInit_v2) X(nvmlShutdown) X(nvmlErrorString) X(nvmlSystemGetDriverVersion) \
    X(nvmlSystemGetCudaDriverVersion) X(nvmlDeviceGetCount_v2) X(nvmlDeviceGetHandleByIndex_v2) \
    X(nvmlDeviceGetName) X(nvmlDeviceGetUUID) X(nvmlDeviceGetMemoryInfo) \
    X(nvmlDeviceGetUtilizationRates) X(nvmlDeviceGetComputeRunningProcesses_v3) \
    X(nvmlDeviceGetPciInfo_v3)

#define DECLARE_POINTER(name) static __typeof__(name) *p_##name;
NVML_FUNCTIONS(DECLARE_POINTER)

#define MIB (1024ULL * 1024ULL)

static int load(void)
{
    void *lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (!lib) {
        fprintf(stderr, "NVIDIA-SMI couldn't find libnvidia-ml.so library in your system.\n");
        return -1;
    }
#define LOAD_POINTER(name) \
    if (!(p_##name = (__typeof__(name) *)dlsym(lib, #name))) { \
        fprintf(stderr, "nvidia-smi: libnvidia-ml.so.1 lacks %s\n", #name); \
        return -1; \
    }
    NVML_FUNCTIONS(LOAD_POINTER)
    return 0;
}

struct gpu {
    unsigned index;
    char name[NVML_DEVICE_NAME_V2_BUFFER_SIZE], uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
    nvmlMemory_t mem;
    nvmlUtilization_t util;
    nvmlPciInfo_t pci;
    nvmlDevice_t handle;
};

static int read_gpu(unsigned i, struct gpu *g)
{
    memset(g, 0, sizeof *g);
    g->index = i;
    nvmlReturn_t rc = p_nvmlDeviceGetHandleByIndex_v2(i, &g->handle);
    if (rc == NVML_SUCCESS) rc = p_nvmlDeviceGetName(g->handle, g->name, sizeof g->name);
    if (rc == NVML_SUCCESS) rc = p_nvmlDeviceGetUUID(g->handle, g->uuid, sizeof g->uuid);
    if (rc == NVML_SUCCESS) rc = p_nvmlDeviceGetMemoryInfo(g->handle, &g->mem);
    if (rc == NVML_SUCCESS) p_nvmlDeviceGetUtilizationRates(g->handle, &g->util);
    if (rc == NVML_SUCCESS) p_nvmlDeviceGetPciInfo_v3(g->handle, &g->pci);
    if (rc != NVML_SUCCESS)
        fprintf(stderr, "nvidia-smi: GPU %u: %s\n", i, p_nvmlErrorString(rc));
    return rc == NVML_SUCCESS ? 0 : -1;
}

/* One field of --query-gpu (names checked by query()). */
static void print_field(const struct gpu *g, const char *field, int units)
{
    if (!strcmp(field, "index")) printf("%u", g->index);
    else if (!strcmp(field, "name")) printf("%s", g->name);
    else if (!strcmp(field, "uuid")) printf("%s", g->uuid);
    else if (!strcmp(field, "pci.bus_id")) printf("%s", g->pci.busId);
    else if (!strcmp(field, "memory.total")) printf(units ? "%llu MiB" : "%llu", g->mem.total / MIB);
    else if (!strcmp(field, "memory.used")) printf(units ? "%llu MiB" : "%llu", g->mem.used / MIB);
    else if (!strcmp(field, "memory.free")) printf(units ? "%llu MiB" : "%llu", g->mem.free / MIB);
    else if (!strcmp(field, "utilization.gpu")) printf(units ? "%u %%" : "%u", g->util.gpu);
}

static int query(unsigned count, const char *fields, const char *format)
{
    int header = !strstr(format, "noheader"), units = !strstr(format, "nounits");
    if (strncmp(format, "csv", 3)) {
        fprintf(stderr, "nvidia-smi: --format: only csv is supported, got '%s'\n", format);
        return 1;
    }
    static const char *known[] = {"index", "name", "uuid", "pci.bus_id", "memory.total", "memory.used",
                                  "memory.free", "utilization.gpu"};
    char *list = strdup(fields);
    for (char *save = NULL, *f = strtok_r(list, ",", &save); f; f = strtok_r(NULL, ",", &save)) {
        size_t k = 0;
        while (k < sizeof known / sizeof *known && strcmp(known[k], f))
            k++;
        if (k == sizeof known / sizeof *known) {
            fprintf(stderr, "nvidia-smi: --query-gpu: unknown field '%s'\n", f);
            free(list);
            return 1;
        }
    }
    free(list);
    if (header)
        printf("%s\n", fields);
    for (unsigned i = 0; i < count; i++) {
        struct gpu g;
        if (read_gpu(i, &g) < 0)
            return 1;
        char *copy = strdup(fields);
        int first = 1;
        for (char *save = NULL, *f = strtok_r(copy, ",", &save); f; f = strtok_r(NULL, ",", &save)) {
            printf(first ? "" : ", ");
            first = 0;
            print_field(&g, f, units);
        }
        printf("\n");
        free(copy);
    }
    return 0;
}

static int table(unsigned count)
{
    char driver[NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE] = "N/A";
    int cuda = 0;
    p_nvmlSystemGetDriverVersion(driver, sizeof driver);
    p_nvmlSystemGetCudaDriverVersion(&cuda);
    printf("+-----------------------------------------------------------------------------+\n");
    printf("| NVIDIA-SMI %-14s Driver Version: %-12s CUDA Version: %2d.%-4d|\n", driver, driver,
           cuda / 1000, (cuda % 1000) / 10);
    printf("|-------------------------------+----------------------+----------------------+\n");
    printf("| GPU  Name                     | Bus-Id               | Memory MiB  GPU-Util |\n");
    printf("|===============================+======================+======================|\n");
    struct gpu gpus[64];
    if (count > 64)
        count = 64;
    for (unsigned i = 0; i < count; i++) {
        if (read_gpu(i, &gpus[i]) < 0)
            return 1;
        printf("| %3u  %-24.24s | %-20s | %5llu/%-6llu %6u%% |\n", i, gpus[i].name, gpus[i].pci.busId,
               gpus[i].mem.used / MIB, gpus[i].mem.total / MIB, gpus[i].util.gpu);
    }
    printf("+-----------------------------------------------------------------------------+\n\n");
    printf("+-----------------------------------------------------------------------------+\n");
    printf("| Processes:                                                                  |\n");
    printf("|  GPU        PID   Type   Process name                          GPU Memory   |\n");
    printf("|=============================================================================|\n");
    int any = 0;
    for (unsigned i = 0; i < count; i++) {
        nvmlProcessInfo_t procs[256];
        unsigned n = 256;
        if (p_nvmlDeviceGetComputeRunningProcesses_v3(gpus[i].handle, &n, procs) != NVML_SUCCESS)
            continue;
        for (unsigned k = 0; k < n; k++, any = 1) {
            char path[64], comm[64] = "";
            snprintf(path, sizeof path, "/proc/%u/comm", procs[k].pid);
            FILE *f = fopen(path, "r");
            if (f) {
                if (fgets(comm, sizeof comm, f))
                    comm[strcspn(comm, "\n")] = '\0';
                fclose(f);
            }
            printf("|  %3u  %9u      C   %-39.39s %7lluMiB |\n", i, procs[k].pid, comm[0] ? comm : "N/A",
                   procs[k].usedGpuMemory / MIB);
        }
    }
    if (!any)
        printf("|  No running processes found                                                 |\n");
    printf("+-----------------------------------------------------------------------------+\n");
    return 0;
}

int main(int argc, char **argv)
{
    const char *fields = NULL, *format = "csv";
    int list = 0;
    for (int i = 1; i < argc; i++) {
        if (!strncmp(argv[i], "--query-gpu=", 12)) fields = argv[i] + 12;
        else if (!strncmp(argv[i], "--format=", 9)) format = argv[i] + 9;
        else if (!strcmp(argv[i], "-L") || !strcmp(argv[i], "--list-gpus")) list = 1;
        else {
            fprintf(stderr, "nvidia-smi: unknown argument '%s'\n", argv[i]);
            return 1;
        }
    }
    if (load() < 0)
        return 1;
    nvmlReturn_t rc = p_nvmlInit_v2();
    if (rc != NVML_SUCCESS) {
        fprintf(stderr, "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver: %s\n",
                p_nvmlErrorString(rc));
        return 1;
    }
    unsigned count = 0;
    p_nvmlDeviceGetCount_v2(&count);
    int status;
    if (count == 0) {
        printf("No devices were found\n");  /* as the real tool: a container given no GPU */
        status = 6;
    } else if (list) {
        status = 0;
        for (unsigned i = 0; i < count; i++) {
            struct gpu g;
            if (read_gpu(i, &g) < 0) { status = 1; break; }
            printf("GPU %u: %s (UUID: %s)\n", i, g.name, g.uuid);
        }
    } else {
        status = fields ? query(count, fields, format) : table(count);
    }
    p_nvmlShutdown();
    return status;
}
