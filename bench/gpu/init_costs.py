"""What the NVML calls libvgpu makes around a process's first context cost on this node's driver,
with no libvgpu loaded (ctypes; no PyTorch):

    python3 bench/gpu/init_costs.py [--processes 7]

Each fresh process times, in the order libvgpu meets them: cuInit; nvmlInit_v2 after it (serial),
on a thread started with cuInit (overlapped), nvmlInitWithFlags(NVML_INIT_FLAG_NO_ATTACH) after
it (no_attach: no GPU attached at init, the one asked for at its first handle), or nvmlInit_v2
and the first device handle on a thread started with the primary context's creation, after
cuInit (beside_context: whether the driver lets NVML's start overlap the context's, as it did
not cuInit's; the snapshot before the context is then not taken); the device's first handle (by PCI
bus id); the two snapshot queries (memory info, the running compute processes) before the primary
context; the primary context's creation; the same two queries after it. Medians over the
processes, in ms, one JSON object on the last line; a way whose process failed says how (on an
H200 with driver 580.159.04 no_attach died of SIGSEGV). Where context creation under libvgpu costs more than bare
(tests/gpu's CUDA-init bar), these say which call it is.
"""
import argparse
import ctypes
import json
import statistics
import subprocess
import sys
import threading
import time

NVML_MAX_PROCS = 256


class ProcessInfo(ctypes.Structure):  # nvmlProcessInfo_v2_t (the _v3 query's record)
    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong),
                ("gpuInstanceId", ctypes.c_uint), ("computeInstanceId", ctypes.c_uint)]


def timed(marks: dict, name: str, call):
    start = time.perf_counter()
    result = call()
    marks[name] = (time.perf_counter() - start) * 1000
    return result


NVML_INIT_FLAG_NO_ATTACH = 2


def child(way: str) -> dict:
    marks = {}
    cuda = ctypes.CDLL("libcuda.so.1")
    nvml = ctypes.CDLL("libnvidia-ml.so.1")
    nvml_init = {}
    start_nvml = (lambda: nvml.nvmlInitWithFlags(NVML_INIT_FLAG_NO_ATTACH)) if way == "no_attach" else nvml.nvmlInit_v2
    worker = threading.Thread(target=lambda: timed(nvml_init, "nvml_init_ms", start_nvml))
    if way == "overlapped":
        start = time.perf_counter()
        worker.start()
        timed(marks, "cuinit_ms", lambda: cuda.cuInit(0))
        worker.join()
        marks["cuinit_and_nvml_init_ms"] = (time.perf_counter() - start) * 1000
    elif way == "beside_context":
        return beside_context(cuda, nvml, marks)
    else:
        timed(marks, "cuinit_ms", lambda: cuda.cuInit(0))
        worker.start()
        worker.join()
    marks.update(nvml_init)
    dev = ctypes.c_int()
    cuda.cuDeviceGet(ctypes.byref(dev), 0)
    handle = timed(marks, "first_handle_ms", lambda: handle_by_bus_id(cuda, nvml, dev))

    def snapshot(prefix):
        memory = (ctypes.c_ulonglong * 3)()
        timed(marks, prefix + "_memory_info_ms", lambda: nvml.nvmlDeviceGetMemoryInfo(handle, memory))
        procs = (ProcessInfo * NVML_MAX_PROCS)()
        count = ctypes.c_uint(NVML_MAX_PROCS)
        timed(marks, prefix + "_processes_ms",
              lambda: nvml.nvmlDeviceGetComputeRunningProcesses_v3(handle, ctypes.byref(count), procs))

    snapshot("before")
    ctx = ctypes.c_void_p()
    timed(marks, "context_ms", lambda: cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev))
    snapshot("after")
    return marks


def beside_context(cuda, nvml, marks: dict) -> dict:
    """NVML's init and first device access on a thread while this one creates the primary context."""
    timed(marks, "cuinit_ms", lambda: cuda.cuInit(0))
    dev = ctypes.c_int()
    cuda.cuDeviceGet(ctypes.byref(dev), 0)
    worker = threading.Thread(target=lambda: (timed(marks, "nvml_init_ms", nvml.nvmlInit_v2),
                                              timed(marks, "first_handle_ms", lambda: handle_by_bus_id(cuda, nvml, dev))))
    ctx = ctypes.c_void_p()
    start = time.perf_counter()
    worker.start()
    timed(marks, "context_ms", lambda: cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev))
    worker.join()
    marks["context_and_nvml_ms"] = (time.perf_counter() - start) * 1000
    return marks


def handle_by_bus_id(cuda, nvml, dev) -> ctypes.c_void_p:
    """NVML's handle of CUDA device `dev` as libvgpu finds it: by PCI bus id, which has NVML
    initialise that GPU alone (by UUID it may initialise each GPU it searches on the way)."""
    bus_id, handle = ctypes.create_string_buffer(96), ctypes.c_void_p()
    if (cuda.cuDeviceGetPCIBusId(bus_id, 96, dev)
            or nvml.nvmlDeviceGetHandleByPciBusId_v2(bus_id, ctypes.byref(handle))):
        raise SystemExit(f"no NVML handle by PCI bus id {bus_id.value!r}")
    return handle


WAYS = ("serial", "overlapped", "beside_context", "no_attach")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--processes", type=int, default=7)
    parser.add_argument("--child", choices=WAYS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child)))
        return
    result = {}
    for way in WAYS:
        try:
            runs = [json.loads(subprocess.run([sys.executable, __file__, "--child", way], check=True,
                                              capture_output=True, text=True).stdout.splitlines()[-1])
                    for _ in range(args.processes)]
        except subprocess.CalledProcessError as failed:
            result[way] = {"failed": str(failed)}
            continue
        result[way] = {key: round(statistics.median(r[key] for r in runs), 3) for key in runs[0]}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
