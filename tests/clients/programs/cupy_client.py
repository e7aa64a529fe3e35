"""CuPy as a user writes it, on NVIDIA's libcudart and NVRTC. Scenarios (argv[1]):

  basic      device count, memory info, a host -> device -> host round trip, one
             elementwise kernel (compiled by NVRTC, launched and synchronised),
             arrays from the default memory pool until CuPy refuses, then the
             same from a stream-ordered pool (cupy.cuda.MemoryAsyncPool)
  hold MIB   holds MIB of arrays, says so, waits for a line on stdin, then fills
             what is left and reports how much it got
"""
import ctypes
from pathlib import Path

import numpy as np
import nvidia.cuda_nvrtc

# NVRTC comes from its wheel: loaded by path so that CuPy's dlopen by name finds it.
ctypes.CDLL(str(Path(list(nvidia.cuda_nvrtc.__path__)[0]) / "lib" / "libnvrtc.so.12"), mode=ctypes.RTLD_GLOBAL)

import cupy  # noqa: E402
import scenarios  # noqa: E402
from scenarios import CHUNK_MIB, MIB  # noqa: E402


def array(size: int):
    return cupy.empty(size, dtype=cupy.uint8)


def fill() -> tuple[list, dict]:
    """Arrays of CHUNK_MIB until CuPy refuses; the arrays and how it refused."""
    return scenarios.fill(array, cupy.cuda.memory.OutOfMemoryError, lambda e: {"error": type(e).__name__})


def free_mib() -> int:
    return cupy.cuda.runtime.memGetInfo()[0] // MIB


def basic() -> dict:
    free, total = cupy.cuda.runtime.memGetInfo()
    out = {"count": cupy.cuda.runtime.getDeviceCount(), "free_mib": free // MIB, "total_mib": total // MIB}

    host = np.arange(1 << 20, dtype=np.float32)
    device = cupy.asarray(host)
    out["round_trip"] = bool(np.array_equal(cupy.asnumpy(device), host))

    double = cupy.ElementwiseKernel("float32 x", "float32 y", "y = x * 2", "hami_double")
    result = double(device)
    cupy.cuda.Device().synchronize()
    out["kernel_shape"] = list(result.shape)
    del device, result

    pool = cupy.get_default_memory_pool()
    pool.free_all_blocks()
    out["pool_free_mib"] = free_mib()
    arrays, out["pool_refusal"] = fill()
    out["pool_filled_mib"] = len(arrays) * CHUNK_MIB
    out["pool_held_mib"] = pool.total_bytes() // MIB
    del arrays
    pool.free_all_blocks()
    out["pool_released"] = pool.total_bytes() == 0

    cupy.cuda.set_allocator(cupy.cuda.MemoryAsyncPool().malloc)
    out["async_free_mib"] = free_mib()
    arrays, out["async_refusal"] = fill()
    out["async_filled_mib"] = len(arrays) * CHUNK_MIB
    del arrays
    cupy.cuda.Device().synchronize()
    return out


scenarios.run({"basic": basic, "hold": lambda mib: scenarios.hold(mib, array, fill)})
