"""Module images as the driver reads them: the kernels a fat binary, cubin or PTX text
holds are found and no others; a fat binary is the entry built for the device (sm_90),
compressed or not; a test image holds the test kernels; kernels of real images run the
configured kernel_us, test kernels their duration parameter."""
import ctypes
import json
import struct

import pytest

NOT_FOUND, INVALID_IMAGE, NO_BINARY_FOR_GPU = 500, 200, 209
LZ4, ZSTD = 0x2000, 0x8000
STO_CUDA_ENTRY = 0x10

PTX = b""".version 8.0
.target sm_90
.address_size 64
.visible .entry scale(.param .u64 scale_param_0) { ret; }
.entry spin(.param .u64 spin_param_0) { ret; }
"""


def elf(kernels, objects=None, helpers=()) -> bytes:
    """A 64-bit cubin-like ELF: kernels (functions marked as entry points, as nvcc marks them),
    device functions that are not entry points, and data objects {name: initial bytes} in a
    PROGBITS section."""
    objects = objects or {}
    names = [*kernels, *helpers, *objects]
    strtab = b"\0" + b"".join(n.encode() + b"\0" for n in names)
    shstrtab = b"\0.symtab\0.strtab\0.shstrtab\0.nv.global.init\0"
    data = b"".join(objects.values())
    syms, offset, at = [bytes(24)], 1, 0
    for name in names:
        if name in objects:   # STT_OBJECT, local (as a static __device__ variable is), in section 4
            syms.append(struct.pack("<IBBHQQ", offset, 1, 0, 4, at, len(objects[name])))
            at += len(objects[name])
        else:                 # STT_FUNC, global; kernels carry STO_CUDA_ENTRY
            other = STO_CUDA_ENTRY if name in kernels else 0
            syms.append(struct.pack("<IBBHQQ", offset, (1 << 4) | 2, other, 1, 0, 0))
        offset += len(name) + 1
    symtab = b"".join(syms)
    body = symtab + strtab + shstrtab + data
    shoff = 64 + len(body)
    sections = [bytes(64),
                struct.pack("<IIQQQQIIQQ", 1, 2, 0, 0, 64, len(symtab), 2, 1, 8, 24),
                struct.pack("<IIQQQQIIQQ", 9, 3, 0, 0, 64 + len(symtab), len(strtab), 0, 0, 1, 0),
                struct.pack("<IIQQQQIIQQ", 17, 3, 0, 0, 64 + len(symtab) + len(strtab), len(shstrtab), 0, 0, 1, 0),
                struct.pack("<IIQQQQIIQQ", 27, 1, 3, 0, 64 + len(symtab) + len(strtab) + len(shstrtab), len(data),
                            0, 0, 8, 0)]
    header = (b"\x7fELF\x02\x01\x01" + bytes(9) +
              struct.pack("<HHIQQQIHHHHHH", 1, 190, 1, 0, 0, shoff, 0, 64, 0, 0, 64, len(sections), 3))
    return header + body + b"".join(sections)


def compress(codec, data: bytes) -> bytes:
    """data compressed as nvcc's fat binary compression stores it, with the system's library."""
    if codec == ZSTD:
        lib = ctypes.CDLL("libzstd.so.1")
        lib.ZSTD_compressBound.restype = lib.ZSTD_compress.restype = ctypes.c_size_t
        out = ctypes.create_string_buffer(lib.ZSTD_compressBound(ctypes.c_size_t(len(data))))
        n = lib.ZSTD_compress(out, ctypes.c_size_t(len(out)), data, ctypes.c_size_t(len(data)), 3)
    else:
        lib = ctypes.CDLL("liblz4.so.1")
        out = ctypes.create_string_buffer(lib.LZ4_compressBound(len(data)))
        n = lib.LZ4_compress_default(data, out, len(data), len(out))
    return out.raw[:n]


def fatbin(entries) -> bytes:
    """A fat binary of (kind, payload, arch, codec) entries: kind 1 PTX, 2 ELF; arch 90 for sm_90;
    codec 0 (stored as it is), LZ4 or ZSTD."""
    body = b""
    for kind, payload, arch, codec in entries:
        stored = compress(codec, payload) if codec else payload
        padded = stored + bytes(-len(stored) % 8)
        body += struct.pack("<HHIQIIHHIIIQQQ", kind, 0x101, 64, len(padded), len(stored), 0, 0, 8, arch, 0, 0,
                            0x11 | codec, 0, len(payload)) + padded
    return struct.pack("<IHHQ", 0xBA55ED50, 1, 16, len(body)) + body


KERNELS = elf(["scale"], {"table": bytes(range(16))}, helpers=["device_helper"])
CASES = {
    "test image": (b"any image", ["spin", "sleep_kernel", "empty"], ["scale"]),
    "PTX text": (PTX + b"\0", ["scale", "spin"], ["empty", "scal"]),
    "cubin": (KERNELS, ["scale"], ["table", "spin", "device_helper"]),
    # the cubin built for the device is the module, not the PTX beside it
    "fat binary": (fatbin([(1, PTX, 90, 0), (2, elf(["other"]), 90, 0)]), ["other"], ["scale", "nope"]),
    # no cubin for sm_90 (an sm_80 one cannot run there): the PTX is compiled
    "fat binary, PTX only for sm_90": (fatbin([(2, elf(["old"]), 80, 0), (1, PTX, 80, 0)]), ["scale", "spin"],
                                       ["old"]),
    # of the cubins of one major version, the highest not above the device's
    "fat binary, several cubins": (fatbin([(2, elf(["v90"]), 90, 0), (2, elf(["v100"]), 100, 0)]), ["v90"],
                                   ["v100"]),
    "fat binary, Zstandard": (fatbin([(2, elf(["zstd_kernel"]), 90, ZSTD)]), ["zstd_kernel"], ["other"]),
    "fat binary, LZ4": (fatbin([(2, elf(["lz4_kernel"]), 90, LZ4)]), ["lz4_kernel"], ["other"]),
}


@pytest.mark.parametrize("case", CASES)
def test_a_module_holds_the_kernels_of_its_image(run_py, case):
    image, present, absent = CASES[case]
    out = json.loads(run_py(f"""
        import json
        c = Cuda(); c.init(0)
        image = ctypes.create_string_buffer({image!r}, {len(image) + 1})
        mod = ctypes.c_void_p()
        c.call("cuModuleLoadData", ctypes.byref(mod), image)
        found = {{}}
        for name in {present + absent!r}:
            fn = ctypes.c_void_p()
            found[name] = c.rc("cuModuleGetFunction", ctypes.byref(fn), mod, name.encode())
        print(json.dumps(found))
    """))
    assert out == {**{n: 0 for n in present}, **{n: NOT_FOUND for n in absent}}


@pytest.mark.parametrize("image, code", [
    (fatbin([(2, elf(["future"]), 100, 0)]), NO_BINARY_FOR_GPU),          # built for another GPU only
    (fatbin([(2, b"\x01" * 40, 90, 0)]), INVALID_IMAGE),                 # its cubin is not an ELF
], ids=["other GPU", "bad cubin"])
def test_a_fat_binary_the_device_cannot_run_is_refused(run_py, image, code):
    out = json.loads(run_py(f"""
        import json
        c = Cuda(); c.init(0)
        image = ctypes.create_string_buffer({image!r}, {len(image) + 1})
        print(json.dumps(c.rc("cuModuleLoadData", ctypes.byref(ctypes.c_void_p()), image)))
    """))
    assert out == code


def test_a_corrupt_compressed_entry_is_an_invalid_image(run_py):
    body = b"\x01" * 40
    image = struct.pack("<IHHQ", 0xBA55ED50, 1, 16, 64 + len(body)) + struct.pack(
        "<HHIQIIHHIIIQQQ", 2, 0x101, 64, len(body), len(body), 0, 0, 8, 90, 0, 0, 0x11 | ZSTD, 0, 4096) + body
    out = json.loads(run_py(f"""
        import json
        c = Cuda(); c.init(0)
        image = ctypes.create_string_buffer({image!r})
        print(json.dumps(c.rc("cuModuleLoadData", ctypes.byref(ctypes.c_void_p()), image)))
    """))
    assert out == INVALID_IMAGE


@pytest.mark.parametrize("codec", [0, ZSTD, LZ4], ids=["stored", "zstd", "lz4"])
def test_a_global_of_a_fat_binary_has_its_size_and_initial_data(run_py, codec):
    """What cudart's registered variables (__cudaRegisterVar) and cuBLAS's constants come to:
    cuModuleGetGlobal / cuLibraryGetGlobal find the variable in the cubin built for the device."""
    image = fatbin([(2, elf(["k"], {"first": b"\x07" * 8, "table": bytes(range(16))}), 90, codec)])
    out = json.loads(run_py(f"""
        import json
        c = Cuda(); c.init(0)
        image = ctypes.create_string_buffer({image!r})
        mod, lib = ctypes.c_void_p(), ctypes.c_void_p()
        c.call("cuModuleLoadData", ctypes.byref(mod), image)
        c.call("cuLibraryLoadData", ctypes.byref(lib), image, None, None, 0, None, None, 0)
        res = {{}}
        for name in ("table", "missing"):
            ptr, size, lptr, lsize = ctypes.c_uint64(), ctypes.c_size_t(), ctypes.c_uint64(), ctypes.c_size_t()
            rc = c.rc("cuModuleGetGlobal_v2", ctypes.byref(ptr), ctypes.byref(size), mod, name.encode())
            lrc = c.rc("cuLibraryGetGlobal", ctypes.byref(lptr), ctypes.byref(lsize), lib, name.encode())
            data = list(ctypes.string_at(ptr.value, size.value)) if rc == 0 else None
            res[name] = [rc, size.value, data, lrc, lsize.value]
        print(json.dumps(res))
    """))
    assert out == {"table": [0, 16, list(range(16)), 0, 16], "missing": [NOT_FOUND, 0, None, NOT_FOUND, 0]}


def test_the_wrapper_nvcc_emits_loads_its_fat_binary(run_py):
    image = fatbin([(1, PTX, 90, 0)])
    out = json.loads(run_py(f"""
        import json, struct
        c = Cuda(); c.init(0)
        data = ctypes.create_string_buffer({image!r})
        wrapper = ctypes.create_string_buffer(struct.pack("<IIQQ", 0x466243B1, 1, ctypes.addressof(data), 0))
        bad = ctypes.create_string_buffer(struct.pack("<IIQQ", 0x466243B1, 1, ctypes.addressof(wrapper), 0))
        mod, fn = ctypes.c_void_p(), ctypes.c_void_p()
        loaded = c.rc("cuModuleLoadData", ctypes.byref(mod), wrapper)
        print(json.dumps([loaded, c.rc("cuModuleGetFunction", ctypes.byref(fn), mod, b"scale"),
                          c.rc("cuModuleLoadData", ctypes.byref(ctypes.c_void_p()), bad)]))
    """))
    assert out == [0, 0, INVALID_IMAGE]


def test_real_kernels_run_kernel_us_and_test_kernels_their_parameter(run_py, sim_env, tmp_path):
    conf = tmp_path / "kernel.conf"
    conf.write_text("kernel_us = 60000\n")
    out = json.loads(run_py(f"""
        import json, time
        c = Cuda(); c.init(0)
        image = ctypes.create_string_buffer({PTX!r})
        mod = ctypes.c_void_p()
        c.call("cuModuleLoadData", ctypes.byref(mod), image)
        times = {{}}
        for name in ("scale", "spin"):
            fn = ctypes.c_void_p()
            c.call("cuModuleGetFunction", ctypes.byref(fn), mod, name.encode())
            arg = ctypes.c_uint64(20_000)
            params = (ctypes.c_void_p * 1)(ctypes.addressof(arg))
            t0 = time.monotonic()
            c.call("cuLaunchKernel", fn, 1, 1, 1, 32, 1, 1, 0, None, params, None)
            c.sync()
            times[name] = time.monotonic() - t0
        print(json.dumps(times))
    """, env={**sim_env, "HAMI_SIM_CONFIG": str(conf)}))
    assert 0.055 <= out["scale"] < 0.2
    assert 0.018 <= out["spin"] < 0.055
