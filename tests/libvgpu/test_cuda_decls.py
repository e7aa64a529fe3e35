"""Our driver API declarations against NVIDIA's cuda.h: every prototype compiled against
its types, and the same sizes, field offsets and constant values from both headers. The
headers are the toolkit's where it is installed, and those the CUDA runtime wheels ship
(12.9 in .venv, 13.0 in build/torch/venv), which make test installs."""
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import BUILD, ROOT

HEADERS = {
    "toolkit": Path("/usr/local/cuda/include/cuda.h"),
    "wheel 12": ROOT / ".venv/lib/python3.11/site-packages/nvidia/cuda_runtime/include/cuda.h",
    "wheel 13": BUILD / "torch/venv/lib/python3.11/site-packages/nvidia/cu13/include/cuda.h",
}
INCLUDE = ROOT / "libvgpu_src"

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="no gcc")


@pytest.fixture(params=HEADERS)
def cuda_h(request) -> Path:
    path = HEADERS[request.param]
    if not path.exists():
        pytest.skip(f"no {path}")
    return path

# (type, fields) whose layout the driver reads from our memory
STRUCTS = {
    "CUuuid": ["bytes"],
    "CUDA_ARRAY_DESCRIPTOR": ["Width", "Height", "Format", "NumChannels"],
    "CUDA_ARRAY3D_DESCRIPTOR": ["Width", "Height", "Depth", "Format", "NumChannels", "Flags"],
    "CUmemLocation": ["type", "id"],
    "CUmemAllocationProp": ["type", "requestedHandleTypes", "location", "win32HandleMetaData",
                            "allocFlags"],
    "CUmemAccessDesc": ["location", "flags"],
    "CUmemPoolProps": ["allocType", "handleTypes", "location", "win32SecurityAttributes",
                       "maxSize", "usage", "reserved"],
    "CUlaunchAttribute": ["id", "value"],
    "CUDA_MEM_ALLOC_NODE_PARAMS": ["poolProps", "accessDescs", "accessDescCount", "bytesize", "dptr"],
    "CUDA_GRAPH_INSTANTIATE_PARAMS": ["flags", "hUploadStream", "hErrNode_out", "result_out"],
    "CUlaunchConfig": ["gridDimX", "gridDimY", "gridDimZ", "blockDimX", "blockDimY", "blockDimZ",
                       "sharedMemBytes", "hStream", "attrs", "numAttrs"],
}
CONSTANTS = [
    "CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT", "CU_MEMPOOL_ATTR_USED_MEM_CURRENT",
    "CU_MEMPOOL_ATTR_RELEASE_THRESHOLD", "CU_GET_PROC_ADDRESS_DEFAULT",
    "CU_GET_PROC_ADDRESS_LEGACY_STREAM", "CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM",
    "CU_MEM_LOCATION_TYPE_DEVICE", "CU_MEM_ALLOCATION_TYPE_PINNED", "CU_AD_FORMAT_FLOAT",
    "CU_AD_FORMAT_HALF", "CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT",
    "CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED", "CU_LAUNCH_ATTRIBUTE_COOPERATIVE",
    "CU_MEM_ATTACH_GLOBAL", "CU_MEM_ALLOC_GRANULARITY_MINIMUM",
    "CU_STREAM_CAPTURE_STATUS_ACTIVE", "CU_STREAM_CAPTURE_STATUS_INVALIDATED",
    "CU_STREAM_CAPTURE_MODE_THREAD_LOCAL", "CU_STREAM_CAPTURE_MODE_RELAXED",
    "CU_GRAPH_NODE_TYPE_MEMSET", "CU_GRAPH_NODE_TYPE_EVENT_RECORD", "CU_GRAPH_NODE_TYPE_MEM_ALLOC",
    "CU_GRAPH_NODE_TYPE_MEM_FREE",
]


def layout_program(use_toolkit: bool) -> str:
    lines = ["#include <stdio.h>", "#include <stddef.h>"]
    if use_toolkit:
        # the toolkit's types and values; from cuda_api.h only the HAMI_CU_RESULTS name list
        lines += ["#define __CUDA_API_VERSION_INTERNAL 1", "#include <cuda.h>",
                  "#define HAMI_CHECK_AGAINST_CUDA_H 1", '#include "cuda_api.h"']
    else:
        lines += ['#include "cuda_api.h"']
    lines += ["#define PRINT_RESULT(name, value, text) printf(#name \" %d\\n\", (int)name);",
              "int main(void) {", "HAMI_CU_RESULTS(PRINT_RESULT)"]
    for struct, fields in STRUCTS.items():
        lines.append(f'printf("sizeof {struct} %zu\\n", sizeof({struct}));')
        for f in fields:
            lines.append(f'printf("offsetof {struct}.{f} %zu\\n", offsetof({struct}, {f}));')
    for name in CONSTANTS:
        lines.append(f'printf("{name} %lld\\n", (long long){name});')
    lines += ["return 0;", "}"]
    return "\n".join(lines) + "\n"


def run_layout(tmp_path, use_toolkit, cuda_h):
    src = tmp_path / f"layout_{int(use_toolkit)}.c"
    exe = tmp_path / f"layout_{int(use_toolkit)}"
    src.write_text(layout_program(use_toolkit))
    proc = subprocess.run(["gcc", "-Wall", "-Werror", f"-I{cuda_h.parent}", f"-I{INCLUDE}", "-o",
                           str(exe), str(src)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return subprocess.run([str(exe)], check=True, capture_output=True, text=True, timeout=10).stdout


def test_prototypes_match_the_toolkit(cuda_h):
    src = ("#define __CUDA_API_VERSION_INTERNAL 1\n#include <cuda.h>\n"
           "#define HAMI_CHECK_AGAINST_CUDA_H 1\n#include \"cuda_api.h\"\n")
    proc = subprocess.run(["gcc", "-Wall", "-Werror", "-x", "c", "-c", "-", f"-I{cuda_h.parent}",
                           f"-I{INCLUDE}", "-o", "/dev/null"], input=src, text=True,
                          capture_output=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


def test_layouts_and_values_match_the_toolkit(tmp_path, cuda_h):
    ours = run_layout(tmp_path, use_toolkit=False, cuda_h=cuda_h).splitlines()
    theirs = run_layout(tmp_path, use_toolkit=True, cuda_h=cuda_h).splitlines()
    assert len(ours) == len(theirs) > len(STRUCTS)
    mismatches = [(a, b) for a, b in zip(ours, theirs) if a != b]
    assert not mismatches
