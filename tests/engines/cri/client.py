"""A minimal CRI client (the kubelet's side) over a unix socket, from
runtime_v1_subset.proto compiled at test time (grpcio-tools; no generated code
is kept in the tree)."""
import importlib
import sys
from pathlib import Path

import grpc
from grpc_tools import protoc

PROTO = Path(__file__).with_name("runtime_v1_subset.proto")
PACKAGE = "/runtime.v1."


def compile_messages(out_dir: Path):
    """Compiles the proto into out_dir and imports it."""
    status = protoc.main(["protoc", f"-I{PROTO.parent}", f"--python_out={out_dir}", str(PROTO)])
    if status != 0:
        raise RuntimeError(f"protoc failed on {PROTO} ({status})")
    sys.path.insert(0, str(out_dir))
    try:
        return importlib.import_module(PROTO.stem + "_pb2")
    finally:
        sys.path.remove(str(out_dir))


class RuntimeService:
    def __init__(self, socket: Path, messages, timeout: float = 60):
        self.messages = messages
        self.timeout = timeout
        self.channel = grpc.insecure_channel(f"unix://{socket}")

    def call(self, method: str, service: str = "RuntimeService", **fields):
        """One unary call of `service` (RuntimeService, or ImageService)."""
        request = getattr(self.messages, f"{method}Request")(**fields)
        response = getattr(self.messages, f"{method}Response")
        stub = self.channel.unary_unary(f"{PACKAGE}{service}/{method}",
                                        request_serializer=request.__class__.SerializeToString,
                                        response_deserializer=response.FromString)
        return stub(request, timeout=self.timeout)

    def close(self):
        self.channel.close()
