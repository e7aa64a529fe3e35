"""`hamictl metrics --listen HOST:PORT`: Prometheus metrics of the node, read at
scrape time (nothing is cached between scrapes but the GPUs' names).

Every series of a container carries `container` (its id), `root` (the key of
its runc root: two roots may hold one id), and `pod_namespace`, `pod_name`,
`container_name` (where the engine gave them) and `request_source`. SM time is
exported as cumulative counters in seconds, so rate() is the share used, and a
rate above 0 of the throttled / paused counters says the container is being held
now; hami_container_info carries what is not a number (runc root path, core
policy, priority) as labels, to join on (container, root).

Every series of a GPU carries `gpu` (its index; GPU:MIG for a MIG instance),
`uuid` and `model`: its capacity, what the allocator has promised, and what the
driver reports at the scrape (node_view.py: read within a deadline, so a scrape
answers whatever the driver does). Every series carries `node`, the node's name
(--node-name, $NODE_NAME, else the host name), the label HAMi's current series
name it with, so a dashboard picks nodes by name, not by scrape address. Where a HAMi vGPUmonitor or scheduler series
has the same meaning it is also exported under HAMi's names and labels (both its
older and its current ones): docs/operations.md has the table.

Where the node agent has run on the state dir (tools/agent.py), its state file
adds hami_agent_up and the node's hami_enforcement_actions_total; while it runs,
per container what the driver shows its cgroup's processes holding and using,
the excess over its slice, whether it is frozen and what was done to it."""
from __future__ import annotations

import signal
import socket
import threading
from http.server import ThreadingHTTPServer
from typing import Iterator, NamedTuple, Optional, Tuple

import click
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily
from prometheus_client.exposition import MetricsHandler

from . import node_view, top
from .display_text import valid_utf8

MiB = 1024 * 1024
CONTAINER_LABELS = ["container", "root", "pod_namespace", "pod_name", "container_name",
                    "request_source"]
DEVICE_LABELS = CONTAINER_LABELS + ["device", "uuid"]
INFO_LABELS = ["runc_root", "core_policy", "priority"]
GPU_LABELS = ["gpu", "uuid", "model"]

# One sample per container and device: (family, name, help, value of container c, device d).
DEVICE_METRICS = (
    (GaugeMetricFamily, "hami_container_memory_used_bytes",
     "Device memory charged to the container", lambda c, d: d.mem_used_bytes),
    (GaugeMetricFamily, "hami_container_memory_limit_bytes",
     "Device memory limit of the container (0: none)", lambda c, d: d.mem_limit_bytes),
    (GaugeMetricFamily, "hami_container_sm_limit_percent",
     "SM share of the container (0 or 100: none)", lambda c, d: d.sm_limit_pct),
    (CounterMetricFamily, "hami_container_sm_busy_seconds",
     "Kernel time measured for the container; its rate is the SM use",
     lambda c, d: d.sm_busy_ns / 1e9),
    (CounterMetricFamily, "hami_container_sm_throttled_seconds",
     "Time the container's launches waited for its SM share, summed over waiting threads; "
     "a rate above 0 means it is being throttled",
     lambda c, d: d.sm_throttled_ns / 1e9),
    (CounterMetricFamily, "hami_container_sm_paused_seconds",
     "Time the container's launches waited for high-priority work on the GPU, summed over "
     "waiting threads; a rate above 0 means it is being paused",
     lambda c, d: d.sm_paused_ns / 1e9),
    (GaugeMetricFamily, "hami_container_processes",
     "Processes of the container using the device",
     lambda c, d: sum(1 for p in c.processes if p.uses(d.index))),
)

# One sample per GPU: (name, help, value of GPU view v; None: not known now, no sample).
def _promised(value):
    return lambda v: None if v.allocator_error else value(v)


GPU_METRICS = (
    ("hami_gpu_memory_physical_bytes", "Device memory of the GPU",
     lambda v: v.memory_bytes),
    ("hami_gpu_memory_capacity_bytes", "Device memory the allocator may promise on the GPU "
     "(physical x memory_scaling; 0 for a GPU in MIG mode)", lambda v: v.capacity_bytes),
    ("hami_gpu_cores_capacity_percent", "SM share the allocator may promise on the GPU",
     lambda v: v.cores_capacity_pct),
    ("hami_gpu_slots", "Containers that may share the GPU (split_count; 1 for a MIG instance)",
     lambda v: v.slots),
    ("hami_gpu_memory_promised_bytes", "Device memory the allocator has promised on the GPU",
     _promised(lambda v: v.memory_promised_bytes)),
    ("hami_gpu_cores_promised_percent", "SM share the allocator has promised on the GPU",
     _promised(lambda v: v.cores_promised_pct)),
    ("hami_gpu_containers", "Containers holding an allocation on the GPU (slots used)",
     _promised(lambda v: v.containers)),
    ("hami_gpu_invalid_entries", "Invalid allocator entries naming the GPU (it takes no new "
     "allocation until hamictl doctor --repair)", _promised(lambda v: v.invalid_entries)),
    ("hami_gpu_allocator_readable", "1 when the allocator's state could be read",
     lambda v: 0 if v.allocator_error else 1),
    ("hami_gpu_driver_read", "1 when the driver answered for the GPU at this scrape",
     lambda v: 1 if v.driver_read else 0),
    ("hami_gpu_driver_memory_used_bytes", "Device memory in use on the GPU, as the driver says",
     lambda v: v.driver_used_bytes),
    ("hami_gpu_driver_utilization_percent", "GPU utilisation the driver reports",
     lambda v: v.utilization_pct),
    ("hami_gpu_memory_outside_slices_bytes", "Device memory the driver shows held by processes "
     "no container's slice counts (host processes, other runtimes' containers)",
     lambda v: v.outside_bytes),
    ("hami_gpu_processes_outside_slices", "Processes on the GPU that no container's slice counts",
     lambda v: None if v.outside_bytes is None else len(v.outside_pids)),
)

# HAMi's names for the same figures: (ours, HAMi's older name, its current one, value
# of GPU view v, extra labels as (older, current, value of v)). Their labels are HAMi's.
HAMI_GPU_LABELS = (("nodeid", "node"), ("deviceuuid", "device_uuid"), ("deviceidx", "device_index"),
                   ("devicetype", "device_type"))
HAMI_CORES = ("devicecores", "device_cores", lambda v: v.cores_capacity_pct)
PROMISED_MEMORY = _promised(lambda v: v.memory_promised_bytes)
HAMI_GPU_METRICS = (
    ("hami_gpu_driver_memory_used_bytes", "HostGPUMemoryUsage", "hami_host_gpu_memory_used_bytes",
     lambda v: v.driver_used_bytes, ()),
    ("hami_gpu_driver_utilization_percent", "HostCoreUtilization", "hami_host_gpu_utilization_ratio",
     lambda v: v.utilization_pct, ()),
    ("hami_gpu_memory_capacity_bytes", "GPUDeviceMemoryLimit", "hami_gpu_memory_limit_bytes",
     lambda v: v.capacity_bytes, ()),
    ("hami_gpu_cores_capacity_percent", "GPUDeviceCoreLimit", "hami_gpu_core_limit_ratio",
     lambda v: v.cores_capacity_pct, ()),
    ("hami_gpu_memory_promised_bytes", "GPUDeviceMemoryAllocated", "hami_gpu_memory_allocated_bytes",
     PROMISED_MEMORY, (HAMI_CORES,)),
    ("hami_gpu_containers", "GPUDeviceSharedNum", "hami_gpu_shared_count",
     _promised(lambda v: v.containers), ()),
    ("hami_gpu_cores_promised_percent", "GPUDeviceCoreAllocated", "hami_gpu_core_allocated_ratio",
     _promised(lambda v: v.cores_promised_pct), ()),
    ("hami_gpu_memory_promised_bytes", "nodeGPUOverview", "hami_node_gpu_overview", PROMISED_MEMORY,
     (HAMI_CORES, ("devicememorylimit", "device_memory_limit",
                   lambda v: None if v.capacity_bytes is None else v.capacity_bytes // MiB))),
    ("hami_gpu_memory_promised_bytes / hami_gpu_memory_capacity_bytes", "nodeGPUMemoryPercentage",
     "hami_node_gpu_memory_allocated_ratio",
     _promised(lambda v: v.memory_promised_bytes / v.capacity_bytes if v.capacity_bytes else None), ()),
)
# HAMi's own nodeGPUMemoryPercentage names no device type (node, uuid and index only).
NO_DEVICE_TYPE = {"nodeGPUMemoryPercentage", "hami_node_gpu_memory_allocated_ratio"}
# The node's name on every series, under the label HAMi's current names give it.
NODE_LABEL = "node"
# Per container and device: HAMi's labels name the pod, the container and the device's
# place in the container; container_id and root keep two containers without names apart.
HAMI_CONTAINER_LABELS = (("podnamespace", "namespace"), ("podname", "pod"), ("ctrname", "container"),
                         ("vdeviceid", "vdevice_index"), ("deviceuuid", "device_uuid"),
                         ("container_id", "container_id"), ("root", "root"))
HAMI_DEVICE_METRICS = (
    ("hami_container_memory_used_bytes", "vGPU_device_memory_usage_in_bytes",
     "hami_vgpu_memory_used_bytes", lambda c, d: d.mem_used_bytes),
    ("hami_container_memory_limit_bytes", "vGPU_device_memory_limit_in_bytes",
     "hami_vgpu_memory_limit_bytes", lambda c, d: d.mem_limit_bytes),
)


def _text(value) -> str:
    return "" if value is None else str(value)


class NodeSource(NamedTuple):
    """What the GPU series need besides the regions."""
    settings: dict  # node_view.settings
    reader: node_view.DriverReader
    node_name: str = ""
    hami_names: bool = True


def container_labels(c) -> list:
    """Every value valid UTF-8, as the text format needs (the names come bounded
    from node_view; prometheus_client escapes backslash, quote and newline)."""
    return [valid_utf8(x) for x in (c.id, c.root_key, c.pod_namespace, c.pod_name,
                                    c.container_name, c.request_source)]


class RegionCollector:
    """A custom collector: one pass over the regions per scrape (and, with a
    node source, over the allocator's state and the driver)."""

    def __init__(self, state_dir: str, node: Optional[NodeSource] = None):
        self.state_dir = state_dir
        self.node = node

    def collect(self) -> Iterator:
        node_name = self.node.node_name if self.node is not None else ""
        for family in self.families():
            if node_name:  # every series names its node, as a dashboard's node picker needs
                family.samples = [s if NODE_LABEL in s.labels else
                                  s._replace(labels={NODE_LABEL: node_name, **s.labels})
                                  for s in family.samples]
            yield family

    def families(self) -> Iterator:
        containers = top.read_all(self.state_dir)
        yield from self.container_metrics(containers)
        if self.node is not None:
            yield from self.node_metrics(containers)
        yield from self.agent_metrics(containers)

    def agent_metrics(self, containers) -> Iterator:
        """The node agent's figures (none where no agent ever ran here)."""
        from ..node import agent_state
        from ..node.enforcement import ACTIONS
        state = agent_state.read(self.state_dir)
        if state is None:
            return
        fresh = state.fresh()
        up = GaugeMetricFamily("hami_agent_up", "1 while the node agent runs and has written its state "
                               "lately (hamictl agent)")
        up.add_metric([], 1 if fresh else 0)
        yield up
        totals = CounterMetricFamily("hami_enforcement_actions", "Actions the node agent took: kill "
                                     "(processes killed), log (episodes reported), freeze", labels=["action"])
        for action in ACTIONS:
            totals.add_metric([action], state.totals.get(action, 0))
        yield totals
        if not fresh:
            return
        per_device = [(GaugeMetricFamily(name, text, labels=DEVICE_LABELS), key) for name, text, key in (
            ("hami_container_driver_memory_bytes", "Device memory the driver shows the processes of the "
             "container's cgroup holding (whatever they loaded)", "held"),
            ("hami_container_memory_excess_bytes", "Device memory the container holds beyond its slice, "
             "by the driver's count (0: within it)", "excess"),
            ("hami_container_driver_sm_percent", "SM utilisation the driver shows the container's "
             "processes using over the last second (where it has an SM share)", "sm_use"),
            ("hami_container_sm_excess_percent", "SM use beyond the container's share, by the driver's "
             "count", "sm_excess"))]
        frozen = GaugeMetricFamily("hami_container_frozen", "1 while the node agent holds the container "
                                   "frozen for SM use beyond its share", labels=CONTAINER_LABELS)
        actions = CounterMetricFamily("hami_container_enforcement_actions", "Actions the node agent took "
                                      "on the container", labels=CONTAINER_LABELS + ["action"])
        for c in containers:
            rec = state.containers.get(c.name)
            if rec is None:
                continue
            labels = container_labels(c)
            frozen.add_metric(labels, 1 if rec.frozen_until else 0)
            for action in ACTIONS:
                actions.add_metric(labels + [action], rec.actions.get(action, 0))
            for d in c.devices:
                for metric, key in per_device:
                    value = getattr(rec, key).get(d.uuid)
                    if value is not None:
                        metric.add_metric(labels + [str(d.index), d.uuid], value)
        yield from (metric for metric, _ in per_device)
        yield frozen
        yield actions

    def container_metrics(self, containers) -> Iterator:
        per_device = [(family(name, help_text, labels=DEVICE_LABELS), value)
                      for family, name, help_text, value in DEVICE_METRICS]
        readable = GaugeMetricFamily("hami_container_region_readable",
                                     "1 when the container's region could be read",
                                     labels=CONTAINER_LABELS)
        info = InfoMetricFamily("hami_container",
                                "The container's runc root, SM core policy and priority "
                                "(0 high, 1 low)", labels=CONTAINER_LABELS)
        hami = self.node is not None and self.node.hami_names
        aliases = [(GaugeMetricFamily(name, f"As HAMi names {ours}",
                                      labels=[pair[i] for pair in HAMI_CONTAINER_LABELS]), value)
                   for ours, legacy, current, value in HAMI_DEVICE_METRICS if hami
                   for i, name in ((0, legacy), (1, current))]
        for c in containers:
            container = container_labels(c)
            readable.add_metric(container, 0 if c.error else 1)
            if c.error:
                continue
            info.add_metric(container, dict(zip(INFO_LABELS, map(valid_utf8, (
                c.runc_root, c.core_policy, str(c.priority))))))
            for d in c.devices:
                labels = container + [str(d.index), d.uuid]
                for metric, value in per_device:
                    metric.add_metric(labels, value(c, d))
                hami_labels = [c.pod_namespace, c.pod_name, c.container_name, str(d.index), d.uuid,
                               c.id, c.root_key]
                for metric, value in aliases:
                    metric.add_metric(hami_labels, value(c, d))
        yield from (metric for metric, _ in per_device)
        yield readable
        yield info
        yield from (metric for metric, _ in aliases)

    def node_metrics(self, containers) -> Iterator:
        settings, node = self.node.settings, self.node
        gpus = node_view.node_now(settings, node.reader, containers)
        families = [(GaugeMetricFamily(name, help_text, labels=GPU_LABELS), value)
                    for name, help_text, value in GPU_METRICS]
        gpu_info = InfoMetricFamily("hami_gpu", "The GPU's parent (a MIG instance's GPU) and "
                                    "whether it is in MIG mode", labels=GPU_LABELS)
        aliases = []
        if node.hami_names:
            for ours, legacy, current, value, extra in HAMI_GPU_METRICS:
                for i, name in ((0, legacy), (1, current)):
                    kept = HAMI_GPU_LABELS[:-1] if name in NO_DEVICE_TYPE else HAMI_GPU_LABELS
                    labels = [pair[i] for pair in kept] + [e[i] for e in extra]
                    aliases.append((GaugeMetricFamily(name, f"As HAMi names {ours}", labels=labels),
                                    value, extra, len(kept)))
        for v in gpus:
            labels = [v.gpu, v.uuid, v.model]
            gpu_info.add_metric(labels, {"parent": v.parent, "mig_mode": str(int(v.mig_mode))})
            for metric, value in families:
                sample = value(v)
                if sample is not None:
                    metric.add_metric(labels, sample)
            hami = [node.node_name, v.uuid, str(v.index), f"NVIDIA-{v.model}" if v.model else ""]
            for metric, value, extra, kept in aliases:
                sample = value(v)
                extras = [_text(e[2](v)) for e in extra]
                if sample is not None:
                    metric.add_metric(hami[:kept] + extras, sample)
        yield from (metric for metric, _ in families)
        yield gpu_info
        yield from (metric for metric, *_ in aliases)
        scaling = GaugeMetricFamily("hami_node_memory_scaling", "How far the allocator may promise "
                                    "device memory beyond the physical (memory_scaling)")
        scaling.add_metric([], settings["memory_scaling"])
        yield scaling
        info = InfoMetricFamily("hami_node", "The allocator's policy (binpack, spread) and the SM "
                                "policy a request gets when it names none")
        info.add_metric([], {"policy": settings["policy"], "core_policy": settings["core_policy"]})
        yield info


def parse_listen(value: str) -> Tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"--listen: {value!r} is not HOST:PORT")
    return host.strip("[]"), int(port)


class _Server(ThreadingHTTPServer):
    daemon_threads = True


class _Server6(_Server):
    address_family = socket.AF_INET6


def serve(state_dir: str, host: str, port: int, node: Optional[NodeSource] = None):
    """Starts the endpoint in a thread; returns (server, thread). server.server_address
    has the bound port (port 0 picks a free one); server.shutdown() then
    server.server_close() stop it. Without `node`, only the containers' series."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(RegionCollector(state_dir, node))
    server_class = _Server6 if ":" in host else _Server
    server = server_class((host, port), MetricsHandler.factory(registry))
    thread = threading.Thread(target=server.serve_forever, name="hami-metrics", daemon=True)
    thread.start()
    return server, thread


@click.command("metrics")
@top.state_dir_option
@click.option("--listen", default="127.0.0.1:9464", show_default=True, metavar="HOST:PORT",
              help="address to serve /metrics on")
@click.option("--node-name", envvar="NODE_NAME", default=None,
              help="the node's name: the `node` label of every series and HAMi's `nodeid` "
              "(default $NODE_NAME, as a Kubernetes DaemonSet sets it, else the host name)")
@click.option("--driver-timeout", type=click.FloatRange(min=0.05, max=0.9),
              default=node_view.DRIVER_DEADLINE_S, show_default=True,
              help="seconds a scrape waits for the driver before it answers without it")
@click.option("--hami-names/--no-hami-names", default=True, show_default=True,
              help="also export HAMi's vGPUmonitor and scheduler names for the same figures")
def metrics_command(state_dir: Optional[str], listen: str, node_name: Optional[str],
                    driver_timeout: float, hami_names: bool):
    """Serve Prometheus metrics of every GPU and GPU container until SIGTERM/SIGINT."""
    try:
        host, port = parse_listen(listen)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    settings = top.node_settings(state_dir)
    state_dir = settings["state_dir"]
    top.region_module()  # a missing region.h is reported now, not at every scrape
    node = NodeSource(settings, node_view.DriverReader(settings["nvml_library"], driver_timeout),
                      node_name or socket.gethostname(), hami_names)
    try:
        server, thread = serve(state_dir, host, port, node)
    except OSError as exc:
        raise click.ClickException(f"--listen: {listen}: {exc.strerror}") from None
    bound_host, bound_port = server.server_address[:2]
    click.echo(f"serving http://{bound_host}:{bound_port}/metrics (state dir {state_dir})",
               err=True)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    stop.wait()
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)
