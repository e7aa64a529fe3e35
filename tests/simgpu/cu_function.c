/* Driver API: function attributes and occupancy. Every simulated kernel has the same
 * static resources (32 registers a thread, no static shared, local or constant
 * memory, built for sm_90); the settable attributes are kept per function or kernel
 * handle. Occupancy follows from those resources on a 9.0 device: 2048 threads,
 * 32 blocks, 64K registers and 228 KiB of shared memory per SM. */
#include "sim.h"

#include <stdlib.h>

#define SM_THREADS 2048
#define SM_BLOCKS 32
#define SM_REGS 65536
#define SM_SHARED SIM_SM_SHARED_BYTES
#define BLOCK_SHARED_OPTIN (227 * 1024)  /* the most dynamic shared memory a block may opt in to */
#define BLOCK_SHARED_DEFAULT 49152
#define REGS_PER_THREAD 32

/* X(attribute, default value, settable, largest value allowed) */
#define SIM_FUNC_ATTRS(X) \
    X(CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, 1024, 0, 0) \
    X(CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, 0, 0, 0) \
    X(CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES, 0, 0, 0) \
    X(CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES, 0, 0, 0) \
    X(CU_FUNC_ATTRIBUTE_NUM_REGS, REGS_PER_THREAD, 0, 0) \
    X(CU_FUNC_ATTRIBUTE_PTX_VERSION, 90, 0, 0) \
    X(CU_FUNC_ATTRIBUTE_BINARY_VERSION, 90, 0, 0) \
    X(CU_FUNC_ATTRIBUTE_CACHE_MODE_CA, 0, 0, 0) \
    X(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, BLOCK_SHARED_DEFAULT, 1, BLOCK_SHARED_OPTIN) \
    X(CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT, -1, 1, 100) \
    X(CU_FUNC_ATTRIBUTE_CLUSTER_SIZE_MUST_BE_SET, 0, 0, 0) \
    X(CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH, 0, 1, 8) \
    X(CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_HEIGHT, 0, 1, 8) \
    X(CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_DEPTH, 0, 1, 8) \
    X(CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 0, 1, 1) \
    X(CU_FUNC_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE, 0, 1, 2)

struct func_attrs { int value[CU_FUNC_ATTRIBUTE_MAX]; };

static pthread_mutex_t attrs_lock = PTHREAD_MUTEX_INITIALIZER;

static struct func_attrs *attrs_of(uintptr_t key)
{
    struct func_attrs *a = sim_handle_get(key, SIM_KIND_FUNC_ATTRS);
    if (a || !(a = calloc(1, sizeof *a)))
        return a;
#define SIM_FUNC_ATTR_DEFAULT(attr, def, settable, max) a->value[attr] = def;
    SIM_FUNC_ATTRS(SIM_FUNC_ATTR_DEFAULT)
    sim_handle_put(key, SIM_KIND_FUNC_ATTRS, a);
    return a;
}

CUresult sim_func_attr_get(uintptr_t key, CUfunction_attribute attrib, int *pi)
{
    if (!pi || (int)attrib < 0 || attrib >= CU_FUNC_ATTRIBUTE_MAX)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&attrs_lock);
    struct func_attrs *a = attrs_of(key);
    if (a)
        *pi = a->value[attrib];
    pthread_mutex_unlock(&attrs_lock);
    return a ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

CUresult sim_func_attr_set(uintptr_t key, CUfunction_attribute attrib, int value)
{
    switch (attrib) {
#define SIM_FUNC_ATTR_CHECK(attr, def, settable, max) \
    case attr: if (!(settable) || value < (def < 0 ? def : 0) || value > (max)) return CUDA_ERROR_INVALID_VALUE; break;
        SIM_FUNC_ATTRS(SIM_FUNC_ATTR_CHECK)
    default:
        return CUDA_ERROR_INVALID_VALUE;
    }
    pthread_mutex_lock(&attrs_lock);
    struct func_attrs *a = attrs_of(key);
    if (a)
        a->value[attrib] = value;
    pthread_mutex_unlock(&attrs_lock);
    return a ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

/* The attribute key of a function or kernel handle: a library kernel's function shares its
 * kernel's attributes (what cuKernelSetAttribute sets, cuFuncGetAttribute and the occupancy
 * calls see). */
static CUresult func_key(CUfunction f, uintptr_t *key)
{
    SIM_REQUIRE_INIT();
    if (!sim_handle_get((uintptr_t)f, SIM_KIND_FUNC) && !sim_handle_get((uintptr_t)f, SIM_KIND_KERNEL))
        return CUDA_ERROR_INVALID_HANDLE;
    CUkernel k = sim_func_kernel(f);
    *key = k ? (uintptr_t)k : (uintptr_t)f;
    return CUDA_SUCCESS;
}

CUresult cuFuncGetAttribute(int *pi, CUfunction_attribute attrib, CUfunction hfunc)
{
    uintptr_t key;
    CUresult rc = func_key(hfunc, &key);
    return rc != CUDA_SUCCESS ? rc : sim_func_attr_get(key, attrib, pi);
}

CUresult cuFuncSetAttribute(CUfunction hfunc, CUfunction_attribute attrib, int value)
{
    uintptr_t key;
    CUresult rc = func_key(hfunc, &key);
    return rc != CUDA_SUCCESS ? rc : sim_func_attr_set(key, attrib, value);
}

/* Resident blocks of `block_size` threads with `smem` dynamic shared bytes on one SM. */
static int blocks_per_sm(int block_size, size_t smem)
{
    int warps = (block_size + 31) / 32;
    int by_threads = SM_THREADS / (warps * 32);
    int by_regs = SM_REGS / (warps * 32 * REGS_PER_THREAD);
    int by_shared = smem ? (int)(SM_SHARED / sim_round_up(smem + 1024, 128)) : SM_BLOCKS;  /* 1 KiB reserved a block */
    int n = by_threads < by_regs ? by_threads : by_regs;
    n = n < by_shared ? n : by_shared;
    return n < SM_BLOCKS ? n : SM_BLOCKS;
}

static CUresult occupancy(int *numBlocks, CUfunction func, int blockSize, size_t dynamicSMemSize)
{
    uintptr_t key;
    CUresult rc = func_key(func, &key);
    if (rc != CUDA_SUCCESS)
        return rc;
    int max_dyn;
    if ((rc = sim_func_attr_get(key, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, &max_dyn)) != CUDA_SUCCESS)
        return rc;
    if (!numBlocks || blockSize <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    *numBlocks = blockSize > 1024 || dynamicSMemSize > (size_t)max_dyn ? 0 : blocks_per_sm(blockSize, dynamicSMemSize);
    return CUDA_SUCCESS;
}

CUresult cuOccupancyMaxActiveBlocksPerMultiprocessor(int *numBlocks, CUfunction func, int blockSize,
                                                     size_t dynamicSMemSize)
{
    return occupancy(numBlocks, func, blockSize, dynamicSMemSize);
}

CUresult cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(int *numBlocks, CUfunction func, int blockSize,
                                                              size_t dynamicSMemSize, unsigned int flags)
{
    if (flags > 1)                       /* CU_OCCUPANCY_DEFAULT, CU_OCCUPANCY_DISABLE_CACHING_OVERRIDE */
        return CUDA_ERROR_INVALID_VALUE;
    return occupancy(numBlocks, func, blockSize, dynamicSMemSize);
}

/* The most dynamic shared memory a block may take so that numBlocks blocks of blockSize threads
 * are resident on one SM together (0 when that many cannot be, whatever their shared memory). */
CUresult cuOccupancyAvailableDynamicSMemPerBlock(size_t *dynamicSmemSize, CUfunction func, int numBlocks,
                                                 int blockSize)
{
    uintptr_t key;
    CUresult rc = func_key(func, &key);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!dynamicSmemSize || numBlocks <= 0 || blockSize <= 0 || blockSize > 1024)
        return CUDA_ERROR_INVALID_VALUE;
    size_t per_block = SM_SHARED / (size_t)numBlocks / 128 * 128;
    per_block = per_block > 1024 ? per_block - 1024 : 0;
    *dynamicSmemSize = blocks_per_sm(blockSize, 0) < numBlocks ? 0
                       : per_block < BLOCK_SHARED_OPTIN ? per_block : BLOCK_SHARED_OPTIN;
    return CUDA_SUCCESS;
}

/* Thread block clusters: the launch's cluster dimension, else the kernel's required one, else 1. A
 * cluster's blocks are resident in one GPC (sim_gpc_sms). A cluster of more than 8 blocks needs the
 * kernel's NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 16 at most. */
#define CLUSTER_PORTABLE 8
#define CLUSTER_MAX 16

int sim_gpc_sms(int g)
{
    int tpcs = sim_config()->sms / 2;
    return 2 * (tpcs / SIM_GPCS + (g < tpcs % SIM_GPCS)) + (g == SIM_GPCS - 1 ? sim_config()->sms % 2 : 0);
}

static CUresult cluster_blocks(uintptr_t key, const CUlaunchConfig *config, int *blocks)
{
    unsigned dim[3] = {0, 0, 0};
    for (unsigned i = 0; i < config->numAttrs; i++)
        if (config->attrs[i].id == CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION) {
            dim[0] = config->attrs[i].value.clusterDim.x;
            dim[1] = config->attrs[i].value.clusterDim.y;
            dim[2] = config->attrs[i].value.clusterDim.z;
        }
    CUfunction_attribute required[3] = {CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH,
                                        CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_HEIGHT,
                                        CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_DEPTH};
    int value, non_portable;
    for (int i = 0; i < 3 && !dim[0]; i++) {
        CUresult rc = sim_func_attr_get(key, required[i], &value);
        if (rc != CUDA_SUCCESS)
            return rc;
        dim[i] = (unsigned)value;
    }
    for (int i = 0; i < 3; i++)
        dim[i] = dim[i] ? dim[i] : 1;
    CUresult rc = sim_func_attr_get(key, CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, &non_portable);
    uint64_t n = (uint64_t)dim[0] * dim[1] * dim[2];
    if (rc == CUDA_SUCCESS && n > (non_portable ? CLUSTER_MAX : CLUSTER_PORTABLE))
        rc = CUDA_ERROR_INVALID_CLUSTER_SIZE;
    *blocks = (int)n;
    return rc;
}

CUresult cuOccupancyMaxActiveClusters(int *numClusters, CUfunction func, const CUlaunchConfig *config)
{
    uintptr_t key;
    CUresult rc = func_key(func, &key);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!numClusters || !config || (config->numAttrs && !config->attrs))
        return CUDA_ERROR_INVALID_VALUE;
    int per_cluster, per_sm;
    unsigned threads = config->blockDimX * config->blockDimY * config->blockDimZ;
    if ((rc = cluster_blocks(key, config, &per_cluster)) != CUDA_SUCCESS ||
        (rc = occupancy(&per_sm, func, (int)threads, config->sharedMemBytes)) != CUDA_SUCCESS)
        return rc;
    *numClusters = 0;
    for (int g = 0; g < SIM_GPCS; g++)
        *numClusters += per_sm * sim_gpc_sms(g) / per_cluster;
    return CUDA_SUCCESS;
}

CUresult cuOccupancyMaxPotentialClusterSize(int *clusterSize, CUfunction func, const CUlaunchConfig *config)
{
    uintptr_t key;
    CUresult rc = func_key(func, &key);
    if (rc != CUDA_SUCCESS)
        return rc;
    int non_portable;
    if (!clusterSize || !config)
        return CUDA_ERROR_INVALID_VALUE;
    if ((rc = sim_func_attr_get(key, CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, &non_portable)) != CUDA_SUCCESS)
        return rc;
    *clusterSize = non_portable ? CLUSTER_MAX : CLUSTER_PORTABLE;
    return CUDA_SUCCESS;
}

/* The block size (a multiple of 32) with the most resident threads per SM, the
 * largest such on a tie; minGridSize fills every SM with it. */
CUresult cuOccupancyMaxPotentialBlockSizeWithFlags(int *minGridSize, int *blockSize, CUfunction func,
                                                   CUoccupancyB2DSize blockSizeToDynamicSMemSize,
                                                   size_t dynamicSMemSize, int blockSizeLimit, unsigned int flags)
{
    if (!minGridSize || !blockSize || flags > 1)
        return CUDA_ERROR_INVALID_VALUE;
    int limit = blockSizeLimit <= 0 || blockSizeLimit > 1024 ? 1024 : blockSizeLimit;
    int best_size = 0, best_blocks = 0;
    for (int size = (limit + 31) / 32 * 32; size > 0; size -= 32) {
        int threads = size > limit ? limit : size;
        size_t smem = blockSizeToDynamicSMemSize ? blockSizeToDynamicSMemSize(threads) : dynamicSMemSize;
        int blocks;
        CUresult rc = occupancy(&blocks, func, threads, smem);
        if (rc != CUDA_SUCCESS)
            return rc;
        if (blocks * threads > best_blocks * best_size) {
            best_size = threads;
            best_blocks = blocks;
        }
    }
    *blockSize = best_size;
    *minGridSize = best_blocks * sim_config()->sms;
    return CUDA_SUCCESS;
}

CUresult cuOccupancyMaxPotentialBlockSize(int *minGridSize, int *blockSize, CUfunction func,
                                          CUoccupancyB2DSize blockSizeToDynamicSMemSize, size_t dynamicSMemSize,
                                          int blockSizeLimit)
{
    return cuOccupancyMaxPotentialBlockSizeWithFlags(minGridSize, blockSize, func, blockSizeToDynamicSMemSize,
                                                     dynamicSMemSize, blockSizeLimit, 0);
}
