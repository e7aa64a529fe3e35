"""A stand-in kubelet for the device-plugin API v1beta1: it serves Registration on
<dir>/kubelet.sock and makes the kubelet's calls to each plugin that registered.
tests/k8s/test_device_plugin.py drives `hamictl device-plugin` with it, and make
k8s-check (cri_check.py) carries its Allocate answer into a CRI create."""
import queue
from concurrent import futures

import grpc

from hami_runtime.tools import device_plugin_api as api

WAIT = 30


class Kubelet:
    """The kubelet's side: Registration on <dir>/kubelet.sock, a client of each
    plugin socket that registered."""

    def __init__(self, directory):
        self.directory = directory
        self.registered = queue.Queue()
        self.server = None

    def start(self):
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        self.server.add_generic_rpc_handlers((api.registration_handler(self._register),))
        assert self.server.add_insecure_port(f"unix://{self.directory}/kubelet.sock")
        self.server.start()

    def _register(self, request, context):
        self.registered.put(request)
        return api.messages().Empty()

    def stop(self):
        if self.server is not None:
            self.server.stop(0).wait()
            self.server = None
        (self.directory / "kubelet.sock").unlink(missing_ok=True)

    def registrations(self, count=2):
        """The next `count` Register requests, by resource name."""
        got = [self.registered.get(timeout=WAIT) for _ in range(count)]
        return {r.resource_name: r for r in got}

    def plugin(self, request, method, message, response, streaming=False, **kw):
        channel = grpc.insecure_channel(f"unix://{self.directory}/{request.endpoint}")
        try:
            call = api.stub(channel, api.PLUGIN, method, type(message).__name__, response, streaming)
            if streaming:
                return channel, call(message, **kw)
            return call(message, timeout=WAIT, **kw)
        finally:
            if not streaming:
                channel.close()

    def listing(self, registration) -> dict:
        """The first ListAndWatch answer: device id -> health."""
        channel, stream = self.plugin(registration, "ListAndWatch", api.messages().Empty(),
                                      "ListAndWatchResponse", streaming=True)
        try:
            return {d.ID: d.health for d in next(stream).devices}
        finally:
            stream.cancel()
            channel.close()

    def allocate(self, registration, ids):
        """Allocate of `ids` for one container: its ContainerAllocateResponse."""
        pb = api.messages()
        answer = self.plugin(registration, "Allocate", pb.AllocateRequest(
            container_requests=[pb.ContainerAllocateRequest(devicesIDs=ids)]), "AllocateResponse")
        (response,) = answer.container_responses
        return response
