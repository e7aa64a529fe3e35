"""cuda-bindings (12.x or 13.x, whichever is on the path): the driver API as a Python
user calls it. Contexts through every cuCtxCreate form the version offers and the
primary context, memory info, cuMemAlloc to and past the card, a stream-ordered
allocation, and a launch of a PTX kernel."""
import ctypes
import json

import cuda.bindings
from cuda.bindings import driver as cu

import spin_kernel

MIB = 1 << 20
CHUNK_MIB = 128
PTX = spin_kernel.PTX + b"\0"  # cuModuleLoadData reads PTX up to its NUL


def check(result):
    """The call's outputs; raises with the error's name when it failed."""
    err, *out = result
    if err != cu.CUresult.CUDA_SUCCESS:
        raise RuntimeError(err.name)
    return out[0] if len(out) == 1 else tuple(out)


def error_of(result) -> str:
    return result[0].name


def context_variants(dev):
    """Each cuCtxCreate form this version of the bindings offers: name -> create()."""
    major = int(cuda.bindings.__version__.split(".")[0])
    if major >= 13:
        return {"v4": lambda: cu.cuCtxCreate(None, 0, dev)}
    return {
        "v2": lambda: cu.cuCtxCreate(0, dev),
        "v3": lambda: cu.cuCtxCreate_v3(None, 0, 0, dev),
        "v4": lambda: cu.cuCtxCreate_v4(None, 0, dev),
    }


def contexts(dev) -> dict:
    seen = {}
    for name, create in context_variants(dev).items():
        ctx = check(create())
        current = check(cu.cuCtxGetCurrent())
        seen[name] = {"current": int(current) == int(ctx), "device": int(check(cu.cuCtxGetDevice()))}
        check(cu.cuCtxDestroy(ctx))
    primary = check(cu.cuDevicePrimaryCtxRetain(dev))
    check(cu.cuCtxSetCurrent(primary))
    flags, active = check(cu.cuDevicePrimaryCtxGetState(dev))
    seen["primary"] = {"current": int(check(cu.cuCtxGetCurrent())) == int(primary), "active": bool(active),
                       "device": int(check(cu.cuCtxGetDevice()))}
    return seen


def fill() -> dict:
    """cuMemAlloc in chunks until refused, then one allocation larger than the card."""
    free, total = check(cu.cuMemGetInfo())
    ptrs, error = [], None
    while error is None and len(ptrs) * CHUNK_MIB * MIB <= total:
        result = cu.cuMemAlloc(CHUNK_MIB * MIB)
        if result[0] == cu.CUresult.CUDA_SUCCESS:
            ptrs.append(result[1])
        else:
            error = error_of(result)
    for p in ptrs:
        check(cu.cuMemFree(p))
    return {"total_mib": total // MIB, "free_mib": free // MIB, "filled_mib": len(ptrs) * CHUNK_MIB,
            "fill_error": error, "past_total": error_of(cu.cuMemAlloc(total + MIB))}


def stream_ordered() -> dict:
    stream = check(cu.cuStreamCreate(0))
    ptr = check(cu.cuMemAllocAsync(64 * MIB, stream))
    check(cu.cuMemFreeAsync(ptr, stream))
    check(cu.cuStreamSynchronize(stream))
    _, total = check(cu.cuMemGetInfo())
    past = error_of(cu.cuMemAllocAsync(total + MIB, stream))
    check(cu.cuStreamSynchronize(stream))
    check(cu.cuStreamDestroy(stream))
    return {"async_ok": True, "async_past_total": past}


def launch() -> dict:
    module = check(cu.cuModuleLoadData(PTX))
    function = check(cu.cuModuleGetFunction(module, b"spin"))
    stream = check(cu.cuStreamCreate(0))
    check(cu.cuLaunchKernel(function, 1, 1, 1, 32, 1, 1, 0, stream, ((1000,), (ctypes.c_uint64,)), 0))
    check(cu.cuStreamSynchronize(stream))
    check(cu.cuStreamDestroy(stream))
    check(cu.cuModuleUnload(module))
    return {"launched": True}


check(cu.cuInit(0))
dev = check(cu.cuDeviceGet(0))
out = {"version": cuda.bindings.__version__, "driver": check(cu.cuDriverGetVersion())}
out["contexts"] = contexts(dev)
out.update(fill())
out.update(stream_ordered())
out.update(launch())
check(cu.cuDevicePrimaryCtxRelease(dev))
print(json.dumps(out))
