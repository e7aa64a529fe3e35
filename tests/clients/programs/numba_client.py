"""numba-cuda as a user writes it. Scenarios (argv[1]):

  basic               cuda.detect(), memory info, device arrays filled until numba
                      refuses, a @cuda.jit kernel launched and synchronised
  launches N          N launches of a kernel (the simulator runs a compiled kernel for
                      its configured kernel_us) and the seconds they took
  hold MIB            holds MIB of device arrays, says so, waits for a line on stdin,
                      then fills what is left and reports how much it got

With --driver-linker first, nvJitLink is not found, so kernels are linked with the
driver's cuLink* calls, as for a user without the nvJitLink wheel.
"""
import contextlib
import io
import sys
import time
import warnings

if sys.argv[1] == "--driver-linker":
    del sys.argv[1]
    import cuda.pathfinder as pathfinder

    find_library = pathfinder.load_nvidia_dynamic_lib

    def without_nvjitlink(name):
        if name == "nvJitLink":
            raise pathfinder.DynamicLibNotFoundError("nvJitLink is not installed")
        return find_library(name)

    pathfinder.load_nvidia_dynamic_lib = without_nvjitlink
    warnings.filterwarnings("ignore", message="cuda.bindings.nvjitlink is not available")

import numpy as np  # noqa: E402
from numba import cuda  # noqa: E402
from numba.cuda.cudadrv.driver import CudaAPIError  # noqa: E402

import scenarios  # noqa: E402
from scenarios import CHUNK_MIB, MIB  # noqa: E402


@cuda.jit
def touch(dur_us, x):
    i = cuda.grid(1)
    if i < x.size:
        x[i] = dur_us


@cuda.jit(debug=True, opt=False)
def checked(x):
    x[0] = 1       # a debug kernel: numba reads its error flag, a global of the module, after launch


def device_array(size: int):
    return cuda.device_array(size, dtype=np.uint8)


def fill() -> tuple[list, dict]:
    """Device arrays of CHUNK_MIB until numba refuses; the arrays and how it refused."""
    return scenarios.fill(device_array, CudaAPIError, lambda e: {"error": type(e).__name__, "code": int(e.code)})


def memory() -> dict:
    free, total = cuda.current_context().get_memory_info()
    return {"free_mib": free // MIB, "total_mib": total // MIB}


def basic() -> dict:
    report = io.StringIO()
    with contextlib.redirect_stdout(report):
        detected = cuda.detect()
    out = {"detected": bool(detected), "detect_report": report.getvalue(),
           "cc": list(cuda.get_current_device().compute_capability)}
    out.update(memory())
    arrays, refusal = fill()
    out["filled_mib"] = len(arrays) * CHUNK_MIB
    out["refusal"] = refusal
    del arrays
    cuda.current_context().deallocations.clear()
    x = cuda.to_device(np.zeros(256, dtype=np.int64))
    touch[1, 256](7, x)
    cuda.synchronize()
    checked[1, 1](x)
    cuda.synchronize()
    out["launched"] = True
    return out


def launches(n: int) -> dict:
    x = cuda.device_array(32, dtype=np.int64)
    touch[1, 32](n, x)               # compiled and loaded before timing
    cuda.synchronize()
    start = time.monotonic()
    for _ in range(n):
        touch[1, 32](n, x)
    cuda.synchronize()
    return {"launches": n, "seconds": time.monotonic() - start}


scenarios.run({"basic": basic, "launches": launches,
               "hold": lambda mib: scenarios.hold(mib, device_array, fill)})
