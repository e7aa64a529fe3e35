"""Module images as the driver reads them: the kernels a fat binary, cubin or PTX text
holds are found and no others; a test image holds the test kernels; kernels of real
images run the configured kernel_us, test kernels their duration parameter."""
import json
import struct

import pytest

NOT_FOUND, INVALID_IMAGE = 500, 200

PTX = b""".version 8.0
.target sm_90
.address_size 64
.visible .entry scale(.param .u64 scale_param_0) { ret; }
.entry spin(.param .u64 spin_param_0) { ret; }
"""


def elf(functions, objects=()) -> bytes:
    """A 64-bit ELF relocatable whose symbol table holds global functions and data objects."""
    strtab = b"\0" + b"".join(n.encode() + b"\0" for n in (*functions, *objects))
    shstrtab = b"\0.symtab\0.strtab\0.shstrtab\0"
    syms, offset = [bytes(24)], 1
    for kind, names in ((2, functions), (1, objects)):  # STT_FUNC, STT_OBJECT; STB_GLOBAL
        for name in names:
            syms.append(struct.pack("<IBBHQQ", offset, (1 << 4) | kind, 0, 1, 0, 0))
            offset += len(name) + 1
    symtab = b"".join(syms)
    body = symtab + strtab + shstrtab
    shoff = 64 + len(body)
    sections = [bytes(64),
                struct.pack("<IIQQQQIIQQ", 1, 2, 0, 0, 64, len(symtab), 2, 1, 8, 24),
                struct.pack("<IIQQQQIIQQ", 9, 3, 0, 0, 64 + len(symtab), len(strtab), 0, 0, 1, 0),
                struct.pack("<IIQQQQIIQQ", 17, 3, 0, 0, 64 + len(symtab) + len(strtab), len(shstrtab), 0, 0, 1, 0)]
    header = (b"\x7fELF\x02\x01\x01" + bytes(9) +
              struct.pack("<HHIQQQIHHHHHH", 1, 190, 1, 0, 0, shoff, 0, 64, 0, 0, 64, len(sections), 3))
    return header + body + b"".join(sections)


def fatbin(entries) -> bytes:
    """A fat binary of (kind, payload, flags) entries: 1 PTX, 2 ELF."""
    body = b""
    for kind, payload, flags in entries:
        payload += bytes(-len(payload) % 8)
        body += struct.pack("<HHIQIIHHIIIQQQ", kind, 0x101, 64, len(payload), 0, 0, 0, 8, 90, 0, 0,
                            flags, 0, len(payload)) + payload
    return struct.pack("<IHHQ", 0xBA55ED50, 1, 16, len(body)) + body


CASES = {
    "test image": (b"any image", ["spin", "sleep_kernel", "empty"], ["scale"]),
    "PTX text": (PTX + b"\0", ["scale", "spin"], ["empty", "scal"]),
    "cubin": (elf(["scale"], ["table"]), ["scale"], ["table", "spin"]),
    "fat binary": (fatbin([(1, PTX, 0x11), (2, elf(["other"]), 0x11)]), ["scale", "spin", "other"], ["nope"]),
    "compressed fat binary": (fatbin([(2, b"\x01" * 40, 0x2011)]), ["anything"], []),
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


def test_the_wrapper_nvcc_emits_loads_its_fat_binary(run_py):
    image = fatbin([(1, PTX, 0x11)])
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
