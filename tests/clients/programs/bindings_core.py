"""cuda.core (over whichever cuda-bindings is on the path): the device as it describes
itself, stream-ordered buffers from the device's memory resource until refused, a
PTX kernel loaded as a library and launched, timed events and occupancy."""
import json

from cuda.core import Device, EventOptions, LaunchConfig, ObjectCode, launch
from cuda.core._utils.cuda_utils import CUDAError

from spin_kernel import PTX

MIB = 1 << 20
CHUNK_MIB = 128

dev = Device(0)
dev.set_current()
stream = dev.create_stream()
out = {"cc": list(dev.compute_capability), "sms": dev.properties.multiprocessor_count}

buffers, refused = [], None
while refused is None and len(buffers) < 1024:
    try:
        buffers.append(dev.allocate(CHUNK_MIB * MIB, stream=stream))
    except CUDAError as e:
        refused = str(e).split(":")[0]
out["allocated_mib"] = len(buffers) * CHUNK_MIB
out["refused"] = refused
for b in buffers:
    b.close(stream)
stream.sync()

kernel = ObjectCode.from_ptx(PTX).get_kernel("spin")
timing = EventOptions(timing_enabled=True)
start = stream.record(options=timing)
launch(stream, LaunchConfig(grid=1, block=32), kernel, 2000)
end = stream.record(options=timing)
end.sync()
out["kernel_ms"] = end - start
out["max_threads"] = kernel.attributes.max_threads_per_block
out["blocks_per_sm"] = kernel.occupancy.max_active_blocks_per_multiprocessor(256, 0)
print(json.dumps(out))
