"""What PyTorch's CUDA 13 stack asks of the driver beyond the other clients (README: "PyTorch
(CUDA 13)"), each answered as a driver answers it: VMM sharing, stream memory operations,
graph node queries, 2D copies, cluster occupancy, the CUDA 13 forms that name a context or
a pool's location, the private tables cuBLASLt reads, and the features a simulated card
does not have."""
import json
import textwrap

import pytest

NOT_SUPPORTED, INVALID_VALUE, INVALID_HANDLE, NOT_READY = 801, 1, 400, 600
INVALID_CLUSTER_SIZE, PEER_ACCESS_UNSUPPORTED, ILLEGAL_STATE = 912, 217, 401
INVALID_CONTEXT = 201
POSIX_FD = 1
MIB = 1 << 20

PROP = """
class Location(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]
class Prop(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("handle_types", ctypes.c_int), ("location", Location),
                ("win32", ctypes.c_void_p), ("flags", ctypes.c_ubyte * 8)]
class Access(ctypes.Structure):
    _fields_ = [("location", Location), ("flags", ctypes.c_int)]

def vmm(c, size, handle_types):
    prop = Prop(1, handle_types, Location(1, 0))
    h, va = ctypes.c_uint64(), ctypes.c_uint64()
    c.call("cuMemCreate", ctypes.byref(h), ctypes.c_size_t(size), ctypes.byref(prop), ctypes.c_ulonglong(0))
    c.call("cuMemAddressReserve", ctypes.byref(va), ctypes.c_size_t(size), ctypes.c_size_t(0), ctypes.c_uint64(0),
           ctypes.c_ulonglong(0))
    c.call("cuMemMap", va, ctypes.c_size_t(size), ctypes.c_size_t(0), h, ctypes.c_ulonglong(0))
    access = Access(Location(1, 0), 3)
    c.call("cuMemSetAccess", va, ctypes.c_size_t(size), ctypes.byref(access), ctypes.c_size_t(1))
    return h, va
"""


def test_vmm_memory_is_shared_by_a_file_descriptor_and_reference_counted(run_py):
    out = json.loads(run_py(PROP + textwrap.dedent(f"""
        import json
        c = Cuda(); c.init(0)
        size = 2 * {MIB}
        h, va = vmm(c, size, {POSIX_FD})
        ctypes.memmove(va.value, b"shared", 6)
        fd = ctypes.c_int()
        c.call("cuMemExportToShareableHandle", ctypes.byref(fd), h, {POSIX_FD}, ctypes.c_ulonglong(0))
        imported, va2 = ctypes.c_uint64(), ctypes.c_uint64()
        c.call("cuMemImportFromShareableHandle", ctypes.byref(imported), ctypes.c_void_p(fd.value), {POSIX_FD})
        c.call("cuMemAddressReserve", ctypes.byref(va2), ctypes.c_size_t(size), ctypes.c_size_t(0),
               ctypes.c_uint64(0), ctypes.c_ulonglong(0))
        c.call("cuMemMap", va2, ctypes.c_size_t(size), ctypes.c_size_t(0), imported, ctypes.c_ulonglong(0))
        c.call("cuMemSetAccess", va2, ctypes.c_size_t(size), ctypes.byref(Access(Location(1, 0), 3)),
               ctypes.c_size_t(1))
        seen = ctypes.string_at(va2.value, 6).decode()
        used_with_import = size - c.mem_info()[0]
        retained = ctypes.c_uint64()
        c.call("cuMemRetainAllocationHandle", ctypes.byref(retained), ctypes.c_void_p(va.value + 4096))
        prop = Prop()
        c.call("cuMemGetAllocationPropertiesFromHandle", ctypes.byref(prop), h)
        c.call("cuMemRelease", h)
        still = c.rc("cuMemGetAllocationPropertiesFromHandle", ctypes.byref(Prop()), h)   # one reference left
        c.call("cuMemRelease", h)
        gone = c.rc("cuMemGetAllocationPropertiesFromHandle", ctypes.byref(Prop()), h)
        plain, _ = vmm(c, size, 0)
        refused = c.rc("cuMemExportToShareableHandle", ctypes.byref(fd), plain, {POSIX_FD}, ctypes.c_ulonglong(0))
        fabric = c.rc("cuMemExportToShareableHandle", ctypes.byref(fd), plain, 8, ctypes.c_ulonglong(0))
        print(json.dumps({{"seen": seen, "retained": retained.value == h.value,
                           "prop": [prop.type, prop.handle_types, prop.location.type, prop.location.id],
                           "still": still, "gone": gone, "refused": refused, "fabric": fabric}}))
    """)))
    assert out == {"seen": "shared", "retained": True, "prop": [1, POSIX_FD, 1, 0], "still": 0,
                   "gone": INVALID_VALUE, "refused": INVALID_VALUE, "fabric": NOT_SUPPORTED}


def test_stream_memory_operations_run_in_stream_order(run_py):
    out = json.loads(run_py("""
        import json
        c = Cuda(); c.init(0)
        word = c.alloc(4096)
        s = c.stream()
        c.call("cuStreamWriteValue32_v2", s, ctypes.c_uint64(word), ctypes.c_uint32(7), 0)
        c.call("cuStreamWaitValue32_v2", s, ctypes.c_uint64(word + 8), ctypes.c_uint32(1), 1)  # EQ: the host's
        c.kernel(1000, s)
        time.sleep(0.05)
        waiting = c.rc("cuStreamQuery", s)
        first = ctypes.c_uint32.from_address(word).value
        ctypes.c_uint32.from_address(word + 8).value = 1
        c.sync(s)
        misaligned = c.rc("cuStreamWriteValue32_v2", s, ctypes.c_uint64(word + 2), ctypes.c_uint32(1), 0)
        print(json.dumps([first, waiting, c.rc("cuStreamQuery", s), misaligned]))
    """))
    assert out == [7, NOT_READY, 0, INVALID_VALUE]


def test_graph_nodes_can_be_read_back_and_updated(run_py):
    out = json.loads(run_py("""
        import json
        c = Cuda(); c.init(0)
        mod, fn = ctypes.c_void_p(), ctypes.c_void_p()
        c.call("cuModuleLoadData", ctypes.byref(mod), b"any image")
        c.call("cuModuleGetFunction", ctypes.byref(fn), mod, b"spin")
        class Params(ctypes.Structure):
            _fields_ = [("func", ctypes.c_void_p)] + [(n, ctypes.c_uint) for n in
                        ("gx", "gy", "gz", "bx", "by", "bz", "shared")] + [("params", ctypes.c_void_p),
                        ("extra", ctypes.c_void_p), ("kern", ctypes.c_void_p), ("ctx", ctypes.c_void_p)]
        dur = ctypes.c_uint64(1000)
        args = (ctypes.c_void_p * 1)(ctypes.addressof(dur))
        g, node = ctypes.c_void_p(), ctypes.c_void_p()
        c.call("cuGraphCreate", ctypes.byref(g), 0)
        p = Params(fn, 4, 1, 1, 32, 1, 1, 0, ctypes.cast(args, ctypes.c_void_p), None, None, None)
        c.call("cuGraphAddKernelNode_v2", ctypes.byref(node), g, None, ctypes.c_size_t(0), ctypes.byref(p))
        n, nodes = ctypes.c_size_t(0), (ctypes.c_void_p * 2)()
        c.call("cuGraphGetNodes", g, None, ctypes.byref(n))
        count = n.value
        c.call("cuGraphGetNodes", g, nodes, ctypes.byref(n))
        kind, back = ctypes.c_int(-1), Params()
        c.call("cuGraphNodeGetType", ctypes.c_void_p(nodes[0]), ctypes.byref(kind))
        c.call("cuGraphKernelNodeGetParams_v2", node, ctypes.byref(back))
        exe = ctypes.c_void_p()
        c.call("cuGraphInstantiate", ctypes.byref(exe), g, None, None, ctypes.c_size_t(0))
        dur.value = 150_000
        c.call("cuGraphExecKernelNodeSetParams_v2", exe, node, ctypes.byref(p))
        t0 = time.monotonic()
        c.call("cuGraphLaunch", exe, None)
        c.sync()
        took = time.monotonic() - t0
        print(json.dumps([count, nodes[0] == node.value, kind.value, back.func == fn.value, back.gx, back.bx,
                          back.params, took]))
    """))
    count, same, kind, func, gx, bx, params, took = out
    assert [count, same, kind, func, gx, bx, params] == [1, True, 0, True, 4, 32, None]
    assert took >= 0.14  # the exec runs the duration its node was updated to


def test_2d_copies_move_rows_at_each_sides_pitch(run_py):
    out = json.loads(run_py("""
        import json
        c = Cuda(); c.init(0)
        class Copy(ctypes.Structure):
            _fields_ = [("sx", ctypes.c_size_t), ("sy", ctypes.c_size_t), ("stype", ctypes.c_int),
                        ("shost", ctypes.c_void_p), ("sdev", ctypes.c_uint64), ("sarr", ctypes.c_void_p),
                        ("spitch", ctypes.c_size_t), ("dx", ctypes.c_size_t), ("dy", ctypes.c_size_t),
                        ("dtype", ctypes.c_int), ("dhost", ctypes.c_void_p), ("ddev", ctypes.c_uint64),
                        ("darr", ctypes.c_void_p), ("dpitch", ctypes.c_size_t), ("width", ctypes.c_size_t),
                        ("height", ctypes.c_size_t)]
        src = ctypes.create_string_buffer(b"ab..cd..ef..", 12)       # 3 rows of 2 bytes, pitch 4
        dev = c.alloc(4096)
        out = ctypes.create_string_buffer(6)
        up = Copy(0, 0, 1, ctypes.addressof(src), 0, None, 4, 1, 0, 2, None, dev, None, 16, 2, 3)
        c.call("cuMemcpy2DAsync_v2", ctypes.byref(up), None)
        down = Copy(1, 0, 2, None, dev, None, 16, 0, 0, 1, ctypes.addressof(out), 0, None, 2, 2, 3)
        c.call("cuMemcpy2D_v2", ctypes.byref(down))
        bad = Copy(0, 0, 3, None, 0, None, 4, 0, 0, 1, ctypes.addressof(out), 0, None, 2, 2, 3)  # an array
        print(json.dumps([out.raw.decode(), c.rc("cuMemcpy2D_v2", ctypes.byref(bad))]))
    """))
    assert out == ["abcdef", NOT_SUPPORTED]


@pytest.mark.parametrize("cluster, clusters", [(1, 132), (2, 66), (3, 42), (16, 8), (17, None)])
def test_clusters_are_resident_in_one_gpc(run_py, cluster, clusters):
    """One block an SM (all its shared memory): an H100 SXM's 132 SMs are GPCs of 18, 18 and six of 16."""
    out = json.loads(run_py(f"""
        import json
        c = Cuda(); c.init(0)
        mod, fn = ctypes.c_void_p(), ctypes.c_void_p()
        c.call("cuModuleLoadData", ctypes.byref(mod), b"any image")
        c.call("cuModuleGetFunction", ctypes.byref(fn), mod, b"spin")
        c.call("cuFuncSetAttribute", fn, 8, 232448)     # MAX_DYNAMIC_SHARED_SIZE_BYTES
        c.call("cuFuncSetAttribute", fn, 14, 1)         # NON_PORTABLE_CLUSTER_SIZE_ALLOWED
        class Attr(ctypes.Structure):
            _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("x", ctypes.c_uint), ("y", ctypes.c_uint),
                        ("z", ctypes.c_uint), ("rest", ctypes.c_char * 52)]
        class Config(ctypes.Structure):
            _fields_ = [(n, ctypes.c_uint) for n in ("gx", "gy", "gz", "bx", "by", "bz", "shared")] + [
                ("stream", ctypes.c_void_p), ("attrs", ctypes.POINTER(Attr)), ("n", ctypes.c_uint)]
        attr = Attr(4, b"", {cluster}, 1, 1)              # CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
        config = Config({cluster}, 1, 1, 128, 1, 1, 232448, None, ctypes.pointer(attr), 1)
        n = ctypes.c_int(-1)
        rc = c.rc("cuOccupancyMaxActiveClusters", ctypes.byref(n), fn, ctypes.byref(config))
        print(json.dumps([rc, n.value]))
    """))
    assert out == ([0, clusters] if clusters else [INVALID_CLUSTER_SIZE, out[1]])


def test_the_private_tables_cublaslt_reads_agree_with_the_public_calls(run_py):
    out = json.loads(run_py("""
        import json
        c = Cuda(); ctx = c.init(0)
        def slot(uuid, index, restype, *argtypes):
            table = ctypes.c_void_p()
            c.call("cuGetExportTable", ctypes.byref(table), ctypes.create_string_buffer(bytes.fromhex(uuid), 16))
            slots = ctypes.cast(table, ctypes.POINTER(ctypes.c_void_p))
            assert slots[0] >= (index + 1) * 8
            return ctypes.CFUNCTYPE(restype, *argtypes)(slots[index])
        current = slot("42d85a8123f6cb478298f6e78a3aecdc", 2, ctypes.c_int, ctypes.POINTER(ctypes.c_void_p))
        ident = slot("21318c60971432488ca641ff7324c8f2", 4, ctypes.c_int, ctypes.c_void_p,
                     ctypes.POINTER(ctypes.c_ulonglong))
        got, mine = ctypes.c_void_p(), ctypes.c_void_p()
        rc = current(ctypes.byref(got))
        c.call("cuCtxGetCurrent", ctypes.byref(mine))
        a, b = ctypes.c_ulonglong(), ctypes.c_ulonglong()
        rc2 = ident(got, ctypes.byref(a))
        c.call("cuCtxGetId", ctx, ctypes.byref(b))
        print(json.dumps([rc, got.value == mine.value, rc2, a.value == b.value != 0]))
    """))
    assert out == [0, True, 0, True]


def test_the_sm_layout_table_places_each_tpc_in_its_gpc(run_py):
    """cuBLASLt 13 places thread block clusters for its fp16/bf16 kernels from this table (one byte a
    TPC: its GPC) and calls through it unchecked: the layout is the one cluster occupancy uses."""
    out = json.loads(run_py("""
        import json
        c = Cuda(); c.init(0)
        table = ctypes.c_void_p()
        c.call("cuGetExportTable", ctypes.byref(table),
               ctypes.create_string_buffer(bytes.fromhex("1734dc26800d47458726c0f1e7dd8bca"), 16))
        slots = ctypes.cast(table, ctypes.POINTER(ctypes.c_void_p))
        layout = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_void_p),
                                  ctypes.POINTER(ctypes.c_size_t))(slots[4])
        release = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_size_t)(slots[13])
        buf, n = ctypes.c_void_p(), ctypes.c_size_t()
        rc = layout(ctypes.byref(buf), ctypes.byref(n))
        gpcs = list(ctypes.string_at(buf.value, n.value))
        release(buf, n)
        ctx = ctypes.c_void_p()
        c.call("cuCtxPopCurrent", ctypes.byref(ctx))
        no_context = layout(ctypes.byref(buf), ctypes.byref(n))
        print(json.dumps([slots[0], rc, [gpcs.count(g) for g in range(8)], gpcs == sorted(gpcs), no_context]))
    """))
    assert out == [14 * 8, 0, [9, 9, 8, 8, 8, 8, 8, 8], True, INVALID_CONTEXT]


def test_cuda13_forms_name_their_context_and_pool_location(run_py):
    out = json.loads(run_py("""
        import json
        c = Cuda(); ctx = c.init(0)
        dev = ctypes.c_int(-1)
        named = c.rc("cuCtxGetDevice_v2", ctypes.byref(dev), ctx)
        c.call("cuCtxPopCurrent_v2", ctypes.byref(ctypes.c_void_p()))     # no context current now
        synced = c.rc("cuCtxSynchronize_v2", ctx)
        none = c.rc("cuCtxSynchronize_v2", None)
        c.call("cuCtxSetCurrent", ctx)
        class Location(ctypes.Structure):
            _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]
        pool, default = ctypes.c_void_p(), ctypes.c_void_p()
        c.call("cuMemGetMemPool", ctypes.byref(pool), ctypes.byref(Location(1, 0)), 1)
        c.call("cuDeviceGetDefaultMemPool", ctypes.byref(default), 0)
        host = c.rc("cuMemGetMemPool", ctypes.byref(pool), ctypes.byref(Location(2, 0)), 1)
        value = ctypes.c_uint64(1)
        graph_mem = c.rc("cuDeviceGetGraphMemAttribute", 0, 0, ctypes.byref(value))
        print(json.dumps([named, dev.value, synced, none, pool.value == default.value, host, graph_mem,
                          value.value]))
    """))
    assert out == [0, 0, 0, 201, True, NOT_SUPPORTED, 0, 0]  # 201: CUDA_ERROR_INVALID_CONTEXT


@pytest.mark.parametrize("call, code", [
    ('c.rc("cuGreenCtxCreate", ctypes.byref(ctypes.c_void_p()), None, 0, 0)', NOT_SUPPORTED),
    ('c.rc("cuDeviceGetDevResource", 0, ctypes.create_string_buffer(256), 1)', NOT_SUPPORTED),
    ('c.rc("cuMulticastCreate", ctypes.byref(ctypes.c_uint64()), ctypes.create_string_buffer(64))', NOT_SUPPORTED),
    ('c.rc("cuCtxEnablePeerAccess", ctx, 0)', 101),      # its own device: CUDA_ERROR_INVALID_DEVICE
    ('c.rc("cuStreamBeginCapture_v2", None, 0)', 900),   # the legacy stream never captures: STREAM_CAPTURE_UNSUPPORTED
    ('c.rc("cuStreamEndCapture", None, ctypes.byref(ctypes.c_void_p()))', ILLEGAL_STATE),
    ('c.rc("cuLogsRegisterCallback", ctypes.CFUNCTYPE(None)(lambda: None), None, ctypes.byref(ctypes.c_void_p()))', 0),
], ids=["green context", "SM resource", "multicast", "peer access", "legacy capture", "end capture", "log callback"])
def test_features_a_simulated_card_lacks_are_refused_as_a_driver_refuses_them(run_py, call, code):
    out = json.loads(run_py(f"""
        import json
        c = Cuda(); ctx = c.init(0)
        print(json.dumps({call}))
    """))
    assert out == code


def test_a_library_image_may_be_preserved_without_option_values(run_py):
    out = json.loads(run_py("""
        import json
        c = Cuda(); c.init(0)
        lib = ctypes.c_void_p()
        options = (ctypes.c_int * 1)(1)                  # CU_LIBRARY_BINARY_IS_PRESERVED: takes no value
        ok = c.rc("cuLibraryLoadData", ctypes.byref(lib), b"any image", None, None, 0, options, None, 1)
        table = (ctypes.c_int * 1)(0)                    # the host table option needs its value
        bad = c.rc("cuLibraryLoadData", ctypes.byref(lib), b"any image", None, None, 0, table, None, 1)
        print(json.dumps([ok, bad]))
    """))
    assert out == [0, INVALID_VALUE]
