"""region.py's two ways to the layout: the module make build writes from
region.h, and parsing region.h at run time; both from the same header."""
import importlib.util
import json
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT

HEADER = ROOT / "libvgpu_src" / "region.h"
PREBUILT = ROOT / "hami_runtime" / "node" / "_region_ffi.py"
STRUCTS = ("struct hami_region", "struct hami_device_limit", "struct hami_sm_state",
           "struct hami_proc_slot")
CONSTS = ("HAMI_REGION_MAGIC", "HAMI_REGION_VERSION", "HAMI_MAX_DEVICES", "HAMI_MAX_PROCS",
          "HAMI_UUID_LEN", "HAMI_REGION_READY", "HAMI_POLICY_FORCE")

# What a fresh interpreter loaded in a create's trace: which ffi, whether the
# parser came in, and what the trace noted.
PROBE = (
    "import json, sys; from hami_runtime import phases; trace = phases.begin(); "
    "from hami_runtime.node import region; "
    "print(json.dumps({'prebuilt': region.prebuilt(), "
    "'pycparser': 'pycparser' in sys.modules, 'size': region.REGION_SIZE, "
    "'version': region.VERSION, 'notes': trace.notes}))"
)
PARSED_NOTE = "the region layout parsed from its header (no module from make build matches it)"


def probe(env_extra=None):
    env = {k: v for k, v in os.environ.items() if k != "HAMI_REGION_HEADER"}
    env.update(env_extra or {})
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=60, check=True).stdout
    return json.loads(out)


def layout(ffi):
    consts = ffi.dlopen(None)
    return ({name: ffi.sizeof(name) for name in STRUCTS},
            {name: getattr(consts, name) for name in CONSTS},
            ffi.offsetof("struct hami_region", "procs"))


def load_module(path):
    spec = importlib.util.spec_from_file_location("region_ffi_under_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_build_writes_the_module_and_import_skips_the_parser():
    assert PREBUILT.is_file(), "run `make build` first: it writes hami_runtime/node/_region_ffi.py"
    seen = probe()
    assert seen["prebuilt"] and not seen["pycparser"] and seen["notes"] == []


def test_a_different_header_is_parsed_instead(tmp_path):
    header = tmp_path / "region.h"
    header.write_bytes(HEADER.read_bytes() + b"/* a later edit */\n")
    seen = probe({"HAMI_REGION_HEADER": str(header)})
    assert not seen["prebuilt"] and seen["pycparser"]
    assert seen["notes"] == [PARSED_NOTE]  # a create's trace says where its ~30 ms went
    assert seen["size"] == probe()["size"]


@pytest.mark.parametrize("edit", [b"", b"/* one more line */\n"])
def test_emitted_module_has_the_parsed_layout(tmp_path, edit):
    from hami_runtime.node import region
    header = tmp_path / "region.h"
    header.write_bytes(HEADER.read_bytes() + edit)
    out = tmp_path / "emitted.py"
    region.emit_module(out, header)
    module = load_module(out)
    assert module.HEADER_TEXT == header.read_bytes()
    assert layout(module.ffi) == layout(region._parsed_ffi(header.read_bytes()))
    assert not list(tmp_path.glob(".*.tmp"))


def test_a_module_from_another_header_is_not_used(monkeypatch, tmp_path):
    from hami_runtime.node import region
    header = tmp_path / "region.h"
    text = HEADER.read_bytes().replace(b"#define HAMI_MAX_PROCS", b"#define HAMI_MAX_PROCS_OLD 1\n"
                                       b"#define HAMI_MAX_PROCS", 1)
    header.write_bytes(text)
    out = tmp_path / "_region_ffi.py"
    region.emit_module(out, header)
    import hami_runtime.node
    emitted = load_module(out)
    monkeypatch.setitem(sys.modules, "hami_runtime.node._region_ffi", emitted)
    monkeypatch.setattr(hami_runtime.node, "_region_ffi", emitted, raising=False)
    assert region._prebuilt_ffi(text) is not None
    assert region._prebuilt_ffi(HEADER.read_bytes()) is None


def test_no_module_means_parsing(monkeypatch):
    import hami_runtime.node
    from hami_runtime.node import region
    monkeypatch.delattr(hami_runtime.node, "_region_ffi", raising=False)
    monkeypatch.setitem(sys.modules, "hami_runtime.node._region_ffi", None)  # as if never built
    assert region._prebuilt_ffi(HEADER.read_bytes()) is None
    assert region._load_ffi().sizeof("struct hami_region") == region.REGION_SIZE
