"""ctypes access to a CUDA driver library (the simulated one by default), for test scenarios."""
import ctypes
import os
from pathlib import Path

SIM_LIB = Path(__file__).resolve().parents[2] / "build" / "sim" / "lib"

CU_STREAM_LEGACY = 1
CU_STREAM_PER_THREAD = 2
NOT_READY = 600


class CudaError(Exception):
    def __init__(self, name, code):
        super().__init__(f"{name} returned {code}")
        self.name, self.code = name, code


class Cuda:
    def __init__(self, path=None):
        self.lib = ctypes.CDLL(str(path or SIM_LIB / "libcuda.so.1"))
        self.keep = []
        self.function = None

    def rc(self, name, *args):
        return getattr(self.lib, name)(*args)

    def call(self, name, *args):
        code = self.rc(name, *args)
        if code:
            raise CudaError(name, code)

    def init(self, dev=0):
        """cuInit, then make device dev's primary context current."""
        self.call("cuInit", 0)
        ctx = ctypes.c_void_p()
        self.call("cuDevicePrimaryCtxRetain", ctypes.byref(ctx), dev)
        self.call("cuCtxSetCurrent", ctx)
        return ctx

    def alloc(self, nbytes):
        ptr = ctypes.c_uint64()
        self.call("cuMemAlloc_v2", ctypes.byref(ptr), ctypes.c_size_t(nbytes))
        return ptr.value

    def alloc_rc(self, nbytes):
        return self.rc("cuMemAlloc_v2", ctypes.byref(ctypes.c_uint64()), ctypes.c_size_t(nbytes))

    def free(self, ptr):
        self.call("cuMemFree_v2", ctypes.c_uint64(ptr))

    def mem_info(self):
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        self.call("cuMemGetInfo_v2", ctypes.byref(free), ctypes.byref(total))
        return free.value, total.value

    def stream(self, flags=0):
        s = ctypes.c_void_p()
        self.call("cuStreamCreate", ctypes.byref(s), flags)
        return s

    def kernel(self, us, stream=None, name="cuLaunchKernel"):
        if self.function is None:
            mod, fn = ctypes.c_void_p(), ctypes.c_void_p()
            self.call("cuModuleLoadData", ctypes.byref(mod), b"any image")
            self.call("cuModuleGetFunction", ctypes.byref(fn), mod, b"spin")
            self.function = fn
        arg = ctypes.c_uint64(us)
        params = (ctypes.c_void_p * 1)(ctypes.addressof(arg))
        self.call(name, self.function, 1, 1, 1, 32, 1, 1, 0, stream, params, None)

    def sync(self, stream=None):
        self.call("cuStreamSynchronize", stream)

    def event(self, flags=0):
        e = ctypes.c_void_p()
        self.call("cuEventCreate", ctypes.byref(e), flags)
        return e

    def elapsed_ms(self, start, end):
        ms = ctypes.c_float()
        self.call("cuEventElapsedTime", ctypes.byref(ms), start, end)
        return ms.value


def wait_for_stdin_close():
    """Holds the process (and its device memory) until the parent closes our stdin."""
    os.read(0, 1)
