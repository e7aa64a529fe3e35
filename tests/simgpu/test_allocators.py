"""Pools keep their reservation, VMM takes physical memory by granule, arrays take their size."""
import json
import textwrap

POOL_HELPERS = """
import json
c = Cuda(); c.init(0)
base = c.mem_info()[0]
used = lambda: (base - c.mem_info()[0]) >> 20
def attr(pool, a):
    v = ctypes.c_uint64(); c.call("cuMemPoolGetAttribute", pool, a, ctypes.byref(v)); return v.value >> 20
RESERVED, USED = 5, 7
"""


def test_default_pool_keeps_reservation_until_sync_or_trim(run_py):
    out = json.loads(run_py(POOL_HELPERS + textwrap.dedent("""
        pool = ctypes.c_void_p(); c.call("cuDeviceGetDefaultMemPool", ctypes.byref(pool), 0)
        s = c.stream()
        p = ctypes.c_uint64(); c.call("cuMemAllocAsync", ctypes.byref(p), ctypes.c_size_t(10 << 20), s)
        after_alloc = [used(), attr(pool, RESERVED), attr(pool, USED)]
        c.call("cuMemFreeAsync", p, s)
        c.call("cuMemAllocAsync", ctypes.byref(p), ctypes.c_size_t(100 << 20), s)
        grown = [used(), attr(pool, RESERVED), attr(pool, USED)]
        c.call("cuMemFreeAsync", p, s)
        keep = ctypes.c_uint64(1 << 62); c.call("cuMemPoolSetAttribute", pool, 4, ctypes.byref(keep))
        c.sync(s)
        kept = [used(), attr(pool, RESERVED), attr(pool, USED)]
        c.call("cuMemPoolTrimTo", pool, ctypes.c_size_t(0))
        trimmed = [used(), attr(pool, RESERVED)]
        keep.value = 0; c.call("cuMemPoolSetAttribute", pool, 4, ctypes.byref(keep))
        c.call("cuMemAllocAsync", ctypes.byref(p), ctypes.c_size_t(1 << 20), s); c.call("cuMemFreeAsync", p, s)
        c.sync(s)
        released = [used(), attr(pool, RESERVED)]
        print(json.dumps([after_alloc, grown, kept, trimmed, released]))
    """)))
    after_alloc, grown, kept, trimmed, released = out
    assert after_alloc == [32, 32, 10]        # one 32 MiB granule reserved and charged
    assert grown == [128, 128, 100]           # 10 MiB freed in stream order, 100 MiB needs 4 granules
    assert kept == [128, 128, 0]              # above the release threshold: kept reserved
    assert trimmed == [0, 0]
    assert released == [0, 0]                 # threshold 0: given back at the sync


def test_created_pool_reserves_and_destroy_gives_back(run_py):
    out = json.loads(run_py(POOL_HELPERS + textwrap.dedent("""
        class Props(ctypes.Structure):
            _fields_ = [("allocType", ctypes.c_int), ("handleTypes", ctypes.c_int), ("locType", ctypes.c_int),
                        ("locId", ctypes.c_int), ("win32", ctypes.c_void_p), ("maxSize", ctypes.c_size_t),
                        ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 54)]
        pool = ctypes.c_void_p()
        bad = c.rc("cuMemPoolCreate", ctypes.byref(pool), ctypes.byref(Props(1, 0, 1, 7)))
        c.call("cuMemPoolCreate", ctypes.byref(pool), ctypes.byref(Props(1, 0, 1, 0)))
        p = ctypes.c_uint64()
        c.call("cuMemAllocFromPoolAsync", ctypes.byref(p), ctypes.c_size_t(40 << 20), pool, None)
        c.call("cuMemsetD8_v2", p, 7, ctypes.c_size_t(40 << 20))
        during = used()
        c.call("cuMemPoolDestroy", pool)
        # the outstanding allocation keeps the pool's memory until it is freed
        after_destroy = [used(), c.rc("cuMemsetD8_v2", p, 1, ctypes.c_size_t(16))]
        c.call("cuMemFree_v2", p)
        print(json.dumps([bad, during, after_destroy, used(), c.rc("cuMemFree_v2", p),
                          c.rc("cuMemPoolDestroy", pool), c.rc("cuMemPoolTrimTo", pool, ctypes.c_size_t(0))]))
    """)))
    assert out == [1, 64, [64, 0], 0, 1, 1, 1]


def test_vmm_takes_granules_and_gives_them_back_once_unmapped(run_py):
    out = json.loads(run_py("""
        import json
        class Prop(ctypes.Structure):
            _fields_ = [("type", ctypes.c_int), ("handleTypes", ctypes.c_int), ("locType", ctypes.c_int),
                        ("locId", ctypes.c_int), ("win32", ctypes.c_void_p), ("flags", ctypes.c_ubyte * 8)]
        class Access(ctypes.Structure):
            _fields_ = [("locType", ctypes.c_int), ("locId", ctypes.c_int), ("flags", ctypes.c_int)]
        c = Cuda(); c.init(0)
        base = c.mem_info()[0]
        used = lambda: (base - c.mem_info()[0]) >> 20
        prop = Prop(1, 0, 1, 0)
        g = ctypes.c_size_t(); c.call("cuMemGetAllocationGranularity", ctypes.byref(g), ctypes.byref(prop), 0)
        h = ctypes.c_uint64()
        unaligned = c.rc("cuMemCreate", ctypes.byref(h), ctypes.c_size_t(3 << 20), ctypes.byref(prop), ctypes.c_ulonglong(0))
        c.call("cuMemCreate", ctypes.byref(h), ctypes.c_size_t(64 << 20), ctypes.byref(prop), ctypes.c_ulonglong(0))
        created = used()
        va = ctypes.c_uint64()
        c.call("cuMemAddressReserve", ctypes.byref(va), ctypes.c_size_t(64 << 20), ctypes.c_size_t(0), ctypes.c_uint64(0), ctypes.c_ulonglong(0))
        reserved = used()
        c.call("cuMemMap", va, ctypes.c_size_t(64 << 20), ctypes.c_size_t(0), h, ctypes.c_ulonglong(0))
        before_access = c.rc("cuMemsetD8_v2", va, 1, ctypes.c_size_t(16))
        acc = Access(1, 0, 3)
        c.call("cuMemSetAccess", va, ctypes.c_size_t(64 << 20), ctypes.byref(acc), ctypes.c_size_t(1))
        data = (ctypes.c_char * 5)(*b"hello"); back = ctypes.create_string_buffer(5)
        c.call("cuMemcpyHtoD_v2", ctypes.c_uint64(va.value + (40 << 20)), data, ctypes.c_size_t(5))
        c.call("cuMemcpyDtoH_v2", back, ctypes.c_uint64(va.value + (40 << 20)), ctypes.c_size_t(5))
        c.call("cuMemRelease", h)
        released_while_mapped = used()
        c.call("cuMemUnmap", va, ctypes.c_size_t(64 << 20))
        unmapped = used()
        c.call("cuMemAddressFree", va, ctypes.c_size_t(64 << 20))
        print(json.dumps([g.value >> 20, unaligned, created, reserved, before_access, back.raw.decode(),
                          released_while_mapped, unmapped, c.rc("cuMemRelease", h)]))
    """))
    assert out == [2, 1, 64, 64, 1, "hello", 64, 0, 1]


def test_arrays_take_their_size(run_py):
    out = json.loads(run_py("""
        import json
        class Desc(ctypes.Structure):
            _fields_ = [("Width", ctypes.c_size_t), ("Height", ctypes.c_size_t), ("Format", ctypes.c_int),
                        ("NumChannels", ctypes.c_uint)]
        class Desc3(ctypes.Structure):
            _fields_ = [("Width", ctypes.c_size_t), ("Height", ctypes.c_size_t), ("Depth", ctypes.c_size_t),
                        ("Format", ctypes.c_int), ("NumChannels", ctypes.c_uint), ("Flags", ctypes.c_uint)]
        c = Cuda(); c.init(0)
        base = c.mem_info()[0]
        used = lambda: (base - c.mem_info()[0]) >> 20
        a, b = ctypes.c_void_p(), ctypes.c_void_p()
        c.call("cuArrayCreate_v2", ctypes.byref(a), ctypes.byref(Desc(4096, 4096, 0x20, 4)))   # 256 MiB
        two_d = used()
        c.call("cuArray3DCreate_v2", ctypes.byref(b), ctypes.byref(Desc3(1024, 1024, 10, 0x01, 2, 0)))  # 20 MiB
        three_d = used()
        bad = [c.rc("cuArrayCreate_v2", ctypes.byref(a), ctypes.byref(Desc(16, 16, 0x20, 3))),
               c.rc("cuArrayCreate_v2", ctypes.byref(a), ctypes.byref(Desc(1 << 20, 1 << 20, 0x20, 4)))]
        c.call("cuArrayDestroy", b)
        print(json.dumps([two_d, three_d, bad, used(), c.rc("cuArrayDestroy", b)]))
    """))
    assert out == [256, 276, [1, 2], 256, 400]
