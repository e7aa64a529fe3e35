/* Driver API: stream memory operations. A write lands and a wait is satisfied when
 * the stream reaches it, in order with its kernels and copies: the stream's worker
 * writes the value, or polls the word until the condition holds (as the GPU's front
 * end does; a wait that is never satisfied holds the stream, until it is destroyed).
 * The legacy exports and the _v2 ones behave alike here; the memory-ordering flags
 * only relax an order that a queue keeps anyway. The word may be device memory or
 * page-locked host memory (the driver maps it for the device). */
#include "sim.h"

#include <stdlib.h>
#include <string.h>

#define MEMOP_POLL_US 20

struct memop {
    struct sim_stream *stream;
    CUstreamBatchMemOpType type;
    void *address;
    uint64_t value;
    unsigned flags;
};

static int word_ok(CUdeviceptr addr, size_t size)
{
    uintptr_t base;
    size_t len;
    unsigned host_flags;
    return addr % size == 0 && (sim_device_range_ok(addr, size) ||
                                sim_host_range((uintptr_t)addr, &base, &len, &host_flags));
}

static int satisfied(const struct memop *op)
{
    uint64_t now = op->type == CU_STREAM_MEM_OP_WAIT_VALUE_32
                       ? __atomic_load_n((uint32_t *)op->address, __ATOMIC_ACQUIRE)
                       : __atomic_load_n((uint64_t *)op->address, __ATOMIC_ACQUIRE);
    uint64_t mask = op->type == CU_STREAM_MEM_OP_WAIT_VALUE_32 ? 0xffffffffull : ~0ull;
    switch (op->flags & ~(unsigned)CU_STREAM_WAIT_VALUE_FLUSH) {
    case CU_STREAM_WAIT_VALUE_GEQ:  /* a cyclic comparison, as the driver documents */
        return op->type == CU_STREAM_MEM_OP_WAIT_VALUE_32 ? (int32_t)((uint32_t)now - (uint32_t)op->value) >= 0
                                                          : (int64_t)(now - op->value) >= 0;
    case CU_STREAM_WAIT_VALUE_EQ:
        return now == op->value;
    case CU_STREAM_WAIT_VALUE_AND:
        return (now & op->value) != 0;
    default:                             /* CU_STREAM_WAIT_VALUE_NOR */
        return (~(now | op->value) & mask) != 0;
    }
}

static void run_memop(void *arg)
{
    struct memop *op = arg;
    if (op->type == CU_STREAM_MEM_OP_WRITE_VALUE_32)
        __atomic_store_n((uint32_t *)op->address, (uint32_t)op->value, __ATOMIC_RELEASE);
    else if (op->type == CU_STREAM_MEM_OP_WRITE_VALUE_64)
        __atomic_store_n((uint64_t *)op->address, op->value, __ATOMIC_RELEASE);
    else if (op->type == CU_STREAM_MEM_OP_WAIT_VALUE_32 || op->type == CU_STREAM_MEM_OP_WAIT_VALUE_64) {
        while (!satisfied(op) && !sim_stream_stopping(op->stream))
            sim_sleep_us(MEMOP_POLL_US);
    }
    free(op);
}

/* Checks one operation and queues it (queue = 0: check only). */
static CUresult memop(struct sim_stream *s, const CUstreamBatchMemOpParams *p, int queue)
{
    struct memop op = {.stream = s, .type = p->operation};
    switch (p->operation) {
    case CU_STREAM_MEM_OP_WAIT_VALUE_32:
    case CU_STREAM_MEM_OP_WAIT_VALUE_64: {
        size_t size = p->operation == CU_STREAM_MEM_OP_WAIT_VALUE_32 ? 4 : 8;
        if ((p->waitValue.flags & ~(unsigned)(CU_STREAM_WAIT_VALUE_FLUSH | 0x3)) || !word_ok(p->waitValue.address, size))
            return CUDA_ERROR_INVALID_VALUE;
        op.address = (void *)(uintptr_t)p->waitValue.address;
        op.value = size == 4 ? p->waitValue.value : p->waitValue.value64;
        op.flags = p->waitValue.flags;
        break;
    }
    case CU_STREAM_MEM_OP_WRITE_VALUE_32:
    case CU_STREAM_MEM_OP_WRITE_VALUE_64: {
        size_t size = p->operation == CU_STREAM_MEM_OP_WRITE_VALUE_32 ? 4 : 8;
        if ((p->writeValue.flags & ~(unsigned)CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER) ||
            !word_ok(p->writeValue.address, size))
            return CUDA_ERROR_INVALID_VALUE;
        op.address = (void *)(uintptr_t)p->writeValue.address;
        op.value = size == 4 ? p->writeValue.value : p->writeValue.value64;
        break;
    }
    case CU_STREAM_MEM_OP_FLUSH_REMOTE_WRITES:  /* no remote writer (RDMA) can reach a simulated card */
    case CU_STREAM_MEM_OP_BARRIER:              /* a queue is ordered already */
        return CUDA_SUCCESS;
    default:
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (!queue)
        return CUDA_SUCCESS;
    struct memop *copy = malloc(sizeof *copy);
    if (!copy)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *copy = op;
    sim_stream_enqueue_call(s, run_memop, copy);
    return CUDA_SUCCESS;
}

static CUresult batch(CUstream stream, unsigned count, const CUstreamBatchMemOpParams *ops, unsigned flags)
{
    SIM_REQUIRE_INIT();
    struct sim_stream *s;
    int capturing;
    CUresult rc = sim_stream_op(stream, &s, &capturing);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (capturing)                       /* batch memory operation nodes are not simulated */
        return sim_capture_refuse(s, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    if (flags || !count || !ops || count > 256)
        return CUDA_ERROR_INVALID_VALUE;
    for (unsigned i = 0; i < count; i++)  /* all or nothing: check them all first */
        if ((rc = memop(s, &ops[i], 0)) != CUDA_SUCCESS)
            return rc;
    for (unsigned i = 0; i < count && rc == CUDA_SUCCESS; i++)
        rc = memop(s, &ops[i], 1);
    return rc;
}

static CUresult one(CUstream stream, CUstreamBatchMemOpType type, CUdeviceptr addr, uint64_t value, unsigned flags)
{
    CUstreamBatchMemOpParams p;
    memset(&p, 0, sizeof p);
    p.operation = type;
    if (type == CU_STREAM_MEM_OP_WAIT_VALUE_32 || type == CU_STREAM_MEM_OP_WAIT_VALUE_64) {
        p.waitValue.address = addr;
        p.waitValue.value64 = value;
        if (type == CU_STREAM_MEM_OP_WAIT_VALUE_32)
            p.waitValue.value = (cuuint32_t)value;
        p.waitValue.flags = flags;
    } else {
        p.writeValue.address = addr;
        p.writeValue.value64 = value;
        if (type == CU_STREAM_MEM_OP_WRITE_VALUE_32)
            p.writeValue.value = (cuuint32_t)value;
        p.writeValue.flags = flags;
    }
    return batch(stream, 1, &p, 0);
}

/* Every export of every generation is the same operation. */
#define SIM_MEMOPS(suffix)                                                                                       \
    CUresult cuStreamWaitValue32##suffix(CUstream stream, CUdeviceptr addr, cuuint32_t value, unsigned int flags)  \
    {                                                                                                            \
        return one(stream, CU_STREAM_MEM_OP_WAIT_VALUE_32, addr, value, flags);                                  \
    }                                                                                                            \
    CUresult cuStreamWaitValue64##suffix(CUstream stream, CUdeviceptr addr, cuuint64_t value, unsigned int flags)  \
    {                                                                                                            \
        return one(stream, CU_STREAM_MEM_OP_WAIT_VALUE_64, addr, value, flags);                                  \
    }                                                                                                            \
    CUresult cuStreamWriteValue32##suffix(CUstream stream, CUdeviceptr addr, cuuint32_t value, unsigned int flags) \
    {                                                                                                            \
        return one(stream, CU_STREAM_MEM_OP_WRITE_VALUE_32, addr, value, flags);                                 \
    }                                                                                                            \
    CUresult cuStreamWriteValue64##suffix(CUstream stream, CUdeviceptr addr, cuuint64_t value, unsigned int flags) \
    {                                                                                                            \
        return one(stream, CU_STREAM_MEM_OP_WRITE_VALUE_64, addr, value, flags);                                 \
    }                                                                                                            \
    CUresult cuStreamBatchMemOp##suffix(CUstream stream, unsigned int count, CUstreamBatchMemOpParams *paramArray, \
                                        unsigned int flags)                                                      \
    {                                                                                                            \
        return batch(stream, count, paramArray, flags);                                                         \
    }

SIM_MEMOPS()
SIM_MEMOPS(_v2)
SIM_MEMOPS(_ptsz)
SIM_MEMOPS(_v2_ptsz)
