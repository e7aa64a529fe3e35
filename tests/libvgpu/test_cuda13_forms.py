"""CUDA 13's forms of hooked entry points reach libvgpu as the older ones do: cudart 13
asks cuGetProcAddress for cuCtxSynchronize at 13000 and gets cuCtxSynchronize_v2 (what
cudaDeviceSynchronize calls), which must be libvgpu's, whether looked up that way or
with dlsym."""
import json
import subprocess
import sys

from tests.conftest import LIBVGPU, SIM_LIB

SCRIPT = """
import ctypes, json
cuda = ctypes.CDLL("libcuda.so.1")
libdl = ctypes.CDLL(None)

class Info(ctypes.Structure):
    _fields_ = [("fname", ctypes.c_char_p), ("fbase", ctypes.c_void_p), ("sname", ctypes.c_char_p),
                ("saddr", ctypes.c_void_p)]

def owner(address):
    info = Info()
    libdl.dladdr(ctypes.c_void_p(address), ctypes.byref(info))
    return info.fname.decode().rsplit("/", 1)[-1]

assert cuda.cuInit(0) == 0
fn = ctypes.c_void_p()
rc = cuda.cuGetProcAddress_v2(b"cuCtxSynchronize", ctypes.byref(fn), 13000, ctypes.c_uint64(0), None)
print(json.dumps({"proc_address": [rc, owner(fn.value)],
                  "dlsym": owner(ctypes.cast(cuda.cuCtxSynchronize_v2, ctypes.c_void_p).value)}))
"""


def test_cuda13_device_synchronize_is_hooked(tmp_path):
    env = {"LD_LIBRARY_PATH": str(SIM_LIB), "LD_PRELOAD": str(LIBVGPU),
           "HAMI_SIM_STATE": str(tmp_path / "sim.state"), "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got == {"proc_address": [0, "libvgpu.so"], "dlsym": "libvgpu.so"}
