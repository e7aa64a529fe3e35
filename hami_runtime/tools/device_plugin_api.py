"""The kubelet's device-plugin API (v1beta1) for hamictl device-plugin: the
messages compiled from device_plugin_v1beta1.proto, and the gRPC handlers and
stubs made from them by method path (no generated service code).

`make build` writes the messages as _device_plugin_pb2.py (not kept in git);
where that module is missing or older than the .proto, the .proto is compiled
at first use (grpcio-tools) in a temporary dir, removed once imported."""
from __future__ import annotations

import importlib
import os
import shutil
import sys
import tempfile
from pathlib import Path

from ..errors import HamiError

VERSION = "v1beta1"
PROTO = Path(__file__).with_name("device_plugin_v1beta1.proto")
GENERATED = Path(__file__).with_name("_device_plugin_pb2.py")
REGISTRATION = f"/{VERSION}.Registration/"
PLUGIN = f"{VERSION}.DevicePlugin"
HEALTHY, UNHEALTHY = "Healthy", "Unhealthy"

_loaded = {}


def _compile(out_dir: str) -> Path:
    try:
        from grpc_tools import protoc
    except ImportError:
        raise HamiError("device plugin", str(PROTO), "no compiled messages (run `make build`) and no "
                        "grpcio-tools to compile them") from None
    status = protoc.main(["protoc", f"-I{PROTO.parent}", f"--python_out={out_dir}", str(PROTO)])
    made = Path(out_dir) / (PROTO.stem + "_pb2.py")
    if status != 0 or not made.is_file():
        raise HamiError("device plugin", str(PROTO), f"protoc failed ({status})")
    return made


def emit_module(target: str) -> None:
    """make build: the compiled messages at `target`, replaced atomically."""
    with tempfile.TemporaryDirectory(prefix="hami-dp-") as tmp:
        made = _compile(tmp)
        staged = Path(target).with_name(f".{Path(target).name}.tmp")
        shutil.copyfile(made, staged)
        os.replace(staged, target)


def _fresh() -> bool:
    try:
        return not PROTO.exists() or GENERATED.stat().st_mtime >= PROTO.stat().st_mtime
    except FileNotFoundError:
        return False


def messages():
    """The v1beta1 message classes (a module), once per process."""
    if "pb2" not in _loaded:
        try:
            import google.protobuf  # noqa: F401
            import grpc  # noqa: F401
        except ImportError as exc:
            raise HamiError("device plugin", exc.name or "grpc",
                            "not installed (pip install 'hami-runtime[k8s]')") from None
        if _fresh():
            _loaded["pb2"] = importlib.import_module(f"{__package__}._device_plugin_pb2")
        else:
            tmp = tempfile.mkdtemp(prefix="hami-dp-")
            try:
                _compile(tmp)
                sys.path.insert(0, tmp)
                try:
                    _loaded["pb2"] = importlib.import_module(PROTO.stem + "_pb2")
                finally:
                    sys.path.remove(tmp)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
    return _loaded["pb2"]


def unary(function, request: str, response: str):
    import grpc
    pb = messages()
    return grpc.unary_unary_rpc_method_handler(
        function, request_deserializer=getattr(pb, request).FromString,
        response_serializer=getattr(pb, response).SerializeToString)


def stream(function, request: str, response: str):
    import grpc
    pb = messages()
    return grpc.unary_stream_rpc_method_handler(
        function, request_deserializer=getattr(pb, request).FromString,
        response_serializer=getattr(pb, response).SerializeToString)


def plugin_handler(servicer):
    """The DevicePlugin service of `servicer` (an object with its five methods)."""
    import grpc
    return grpc.method_handlers_generic_handler(PLUGIN, {
        "GetDevicePluginOptions": unary(servicer.GetDevicePluginOptions, "Empty", "DevicePluginOptions"),
        "ListAndWatch": stream(servicer.ListAndWatch, "Empty", "ListAndWatchResponse"),
        "GetPreferredAllocation": unary(servicer.GetPreferredAllocation, "PreferredAllocationRequest",
                                        "PreferredAllocationResponse"),
        "Allocate": unary(servicer.Allocate, "AllocateRequest", "AllocateResponse"),
        "PreStartContainer": unary(servicer.PreStartContainer, "PreStartContainerRequest",
                                   "PreStartContainerResponse"),
    })


def registration_handler(register):
    """The kubelet's Registration service around `register(request, context)`
    (a stand-in kubelet's)."""
    import grpc
    return grpc.method_handlers_generic_handler(f"{VERSION}.Registration", {
        "Register": unary(register, "RegisterRequest", "Empty")})


def stub(channel, service: str, method: str, request: str, response: str, streaming: bool = False):
    """A callable for `method` of `service` (REGISTRATION, or PLUGIN) on `channel`."""
    pb = messages()
    path = (service if service.startswith("/") else f"/{service}/") + method
    make = channel.unary_stream if streaming else channel.unary_unary
    return make(path, request_serializer=getattr(pb, request).SerializeToString,
                response_deserializer=getattr(pb, response).FromString)
