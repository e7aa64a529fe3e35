"""nvidia-ml-py: what monitoring sees of the card."""
import json

import pynvml

pynvml.nvmlInit()
count = pynvml.nvmlDeviceGetCount()
handle = pynvml.nvmlDeviceGetHandleByIndex(0)
memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
print(json.dumps({
    "count": count,
    "name": pynvml.nvmlDeviceGetName(handle),
    "uuid": pynvml.nvmlDeviceGetUUID(handle),
    "total_mib": memory.total >> 20,
    "used_le_total": memory.used <= memory.total,
    "driver": pynvml.nvmlSystemGetDriverVersion(),
}))
pynvml.nvmlShutdown()
