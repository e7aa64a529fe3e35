"""cuGetProcAddress resolves names as the real driver does; bad handles and calls before
cuInit fail with the driver's error codes."""
import json

import pytest

PER_THREAD = 2

# (symbol, cudaVersion, flags, expected export or None, expected CUresult, expected symbolStatus)
CASES = [
    ("cuMemAlloc", 3020, 0, "cuMemAlloc_v2", 0, 0),
    ("cuMemAlloc", 12000, 0, "cuMemAlloc_v2", 0, 0),
    ("cuMemGetInfo", 12000, 0, "cuMemGetInfo_v2", 0, 0),
    ("cuCtxCreate", 3020, 0, "cuCtxCreate_v2", 0, 0),
    ("cuCtxCreate", 11040, 0, "cuCtxCreate_v3", 0, 0),
    ("cuCtxCreate", 12080, 0, "cuCtxCreate_v4", 0, 0),
    ("cuCtxDestroy", 3020, 0, "cuCtxDestroy", 0, 0),
    ("cuCtxDestroy", 4000, 0, "cuCtxDestroy_v2", 0, 0),
    ("cuDevicePrimaryCtxRelease", 10020, 0, "cuDevicePrimaryCtxRelease", 0, 0),
    ("cuDevicePrimaryCtxRelease", 11000, 0, "cuDevicePrimaryCtxRelease_v2", 0, 0),
    ("cuGetProcAddress", 11030, 0, "cuGetProcAddress", 0, 0),
    ("cuGetProcAddress", 12000, 0, "cuGetProcAddress_v2", 0, 0),
    ("cuDeviceGetUuid", 11040, 0, "cuDeviceGetUuid_v2", 0, 0),
    ("cuLaunchKernel", 12000, 0, "cuLaunchKernel", 0, 0),
    ("cuLaunchKernel", 12000, PER_THREAD, "cuLaunchKernel_ptsz", 0, 0),
    ("cuLaunchKernel", 12000, 1, "cuLaunchKernel", 0, 0),
    ("cuMemcpyHtoD", 12000, PER_THREAD, "cuMemcpyHtoD_v2_ptds", 0, 0),
    ("cuMemAllocAsync", 11020, PER_THREAD, "cuMemAllocAsync_ptsz", 0, 0),
    ("cuGraphLaunch", 12000, PER_THREAD, "cuGraphLaunch_ptsz", 0, 0),
    ("cuMemAlloc", 12000, PER_THREAD, "cuMemAlloc_v2", 0, 0),  # no per-thread form: the plain one
    ("cuEventElapsedTime", 12080, 0, "cuEventElapsedTime_v2", 0, 0),
    ("cuMemAllocAsync", 11000, 0, None, 500, 2),  # VERSION_NOT_SUFFICIENT
    ("cuNoSuchCall", 12000, 0, None, 500, 1),  # SYMBOL_NOT_FOUND
    ("cuMemAlloc_v2", 12000, 0, None, 500, 1),  # versioned names are not base names
]


def test_get_proc_address_resolves_versions_and_per_thread_forms(run_py):
    out = json.loads(run_py(f"""
        import json
        c = Cuda()
        results = []
        for symbol, version, flags, export, _, _ in {CASES!r}:
            fn, status = ctypes.c_void_p(), ctypes.c_int(-1)
            rc = c.rc("cuGetProcAddress_v2", symbol.encode(), ctypes.byref(fn), version, ctypes.c_uint64(flags),
                      ctypes.byref(status))
            want = ctypes.cast(getattr(c.lib, export), ctypes.c_void_p).value if export else None
            results.append([rc, status.value, fn.value == want])
        print(json.dumps(results))
    """))
    assert out == [[rc, status, True] for *_, rc, status in CASES]


def test_every_export_is_reachable_through_get_proc_address(run_py):
    """The table and the exports agree: each exported cu* entry point is some row's target."""
    missing = run_py("""
        import subprocess
        c = Cuda()
        syms = subprocess.run(["nm", "-D", "--defined-only", c.lib._name], capture_output=True, text=True).stdout
        exports = {line.split()[-1] for line in syms.splitlines() if line.split()[-1].startswith("cu")}
        reachable = set()
        for name in exports:
            base = name.split("_")[0]
            for flags in (0, 2):
                fn = ctypes.c_void_p()
                if c.rc("cuGetProcAddress", base.encode(), ctypes.byref(fn), 13000, ctypes.c_uint64(flags)) == 0:
                    for other in exports:
                        if ctypes.cast(getattr(c.lib, other), ctypes.c_void_p).value == fn.value:
                            reachable.add(other)
        # lower versions reach the older rows (and their per-thread forms)
        for name in exports:
            base = name.split("_")[0]
            for version in (2000, 3020, 4000, 7000, 8000, 9000, 9020, 10000, 10020, 11000, 11030, 12000):
                for flags in (0, 2):
                    fn = ctypes.c_void_p()
                    if c.rc("cuGetProcAddress", base.encode(), ctypes.byref(fn), version, ctypes.c_uint64(flags)) == 0:
                        for other in exports:
                            if ctypes.cast(getattr(c.lib, other), ctypes.c_void_p).value == fn.value:
                                reachable.add(other)
        print(" ".join(sorted(exports - reachable)))
    """).split()
    assert missing == []


@pytest.mark.parametrize("call, code", [
    ('c.rc("cuStreamSynchronize", ctypes.c_void_p(0xdead0))', 400),
    ('c.rc("cuStreamDestroy_v2", ctypes.c_void_p(0xdead0))', 400),
    ('c.rc("cuEventRecord", ctypes.c_void_p(0xdead0), None)', 400),
    ('c.rc("cuCtxSetCurrent", ctypes.c_void_p(0xdead0))', 201),
    ('c.rc("cuCtxPushCurrent_v2", ctypes.c_void_p(0xdead0))', 201),
    ('c.rc("cuCtxDestroy_v2", ctypes.c_void_p(0xdead0))', 201),
    ('c.rc("cuMemFree_v2", ctypes.c_uint64(0xdead0))', 1),
    ('c.rc("cuMemFreeHost", ctypes.c_void_p(0xdead0))', 1),
    ('c.rc("cuModuleGetFunction", ctypes.byref(ctypes.c_void_p()), ctypes.c_void_p(0xdead0), b"k")', 400),
    ('c.rc("cuLaunchKernel", ctypes.c_void_p(0xdead0), 1, 1, 1, 1, 1, 1, 0, None, None, None)', 400),
    ('c.rc("cuGraphLaunch", ctypes.c_void_p(0xdead0), None)', 400),
    ('c.rc("cuMemPoolTrimTo", ctypes.c_void_p(0xdead0), ctypes.c_size_t(0))', 1),
    ('c.rc("cuMemRelease", ctypes.c_uint64(0xdead0))', 1),
    ('c.rc("cuMemMap", ctypes.c_uint64(0), ctypes.c_size_t(2 << 20), ctypes.c_size_t(0), ctypes.c_uint64(0xdead0), ctypes.c_ulonglong(0))', 400),
    ('c.rc("cuArrayDestroy", ctypes.c_void_p(0xdead0))', 400),
    ('c.rc("cuMemcpyHtoD_v2", ctypes.c_uint64(0xdead0), ctypes.create_string_buffer(4), ctypes.c_size_t(4))', 1),
    ('c.rc("cuDeviceGetName", ctypes.create_string_buffer(8), 8, 7)', 101),
])
def test_unknown_handles_fail_with_the_drivers_code(run_py, call, code):
    assert run_py(f"c = Cuda(); c.init(0); print({call})").strip() == str(code)


@pytest.mark.parametrize("call", [
    'c.rc("cuDeviceGetCount", ctypes.byref(ctypes.c_int()))',
    'c.rc("cuMemAlloc_v2", ctypes.byref(ctypes.c_uint64()), ctypes.c_size_t(1))',
    'c.rc("cuCtxGetCurrent", ctypes.byref(ctypes.c_void_p()))',
    'c.rc("cuStreamSynchronize", None)',
])
def test_calls_before_init_are_not_initialized(run_py, call):
    assert run_py(f"c = Cuda(); print({call})").strip() == "3"


def test_error_names_and_strings(run_py):
    out = run_py("""
        c = Cuda(); s = ctypes.c_char_p()
        for code in (0, 2, 500, 12345):
            r1 = c.rc("cuGetErrorName", code, ctypes.byref(s)); name = s.value
            r2 = c.rc("cuGetErrorString", code, ctypes.byref(s)); print(r1, name, r2, s.value)
    """).splitlines()
    assert out == ["0 b'CUDA_SUCCESS' 0 b'no error'", "0 b'CUDA_ERROR_OUT_OF_MEMORY' 0 b'out of memory'",
                   "0 b'CUDA_ERROR_NOT_FOUND' 0 b'named symbol not found'", "1 None 1 None"]
