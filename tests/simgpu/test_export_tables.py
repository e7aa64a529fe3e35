"""cuGetExportTable: the driver's private tables the CUDA runtime asks for, answered as a
driver answers them (sizes, the primary context, context-local storage kept per context
with its destructor run when the context goes)."""
import json

RUNTIME = "6bd5fb6c-5bf4-e74a-8987-d93912fd9df9"
STORAGE = "c693336e-1121-df11-a8c3-68f355d89593"


def test_tables_and_context_local_storage(run_py):
    out = json.loads(run_py(f"""
        import json
        lib = Cuda().lib
        lib.cuInit(0)

        def table(uuid):
            ident = (ctypes.c_ubyte * 16)(*bytes.fromhex(uuid.replace("-", "")))
            ptr = ctypes.c_void_p(1)
            rc = lib.cuGetExportTable(ctypes.byref(ptr), ident)
            return rc, ptr.value and ctypes.cast(ptr, ctypes.POINTER(ctypes.c_void_p))

        out = {{"unknown": table("00112233-4455-6677-8899-aabbccddeeff")[0]}}
        rc, rt = table({RUNTIME!r})
        out["runtime"] = [rc, rt[0]]
        primary_of = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_void_p), ctypes.c_int)(rt[2])
        got, retained = ctypes.c_void_p(), ctypes.c_void_p()
        out["primary"] = [primary_of(ctypes.byref(got), 0), primary_of(ctypes.byref(ctypes.c_void_p()), 99)]
        lib.cuDevicePrimaryCtxRetain(ctypes.byref(retained), 0)
        out["same_context"] = got.value == retained.value

        _, cls = table({STORAGE!r})
        Dtor = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)
        destroyed = []
        dtor = Dtor(lambda ctx, key, value: destroyed.append([ctx == retained.value, key, value]))
        put = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, Dtor)(cls[0])
        delete = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)(cls[1])
        get = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p,
                               ctypes.c_void_p)(cls[2])
        value = ctypes.c_void_p()
        out["before_put"] = get(ctypes.byref(value), retained, 7)
        out["puts"] = [put(retained, 7, 70, dtor), put(retained, 8, 80, dtor)]
        out["get"] = [get(ctypes.byref(value), retained, 7), value.value]
        out["delete"] = [delete(retained, 8), get(ctypes.byref(value), retained, 8)]
        lib.cuDevicePrimaryCtxRelease_v2(0)
        out["destroyed"] = destroyed
        print(json.dumps(out))
    """))
    assert out["unknown"] == 1                      # CUDA_ERROR_INVALID_VALUE
    assert out["runtime"] == [0, 13 * 8]            # slot 0: the table's size in bytes
    assert out["primary"] == [0, 101]               # a bad ordinal: CUDA_ERROR_INVALID_DEVICE
    assert out["same_context"]
    assert out["before_put"] == 400                 # nothing stored: CUDA_ERROR_INVALID_HANDLE
    assert out["puts"] == [0, 0]
    assert out["get"] == [0, 70]
    assert out["delete"] == [0, 400]
    assert out["destroyed"] == [[True, 7, 70]]      # the last release destroys the context
