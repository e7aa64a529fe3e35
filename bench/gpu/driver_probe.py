"""GPU time and CUDA init measured through the driver API alone (ctypes; no PyTorch, no toolkit).

    python3 bench/gpu/driver_probe.py busy --kernel-us 1000 --seconds 10 [--mode time|work] [--start-at NS]
                                           [--spans FILE]
    python3 bench/gpu/driver_probe.py init
    python3 bench/gpu/driver_probe.py info      # device 0: UUID, name, memory, SMs

`busy`: the share of GPU time this process's kernels take. The kernel (`SPIN_PTX`, PTX the driver
compiles when the module loads) fills every SM: as many 256-thread blocks as the occupancy
calculator says are resident at once on each SM, times the SMs, one wave. Each thread either
spins on %globaltimer for `us` microseconds (`--mode time`: a kernel of fixed duration whatever
the clocks) or runs `iters` dependent FMAs (`--mode work`: fixed work, calibrated to about `us` on
this GPU first; a kernel preempted by another process's time slice still does all its work, so
the kernels two processes complete in the same window split the GPU time between them). Every
kernel has CUDA events around it on its own stream: its own time on the GPU timeline. Busy % =
the kernels' time inside the window / the window, per second and over the whole window.

The kernel is named `spin` and takes its duration in microseconds as its first parameter, as
the simulated driver's test kernel of that name does (tests/simgpu/README.md): the same probe
runs there, where the time is booked, unchanged.

`init`: cuInit + primary context + a 1 MiB allocation, timed in this process from before
the driver is loaded (ms).

Each prints one JSON object on stdout (the last line).
"""
import argparse
import ctypes
import json
import sys
import time
from pathlib import Path

CUDA_SUCCESS = 0
CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16
BLOCK = 256

SPIN_PTX = r"""
.version 7.0
.target sm_70
.address_size 64

.visible .entry spin(
	.param .u64 spin_us,
	.param .u64 spin_iters,
	.param .u64 spin_out
)
{
	.reg .pred 	%p<5>;
	.reg .f32 	%f<2>;
	.reg .b32 	%r<2>;
	.reg .b64 	%rd<12>;

	ld.param.u64 	%rd1, [spin_us];
	ld.param.u64 	%rd2, [spin_iters];
	ld.param.u64 	%rd3, [spin_out];
	mov.u64 	%rd5, %globaltimer;
	mov.u32 	%r1, %tid.x;
	cvt.rn.f32.u32 	%f1, %r1;
	setp.ne.u64 	%p1, %rd2, 0;
	@%p1 bra 	WORK;
	mul.lo.u64 	%rd4, %rd1, 1000;
	add.u64 	%rd6, %rd5, %rd4;
TIME:
	mov.u64 	%rd7, %globaltimer;
	setp.lt.u64 	%p2, %rd7, %rd6;
	@%p2 bra 	TIME;
	bra.uni 	DONE;
WORK:
	mov.u64 	%rd8, 0;
LOOP:
	fma.rn.f32 	%f1, %f1, 0f3F7FFFEF, 0f3F000000;
	add.u64 	%rd8, %rd8, 1;
	setp.lt.u64 	%p3, %rd8, %rd2;
	@%p3 bra 	LOOP;
DONE:
	cvta.to.global.u64 	%rd9, %rd3;
	st.global.f32 	[%rd9+16], %f1;
	bar.sync 	0;
	setp.ne.u32 	%p4, %r1, 0;
	@%p4 bra 	EXIT;
	mov.u64 	%rd7, %globaltimer;
	atom.global.min.u64 	%rd10, [%rd9], %rd5;
	atom.global.max.u64 	%rd11, [%rd9+8], %rd7;
EXIT:
	ret;
}
"""


class CudaError(RuntimeError):
    pass


class Driver:
    """The few driver-API calls the probes make, on device 0's primary context."""

    def __init__(self):
        self.lib = ctypes.CDLL("libcuda.so.1")
        self.check("cuInit", 0)
        self.dev = ctypes.c_int()
        self.check("cuDeviceGet", ctypes.byref(self.dev), 0)
        self.ctx = ctypes.c_void_p()
        self.check("cuDevicePrimaryCtxRetain", ctypes.byref(self.ctx), self.dev)
        self.check("cuCtxSetCurrent", self.ctx)
        elapsed = getattr(self.lib, "cuEventElapsedTime_v2", None) or self.lib.cuEventElapsedTime
        self._elapsed = elapsed

    def check(self, name, *args):
        rc = getattr(self.lib, name)(*args)
        if rc != CUDA_SUCCESS:
            raise CudaError(f"{name}: CUresult {rc}")

    def alloc(self, size: int) -> int:
        ptr = ctypes.c_uint64()
        self.check("cuMemAlloc_v2", ctypes.byref(ptr), ctypes.c_size_t(size))
        return ptr.value

    def attribute(self, attr: int) -> int:
        value = ctypes.c_int()
        self.check("cuDeviceGetAttribute", ctypes.byref(value), attr, self.dev)
        return value.value

    def uuid(self) -> str:
        raw = (ctypes.c_ubyte * 16)()
        name = "cuDeviceGetUuid_v2" if hasattr(self.lib, "cuDeviceGetUuid_v2") else "cuDeviceGetUuid"
        self.check(name, raw, self.dev)
        h = bytes(raw).hex()
        return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"

    def stream(self) -> ctypes.c_void_p:
        stream = ctypes.c_void_p()
        self.check("cuStreamCreate", ctypes.byref(stream), 0)
        return stream

    def event(self) -> ctypes.c_void_p:
        event = ctypes.c_void_p()
        self.check("cuEventCreate", ctypes.byref(event), 0)  # CU_EVENT_DEFAULT: timed
        return event

    def record(self, event, stream) -> None:
        self.check("cuEventRecord", event, stream)

    def elapsed_ms(self, start, end) -> float:
        ms = ctypes.c_float()
        rc = self._elapsed(ctypes.byref(ms), start, end)
        if rc != CUDA_SUCCESS:
            raise CudaError(f"cuEventElapsedTime: CUresult {rc}")
        return ms.value

    def sync(self, stream) -> None:
        self.check("cuStreamSynchronize", stream)


SLOT = 32          # bytes of the spin kernel's output a launch gets: start ns, end ns, the FMA result
UNSET = 0xFFFFFFFFFFFFFFFF


class Spin:
    """The spin kernel loaded into the current context, sized to fill every SM, with `slots`
    output slots: launch i writes its first block's start and last block's end (%globaltimer ns)
    into slot i."""

    def __init__(self, drv: Driver, slots: int):
        self.drv = drv
        self.module = ctypes.c_void_p()
        drv.check("cuModuleLoadData", ctypes.byref(self.module), ctypes.c_char_p(SPIN_PTX.encode()))
        self.func = ctypes.c_void_p()
        drv.check("cuModuleGetFunction", ctypes.byref(self.func), self.module, b"spin")
        per_sm = ctypes.c_int()
        drv.check("cuOccupancyMaxActiveBlocksPerMultiprocessor", ctypes.byref(per_sm), self.func, BLOCK,
                  ctypes.c_size_t(0))
        self.sms = drv.attribute(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
        self.blocks_per_sm = max(1, per_sm.value)
        self.grid = self.sms * self.blocks_per_sm
        self.slots = slots
        self.out = drv.alloc(slots * SLOT)
        self._fresh = (ctypes.c_uint64 * (slots * SLOT // 8))(*([UNSET, 0, 0, 0] * slots))
        self._read = (ctypes.c_uint64 * (slots * SLOT // 8))()
        self._args = {}

    def reset(self) -> None:
        """Every slot unwritten (a synchronous copy: call it with no kernel in flight)."""
        self.drv.check("cuMemcpyHtoD_v2", ctypes.c_uint64(self.out), self._fresh, ctypes.c_size_t(len(self._fresh) * 8))

    def spans(self) -> list:
        """(start ns, end ns) of each slot's launch as the kernel itself read %globaltimer; None where
        no kernel wrote it (the simulated driver's kernels do not run)."""
        self.drv.check("cuMemcpyDtoH_v2", self._read, ctypes.c_uint64(self.out), ctypes.c_size_t(len(self._read) * 8))
        return [None if self._read[4 * i] == UNSET else (self._read[4 * i], self._read[4 * i + 1])
                for i in range(self.slots)]

    def launch(self, stream, us: int, iters: int = 0, slot: int = 0) -> None:
        key = (us, iters, slot)
        if key not in self._args:
            params = (ctypes.c_uint64(us), ctypes.c_uint64(iters), ctypes.c_uint64(self.out + slot * SLOT))
            argv = (ctypes.c_void_p * 3)(*[ctypes.cast(ctypes.pointer(p), ctypes.c_void_p) for p in params])
            self._args[key] = (params, argv)
        self.drv.check("cuLaunchKernel", self.func, self.grid, 1, 1, BLOCK, 1, 1, 0, stream, self._args[key][1], None)


def calibrate(drv: Driver, spin: Spin, stream, us: int) -> int:
    """FMA iterations for which one kernel takes about `us` here (median of three, twice), timed
    by the kernel itself (the simulator's kernels take `us` whatever `iters` says)."""
    iters = 4096
    for _ in range(2):
        times = []
        for _ in range(3):
            spin.reset()
            spin.launch(stream, us, iters)
            drv.sync(stream)
            span = spin.spans()[0]
            times.append((span[1] - span[0]) / 1000 if span else us)
        took_us = max(sorted(times)[1], 1.0)
        iters = max(1, int(iters * us / took_us))
    return iters


def busy(args) -> dict:
    """GPU time taken by this process's kernels, by their own clock: a window of --seconds from the
    first kernel's start on, in one-second bins. Where kernels do not run (the simulator) each
    kernel's span is the --kernel-us it books, ending at its end event."""
    drv = Driver()
    queue = args.queue or min(256, max(8, 20000 // args.kernel_us))  # about 20 ms of work a round
    spin = Spin(drv, queue)
    stream = drv.stream()
    iters = calibrate(drv, spin, stream, args.kernel_us) if args.mode == "work" else 0
    for _ in range(3):                            # warm: the module, the limiter's first measurements
        spin.launch(stream, args.kernel_us, iters)
    drv.sync(stream)
    ref = drv.event()
    ends = [drv.event() for _ in range(queue)]
    if args.start_at:
        delay = (args.start_at - time.clock_gettime_ns(time.CLOCK_MONOTONIC)) / 1e9
        if delay > 0:
            time.sleep(delay)
    drv.record(ref, stream)
    stop_at = time.monotonic() + args.seconds + 0.2   # the GPU's window closes no later than this
    spans, clock = [], "kernel"
    while time.monotonic() < stop_at:
        spin.reset()
        for i in range(queue):
            spin.launch(stream, args.kernel_us, iters, slot=i)
            drv.record(ends[i], stream)
        drv.sync(stream)
        for i, span in enumerate(spin.spans()):
            if span is None:                          # booked, not run: the end event, the nominal time
                clock = "nominal"
                end = drv.elapsed_ms(ref, ends[i]) * 1e6
                span = (end - args.kernel_us * 1000, end)
            spans.append(span)
    origin = spans[0][0]
    # the window: --seconds, or less where the kernels did not reach its end (whole seconds)
    covered = max(end for _, end in spans) - origin
    seconds = max(1, min(args.seconds, int(covered // 1e9)))
    window = seconds * 1e9
    bins = [0.0] * seconds
    done = 0.0                                    # kernels: the fractions of each inside the window
    for begin, end in spans:
        lo, hi = max(begin - origin, 0.0), min(end - origin, window)
        if hi <= lo:
            continue
        done += (hi - lo) / (end - begin) if end > begin else 1.0
        for second in range(int(lo // 1e9), min(seconds, int(hi // 1e9) + 1)):
            overlap = min(hi, (second + 1) * 1e9) - max(lo, second * 1e9)
            if overlap > 0:
                bins[second] += overlap
    if args.spans and clock == "kernel":
        Path(args.spans).write_text(json.dumps(spans))
    took = sorted((end - begin) / 1000 for begin, end in spans)
    return {"mode": args.mode, "kernel_us": args.kernel_us, "iters": iters, "clock": clock, "sms": spin.sms,
            "blocks_per_sm": spin.blocks_per_sm, "grid": spin.grid, "block": BLOCK, "seconds": seconds,
            "queue": queue, "kernels": len(spans), "kernels_in_window": done,
            "kernel_us_median": took[len(took) // 2], "busy_pct": sum(bins) / window * 100,
            "per_second_pct": [b / 1e7 for b in bins], "uuid": drv.uuid()}


def info(_args) -> dict:
    drv = Driver()
    name = ctypes.create_string_buffer(256)
    drv.check("cuDeviceGetName", name, 256, drv.dev)
    total = ctypes.c_size_t()
    drv.check("cuDeviceTotalMem_v2", ctypes.byref(total), drv.dev)
    version = ctypes.c_int()
    drv.check("cuDriverGetVersion", ctypes.byref(version))
    return {"uuid": drv.uuid(), "name": name.value.decode(), "total_mib": total.value / (1 << 20),
            "sms": drv.attribute(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT), "cuda_driver_version": version.value}


def init(_args) -> dict:
    """The whole of it, and its steps (where libvgpu adds time: at cuInit, around the context's
    creation, which it measures through NVML, or at the first allocation)."""
    marks = [time.perf_counter()]
    lib = ctypes.CDLL("libcuda.so.1")
    marks.append(time.perf_counter())
    if lib.cuInit(0) != CUDA_SUCCESS:
        raise CudaError("cuInit failed")
    marks.append(time.perf_counter())
    drv = Driver()                                # cuInit again (returns at once), the primary context
    marks.append(time.perf_counter())
    drv.alloc(1 << 20)
    drv.check("cuCtxSynchronize")
    marks.append(time.perf_counter())
    ms = [(b - a) * 1000 for a, b in zip(marks, marks[1:])]
    return {"driver_init_ms": (marks[-1] - marks[0]) * 1000, "load_ms": ms[0], "cuinit_ms": ms[1],
            "context_ms": ms[2], "first_alloc_ms": ms[3]}


def main() -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="what", required=True)
    busy_parser = sub.add_parser("busy")
    busy_parser.add_argument("--kernel-us", type=int, default=1000)
    busy_parser.add_argument("--seconds", type=int, default=10)
    busy_parser.add_argument("--mode", choices=("time", "work"), default="time")
    busy_parser.add_argument("--queue", type=int, default=0,
                             help="kernels launched between synchronisations (default: about 20 ms of them)")
    busy_parser.add_argument("--start-at", type=int, default=0, help="CLOCK_MONOTONIC ns the window opens at")
    busy_parser.add_argument("--spans", help="write each kernel's [start ns, end ns] by the GPU's own clock "
                             "(JSON) to this file, where the kernels wrote them: two processes' kernels compared")
    sub.add_parser("init")
    sub.add_parser("info")
    args = parser.parse_args()
    try:
        result = {"busy": busy, "init": init, "info": info}[args.what](args)
    except CudaError as exc:
        sys.exit(f"driver_probe: {exc}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
