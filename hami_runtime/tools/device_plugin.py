"""hamictl device-plugin: the node's slices as Kubernetes extended resources,
through the kubelet's device-plugin API (v1beta1, gRPC on unix sockets).

Two plugins, each its own socket in the device-plugin dir, registered with the
kubelet (kubelet.sock) and again whenever the kubelet makes kubelet.sock anew:
- hami.io/vgpu: split_count slots per GPU (one per MIG instance), ids <uuid>-<slot>;
- hami.io/vgpu-memory: each GPU's capacity in blocks of --memory-block MiB,
  ids <uuid>-mem-<n>.
Allocate answers what the runtime reads as a request: env (NVIDIA_VISIBLE_DEVICES
= the slots' GPUs, HAMI_GPUMEM = blocks x block) and the same as annotations
(hami.io/gpu-uuid, hami.io/gpu, hami.io/gpumem) for engines that pass a device
plugin's annotations into the spec. The runtime then allocates that slice.
With HAMi's scheduler (--scheduler hami) the plugin stays off: it serves nothing
and waits to be stopped, as HAMi's own device plugin advertises the node."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter

import click

from ..errors import HamiError
from . import device_plugin_api as api

VGPU, MEMORY = "hami.io/vgpu", "hami.io/vgpu-memory"
ENDPOINTS = {VGPU: "hami-vgpu.sock", MEMORY: "hami-vgpu-memory.sock"}
DEFAULT_DIR = "/var/lib/kubelet/device-plugins"
KUBELET_SOCKET = "kubelet.sock"
# The driver probe runs apart, so that a driver that hangs cannot hang the plugin.
PROBE = ("import json, sys; from hami_runtime.node import discovery; "
         "print(json.dumps([g.uuid for g in discovery.load_gpus(sys.argv[1])]))")


def say(line: str) -> None:
    click.echo(f"hamictl device-plugin: {line}", err=True)


class Inventory:
    """The node's devices for both resources and their health; a change wakes
    every ListAndWatch stream."""

    def __init__(self, gpus, split_count, memory_scaling, block_mib):
        from ..lifecycle.node_state import allocator
        self.block_mib = block_mib
        self.slots, self.blocks, self.room = {}, {}, {}
        for gpu in gpus:
            cap = allocator.capacity(gpu, split_count, memory_scaling)
            if cap.slots <= 0:  # a GPU in MIG mode: its instances are the devices
                continue
            self.room[gpu.uuid] = cap.mem_mib
            for slot in range(cap.slots):
                self.slots[f"{gpu.uuid}-{slot}"] = gpu.uuid
            for block in range(cap.mem_mib // block_mib):
                self.blocks[f"{gpu.uuid}-mem-{block}"] = gpu.uuid
        self.healthy = set(self.room)
        self.version = 0
        self.changed = threading.Condition()

    def devices(self, resource):
        return self.slots if resource == VGPU else self.blocks

    def set_healthy(self, uuids) -> bool:
        with self.changed:
            now = set(self.room) & set(uuids)
            if now == self.healthy:
                return False
            self.healthy = now
            self.version += 1
            self.changed.notify_all()
            return True

    def listing(self, resource):
        pb = api.messages()
        with self.changed:
            return pb.ListAndWatchResponse(devices=[
                pb.Device(ID=d, health=api.HEALTHY if uuid in self.healthy else api.UNHEALTHY)
                for d, uuid in self.devices(resource).items()])


class Plugin:
    """One resource's DevicePlugin service."""

    def __init__(self, resource, inventory, stopping, used_mib):
        self.resource = resource
        self.inventory = inventory
        self.stopping = stopping
        self.used_mib = used_mib  # uuid -> MiB the runtime has allocated now

    def GetDevicePluginOptions(self, request, context):
        return api.messages().DevicePluginOptions(pre_start_required=False,
                                                  get_preferred_allocation_available=True)

    def ListAndWatch(self, request, context):
        seen = -1
        while context.is_active() and not self.stopping.is_set():
            with self.inventory.changed:
                if seen == self.inventory.version:
                    self.inventory.changed.wait(1.0)
                    continue
                seen = self.inventory.version
            yield self.inventory.listing(self.resource)

    def _room(self, uuid, free):
        """A GPU's room: its devices the kubelet has free, then its memory free now."""
        return free[uuid], self.inventory.room[uuid] - self.used_mib().get(uuid, 0)

    def GetPreferredAllocation(self, request, context):
        pb = api.messages()
        devices = self.inventory.devices(self.resource)
        answers = []
        for asked in request.container_requests:
            chosen = [d for d in asked.must_include_deviceIDs if d in devices]
            available = [d for d in asked.available_deviceIDs if d in devices and d not in chosen]
            free = Counter(devices[d] for d in available)
            # slots: each vGPU on another GPU, the roomiest first; memory blocks:
            # all from the roomiest GPUs, so one GPU's memory is not scattered
            order = sorted(free, key=lambda u: self._room(u, free), reverse=True)
            taken = {devices[d] for d in chosen}
            for uuid in order:
                if len(chosen) >= asked.allocation_size:
                    break
                if self.resource == VGPU and uuid in taken:
                    continue
                for d in available:
                    if devices[d] == uuid and len(chosen) < asked.allocation_size:
                        chosen.append(d)
                        if self.resource == VGPU:
                            break
                taken.add(uuid)
            answers.append(pb.ContainerPreferredAllocationResponse(deviceIDs=chosen))
        return pb.PreferredAllocationResponse(container_responses=answers)

    def Allocate(self, request, context):
        import grpc
        pb = api.messages()
        devices = self.inventory.devices(self.resource)
        answers = []
        for asked in request.container_requests:
            unknown = [d for d in asked.devicesIDs if d not in devices]
            if unknown:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                              f"{self.resource}: no such device {unknown[0]!r} on this node")
            if self.resource == VGPU:
                uuids = [devices[d] for d in asked.devicesIDs]
                twice = [u for u, n in Counter(uuids).items() if n > 1]
                if twice:
                    context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                  f"{VGPU}: {len(uuids)} slots on GPU {twice[0]}: each vGPU of a "
                                  "container must be on another GPU")
                names = ",".join(uuids)
                answers.append(pb.ContainerAllocateResponse(
                    envs={"NVIDIA_VISIBLE_DEVICES": names},
                    annotations={"hami.io/gpu": str(len(uuids)), "hami.io/gpu-uuid": names}))
            else:
                mib = str(len(asked.devicesIDs) * self.inventory.block_mib)
                answers.append(pb.ContainerAllocateResponse(envs={"HAMI_GPUMEM": mib},
                                                            annotations={"hami.io/gpumem": mib}))
        return pb.AllocateResponse(container_responses=answers)

    def PreStartContainer(self, request, context):
        return api.messages().PreStartContainerResponse()


class Endpoint:
    """One plugin's socket and gRPC server: (re)started, then registered."""

    def __init__(self, plugin, directory):
        self.plugin = plugin
        self.path = os.path.join(directory, ENDPOINTS[plugin.resource])
        self.server = None
        self.inode = None

    def start(self):
        import grpc
        from concurrent import futures
        self.stop()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        self.server.add_generic_rpc_handlers((api.plugin_handler(self.plugin),))
        if not self.server.add_insecure_port(f"unix://{self.path}"):
            raise HamiError("--plugin-dir", os.path.dirname(self.path), f"cannot listen on {self.path}")
        self.server.start()
        self.inode = os.stat(self.path).st_ino

    def serving(self) -> bool:
        try:
            return os.stat(self.path).st_ino == self.inode
        except FileNotFoundError:
            return False

    def stop(self):
        if self.server is not None:
            self.server.stop(grace=0.5).wait()
            self.server = None
        try:
            if os.stat(self.path).st_ino == self.inode:
                os.unlink(self.path)
        except FileNotFoundError:
            pass

    def register(self, kubelet: str):
        import grpc
        pb = api.messages()
        request = pb.RegisterRequest(
            version=api.VERSION, endpoint=os.path.basename(self.path), resource_name=self.plugin.resource,
            options=pb.DevicePluginOptions(get_preferred_allocation_available=True))
        with grpc.insecure_channel(f"unix://{kubelet}") as channel:
            api.stub(channel, api.REGISTRATION, "Register", "RegisterRequest", "Empty")(request, timeout=10)


def probe(nvml_library: str, timeout: float):
    """The GPU UUIDs the driver answers with now, or the reason it does not."""
    try:
        done = subprocess.run([sys.executable, "-c", PROBE, nvml_library], capture_output=True,
                              text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return None, f"no answer within {timeout:g}s"
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines()
        return None, lines[-1] if lines else f"exit {done.returncode}"
    return json.loads(done.stdout), ""


def allocated_mib(state_dir):
    """uuid -> MiB the runtime's live allocations hold (read without the lock)."""
    from ..lifecycle.node_state import allocator, store
    try:
        state = store.snapshot(state_dir)
    except Exception:  # a state file the next create rebuilds: no preference from it
        return {}
    dead = set(state.dead())
    used = allocator.usage(e for n, e in state.allocations.items() if n not in dead)
    return {uuid: u.mem_mib for uuid, u in used.items()}


def _kubelet_id(path):
    try:
        st = os.stat(path)
        return st.st_ino, st.st_ctime_ns
    except FileNotFoundError:
        return None


def run(cfg, gpus, directory, block_mib, health_interval, stopping):
    inventory = Inventory(gpus, cfg.split_count, cfg.memory_scaling, block_mib)
    if not inventory.room:
        raise HamiError("device plugin", cfg.nvml_library or "NVML", "no GPU to share on this node")
    used = lambda: allocated_mib(cfg.state_dir)
    endpoints = [Endpoint(Plugin(r, inventory, stopping, used), directory) for r in (VGPU, MEMORY)]
    kubelet = os.path.join(directory, KUBELET_SOCKET)
    say(f"{len(inventory.slots)} {VGPU} and {len(inventory.blocks)} {MEMORY} ({block_mib}MiB each) "
        f"on {len(inventory.room)} GPU(s); kubelet at {kubelet}")
    registered, next_probe = None, time.monotonic() + health_interval
    try:
        while not stopping.is_set():
            now_id = _kubelet_id(kubelet)
            if now_id is not None and (now_id != registered or not all(e.serving() for e in endpoints)):
                try:
                    for e in endpoints:  # a restarted kubelet removes the plugins' sockets
                        if not e.serving():
                            e.start()
                        e.register(kubelet)
                    registered = now_id
                    say(f"registered {VGPU} and {MEMORY} with the kubelet")
                except Exception as exc:
                    say(f"registration with {kubelet} failed: {getattr(exc, 'details', lambda: exc)()}; "
                        "trying again")
            if time.monotonic() >= next_probe:
                uuids, why = probe(cfg.nvml_library, timeout=max(5.0, health_interval))
                if inventory.set_healthy(uuids or ()):
                    say(f"GPUs healthy: {len(inventory.healthy)}/{len(inventory.room)}"
                        + (f" (driver: {why})" if why else ""))
                next_probe = time.monotonic() + health_interval
            stopping.wait(0.5)
    finally:
        for e in endpoints:
            e.stop()


@click.command("device-plugin")
@click.option("--plugin-dir", default=DEFAULT_DIR, show_default=True,
              help="the kubelet's device-plugin dir (kubelet.sock and the plugins' sockets)")
@click.option("--memory-block", "block_mib", type=click.IntRange(1, 1 << 20), default=256,
              show_default=True, help=f"MiB of one {MEMORY} unit")
@click.option("--health-interval", type=click.FloatRange(0.1, 3600), default=10, show_default=True,
              help="seconds between driver probes (a GPU the driver does not answer for is Unhealthy)")
@click.option("--scheduler", type=click.Choice(["kubernetes", "hami"]), envvar="HAMI_SCHEDULER",
              default="kubernetes", show_default=True,
              help="hami: HAMi's scheduler places pods (its annotations); this plugin stays off")
@click.pass_context
def device_plugin_command(ctx, plugin_dir, block_mib, health_interval, scheduler):
    """Advertise this node's vGPU slots and memory to the kubelet (device-plugin API v1beta1)."""
    from . import hamictl
    stopping = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stopping.set())
    if scheduler == "hami":
        say("off: HAMi's scheduler places GPU pods and its decision annotations are honoured; "
            "waiting to be stopped")
        stopping.wait()
        return
    api.messages()  # a missing gRPC or protobuf is said before anything starts
    cfg = hamictl._config(ctx.obj["config_path"])
    from ..node import discovery
    gpus = discovery.load_gpus(cfg.nvml_library)
    if not os.path.isdir(plugin_dir):
        raise HamiError("--plugin-dir", plugin_dir, "not a directory (is the kubelet's mounted?)")
    run(cfg, gpus, plugin_dir, block_mib, health_interval, stopping)
