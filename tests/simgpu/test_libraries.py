"""Libraries and kernels, the JIT linker, function attributes and occupancy, page-locked
host memory, pointer attributes and copies queued on a stream: what a client reads
back is what a real driver would give."""
import json

PTX = ".version 8.0\n.target sm_90\n.address_size 64\n.visible .entry spin(.param .u64 p)\n{\n ret;\n}\n"


def test_a_library_kernel_launches_where_a_function_does(run_py):
    out = json.loads(run_py(f"""
        import json
        c = Cuda(); c.init()
        ptx = ctypes.create_string_buffer({PTX!r}.encode())
        lib, kern, fn, mod, lib_of = (ctypes.c_void_p() for _ in range(5))
        c.call("cuLibraryLoadData", ctypes.byref(lib), ptx, None, None, 0, None, None, 0)
        ctypes.memset(ptx, 0, len(ptx))            # the library keeps its own copy
        c.call("cuLibraryGetKernel", ctypes.byref(kern), lib, b"spin")
        again = ctypes.c_void_p()
        c.call("cuLibraryGetKernel", ctypes.byref(again), lib, b"spin")
        c.call("cuKernelGetFunction", ctypes.byref(fn), kern)
        c.call("cuLibraryGetModule", ctypes.byref(mod), lib)
        c.call("cuKernelGetLibrary", ctypes.byref(lib_of), kern)
        name = ctypes.c_char_p()
        c.call("cuKernelGetName", ctypes.byref(name), kern)
        name = name.value.decode()                 # valid until the library is unloaded
        dur = ctypes.c_uint64(20000)
        params = (ctypes.c_void_p * 1)(ctypes.cast(ctypes.byref(dur), ctypes.c_void_p))
        launch = c.rc("cuLaunchKernel", kern, 1, 1, 1, 32, 1, 1, 0, None, params, None)
        c.sync()
        regs = ctypes.c_int()
        attr = c.rc("cuKernelGetAttribute", ctypes.byref(regs), 4, kern, 0)
        c.call("cuLibraryUnload", lib)
        after = c.rc("cuLaunchKernel", kern, 1, 1, 1, 32, 1, 1, 0, None, params, None)
        print(json.dumps({{"same": again.value == kern.value, "lib": lib_of.value == lib.value,
                           "name": name, "launch": launch, "attr": attr,
                           "regs": regs.value, "fn": bool(fn.value), "mod": bool(mod.value),
                           "after_unload": after}}))
    """))
    assert out["same"] and out["lib"] and out["fn"] and out["mod"]
    assert out["name"] == "spin"
    assert out["launch"] == 0
    assert out["attr"] == 0 and out["regs"] > 0
    assert out["after_unload"] == 400  # CUDA_ERROR_INVALID_HANDLE


def test_a_library_lists_its_kernels_and_refuses_a_bad_image(run_py):
    two = PTX + ".visible .entry other(.param .u64 p)\n{\n ret;\n}\n"
    out = json.loads(run_py(f"""
        import json, struct
        c = Cuda(); c.call("cuInit", 0)              # no context: libraries do not need one
        lib = ctypes.c_void_p()
        c.call("cuLibraryLoadData", ctypes.byref(lib), {two!r}.encode(), None, None, 0, None, None, 0)
        count = ctypes.c_uint()
        c.call("cuLibraryGetKernelCount", ctypes.byref(count), lib)
        kernels = (ctypes.c_void_p * 4)()
        c.call("cuLibraryEnumerateKernels", kernels, count.value, lib)
        names = []
        for k in kernels[:count.value]:
            name = ctypes.c_char_p()
            c.call("cuKernelGetName", ctypes.byref(name), ctypes.c_void_p(k))
            names.append(name.value.decode())
        wrapper = ctypes.create_string_buffer(16)
        struct.pack_into("<IIQ", wrapper, 0, 0x466243B1, 1, ctypes.addressof(wrapper))
        bad = c.rc("cuLibraryLoadData", ctypes.byref(ctypes.c_void_p()), wrapper, None, None, 0, None, None, 0)
        print(json.dumps({{"count": count.value, "names": sorted(names), "bad": bad}}))
    """))
    assert out == {"count": 2, "names": ["other", "spin"], "bad": 200}  # CUDA_ERROR_INVALID_IMAGE


def test_library_globals_have_their_declared_size(run_py):
    ptx = PTX + ".visible .global .align 4 .u32 counter;\n.global .align 8 .b8 table[24];\n"
    out = json.loads(run_py(f"""
        import json
        c = Cuda(); c.init()
        lib = ctypes.c_void_p()
        c.call("cuLibraryLoadData", ctypes.byref(lib), {ptx!r}.encode(), None, None, 0, None, None, 0)
        res = {{}}
        for name in ("counter", "table", "missing"):
            ptr, size = ctypes.c_uint64(), ctypes.c_size_t()
            rc = c.rc("cuLibraryGetGlobal", ctypes.byref(ptr), ctypes.byref(size), lib, name.encode())
            again = ctypes.c_uint64()
            c.rc("cuLibraryGetGlobal", ctypes.byref(again), None, lib, name.encode())
            zero = ctypes.string_at(ptr.value, size.value) == bytes(size.value) if rc == 0 else None
            res[name] = [rc, size.value, again.value == ptr.value, zero]
        c.call("cuLibraryUnload", lib)
        print(json.dumps(res))
    """))
    assert out == {"counter": [0, 4, True, True], "table": [0, 24, True, True], "missing": [500, 0, True, None]}


def test_linking_gives_back_the_image_until_destroyed(run_py):
    out = json.loads(run_py(f"""
        import json
        c = Cuda(); c.init()
        results = {{}}
        for name, inputs in (("ptx", [(1, {PTX!r}.encode() + b"\\0")]),
                             ("cubin", [(0, b"\\x7fELF" + bytes(60))]),
                             ("two_cubins", [(0, b"\\x7fELF" + bytes(60))] * 2)):
            state = ctypes.c_void_p()
            c.call("cuLinkCreate_v2", 0, None, None, ctypes.byref(state))
            for kind, data in inputs:
                c.call("cuLinkAddData_v2", state, kind, data, len(data), b"in", 0, None, None)
            image, size = ctypes.c_void_p(), ctypes.c_size_t()
            rc = c.rc("cuLinkComplete", state, ctypes.byref(image), ctypes.byref(size))
            got = ctypes.string_at(image, size.value) if rc == 0 else b""
            first = inputs[0][1]
            # PTX comes back as text (NUL-terminated), a cubin byte for byte
            results[name] = [rc, got.rstrip(b"\\0\\n") == first.rstrip(b"\\0\\n") if first[:4] != b"\\x7fELF"
                             else got == first]
            c.call("cuLinkDestroy", state)
        print(json.dumps(results))
    """))
    assert out == {"ptx": [0, True], "cubin": [0, True], "two_cubins": [801, False]}


def test_function_attributes_and_occupancy(run_py):
    out = json.loads(run_py(f"""
        import json
        c = Cuda(); c.init()
        mod, fn = ctypes.c_void_p(), ctypes.c_void_p()
        c.call("cuModuleLoadData", ctypes.byref(mod), {PTX!r}.encode())
        c.call("cuModuleGetFunction", ctypes.byref(fn), mod, b"spin")
        def attr(a):
            v = ctypes.c_int(); c.call("cuFuncGetAttribute", ctypes.byref(v), a, fn); return v.value
        before = attr(8)
        c.call("cuFuncSetAttribute", fn, 8, 100 * 1024)
        bad = c.rc("cuFuncSetAttribute", fn, 4, 64)    # NUM_REGS is not settable
        blocks = ctypes.c_int()
        c.call("cuOccupancyMaxActiveBlocksPerMultiprocessor", ctypes.byref(blocks), fn, 256, ctypes.c_size_t(0))
        grid, block = ctypes.c_int(), ctypes.c_int()
        c.call("cuOccupancyMaxPotentialBlockSize", ctypes.byref(grid), ctypes.byref(block), fn, None,
               ctypes.c_size_t(0), 0)
        sms = ctypes.c_int(); c.call("cuDeviceGetAttribute", ctypes.byref(sms), 16, 0)
        print(json.dumps({{"max_threads": attr(0), "before": before, "after": attr(8), "bad": bad,
                          "blocks": blocks.value, "grid": grid.value, "block": block.value, "sms": sms.value}}))
    """))
    assert out["max_threads"] == 1024 and out["before"] == 49152 and out["after"] == 100 * 1024
    assert out["bad"] == 1
    assert out["blocks"] == 8                       # 2048 threads an SM
    assert out["block"] * out["grid"] == 2048 * out["sms"]


def test_pointer_attributes_of_device_host_and_unknown_memory(run_py):
    out = json.loads(run_py("""
        import json
        c = Cuda(); ctx = c.init()
        dev = c.alloc(3 << 20)
        host = ctypes.c_void_p()
        c.call("cuMemHostAlloc", ctypes.byref(host), ctypes.c_size_t(8192), 2)
        buf = ctypes.create_string_buffer(4096)
        c.call("cuMemHostRegister_v2", buf, ctypes.c_size_t(4096), 0)
        twice = c.rc("cuMemHostRegister_v2", buf, ctypes.c_size_t(4096), 0)
        around = ctypes.create_string_buffer(3 * 4096)
        c.call("cuMemHostUnregister", buf)
        c.call("cuMemHostRegister_v2", ctypes.byref(around, 4096), ctypes.c_size_t(4096), 0)
        covering = c.rc("cuMemHostRegister_v2", around, ctypes.c_size_t(3 * 4096), 0)
        c.call("cuMemHostUnregister", ctypes.byref(around, 4096))
        c.call("cuMemHostRegister_v2", buf, ctypes.c_size_t(4096), 0)
        def get(attr, ptr, ctype):
            v = ctype(); rc = c.rc("cuPointerGetAttribute", ctypes.byref(v), attr, ctypes.c_uint64(ptr))
            return v.value if rc == 0 else -rc
        inner = dev + 4096
        res = {"dev_type": get(2, inner, ctypes.c_uint), "dev_start": get(11, inner, ctypes.c_uint64) == dev,
               "dev_size": get(12, inner, ctypes.c_size_t), "dev_ord": get(9, inner, ctypes.c_int),
               "dev_ctx": get(1, inner, ctypes.c_void_p) == ctx.value, "dev_host": get(4, inner, ctypes.c_void_p),
               "host_type": get(2, host.value + 100, ctypes.c_uint),
               "host_size": get(12, host.value + 100, ctypes.c_size_t),
               "reg_type": get(2, ctypes.addressof(buf), ctypes.c_uint), "twice": twice, "covering": covering,
               "unknown": get(2, 0x1234, ctypes.c_uint)}
        base, size = ctypes.c_uint64(), ctypes.c_size_t()
        c.call("cuMemGetAddressRange_v2", ctypes.byref(base), ctypes.byref(size), ctypes.c_uint64(inner))
        res["range"] = [base.value == dev, size.value]
        res["no_range"] = c.rc("cuMemGetAddressRange_v2", ctypes.byref(base), ctypes.byref(size),
                               ctypes.c_uint64(0x1234))
        kinds = (ctypes.c_int * 2)(2, 1)
        mtype, mctx = ctypes.c_uint(7), ctypes.c_void_p(7)
        data = (ctypes.c_void_p * 2)(ctypes.cast(ctypes.byref(mtype), ctypes.c_void_p),
                                     ctypes.cast(ctypes.byref(mctx), ctypes.c_void_p))
        res["many_rc"] = c.rc("cuPointerGetAttributes", 2, kinds, data, ctypes.c_uint64(0x1234))
        res["many"] = [mtype.value, mctx.value]
        dptr = ctypes.c_uint64()
        c.call("cuMemHostGetDevicePointer_v2", ctypes.byref(dptr), host, 0)
        res["mapped_same"] = dptr.value == host.value
        c.call("cuMemHostUnregister", buf)
        res["unregister_again"] = c.rc("cuMemHostUnregister", buf)
        c.call("cuMemFreeHost", host)
        res["freed_host"] = get(2, host.value, ctypes.c_uint)
        print(json.dumps(res))
    """))
    assert out == {"dev_type": 2, "dev_start": True, "dev_size": 3 << 20, "dev_ord": 0, "dev_ctx": True,
                   "dev_host": -1, "host_type": 1, "host_size": 8192, "reg_type": 1, "twice": 712, "covering": 712,
                   "unknown": -1, "many_rc": 0, "many": [0, None], "mapped_same": True,
                   "unregister_again": 713, "freed_host": -1, "range": [True, 3 << 20], "no_range": 500}


def test_copies_on_a_stream_run_in_order(run_py):
    out = json.loads(run_py("""
        import json
        c = Cuda(); c.init()
        a, b = c.alloc(1 << 20), c.alloc(1 << 20)
        s = c.stream()
        src = ctypes.create_string_buffer(b"x" * 4096)
        c.call("cuMemcpyHtoDAsync_v2", ctypes.c_uint64(a), src, ctypes.c_size_t(4096), s)
        ctypes.memset(src, ord("y"), 4096)          # taken when queued
        c.call("cuMemsetD8Async", ctypes.c_uint64(a + 100), 0x7a, ctypes.c_size_t(10), s)
        c.call("cuMemcpyDtoDAsync_v2", ctypes.c_uint64(b), ctypes.c_uint64(a), ctypes.c_size_t(4096), s)
        dst = ctypes.create_string_buffer(4096)
        c.call("cuMemcpyDtoHAsync_v2", dst, ctypes.c_uint64(b), ctypes.c_size_t(4096), s)
        c.sync(s)
        sync_copy = ctypes.create_string_buffer(16)
        c.call("cuMemcpyDtoD_v2", ctypes.c_uint64(a), ctypes.c_uint64(b + 96), ctypes.c_size_t(16))
        c.call("cuMemcpyDtoH_v2", sync_copy, ctypes.c_uint64(a), ctypes.c_size_t(16))
        bad = c.rc("cuMemcpyHtoDAsync_v2", ctypes.c_uint64(0x1000), src, ctypes.c_size_t(16), s)
        print(json.dumps({"got": dst.raw[96:112].decode(), "sync": sync_copy.raw.decode(), "bad": bad}))
    """))
    assert out == {"got": "xxxxzzzzzzzzzzxx", "sync": "xxxxzzzzzzzzzzxx", "bad": 1}
