"""`hamictl metrics --listen HOST:PORT`: Prometheus metrics read from the shared
regions at scrape time (nothing is cached between scrapes).

Every series of a container carries `container` (its id) and `root` (the key of
its runc root: two roots may hold one id). SM time is exported as cumulative
counters in seconds, so rate() is the share used, and a rate above 0 of the
throttled / paused counters says the container is being held now;
hami_container_info carries what is not a number (runc root path, core policy,
priority) as labels, to join on (container, root)."""
from __future__ import annotations

import signal
import socket
import threading
from http.server import ThreadingHTTPServer
from typing import Iterator, Optional, Tuple

import click
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily
from prometheus_client.exposition import MetricsHandler

from . import top

CONTAINER_LABELS = ["container", "root"]
DEVICE_LABELS = CONTAINER_LABELS + ["device", "uuid"]
INFO_LABELS = ["runc_root", "core_policy", "priority"]

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


class RegionCollector:
    """A custom collector: one pass over the regions per scrape."""

    def __init__(self, state_dir: str):
        self.state_dir = state_dir

    def collect(self) -> Iterator:
        per_device = [(family(name, help_text, labels=DEVICE_LABELS), value)
                      for family, name, help_text, value in DEVICE_METRICS]
        readable = GaugeMetricFamily("hami_container_region_readable",
                                     "1 when the container's region could be read",
                                     labels=CONTAINER_LABELS)
        info = InfoMetricFamily("hami_container",
                                "The container's runc root, SM core policy and priority "
                                "(0 high, 1 low)", labels=CONTAINER_LABELS)
        for c in top.read_all(self.state_dir):
            container = [c.id, c.root_key]
            readable.add_metric(container, 0 if c.error else 1)
            if c.error:
                continue
            info.add_metric(container, dict(zip(INFO_LABELS, (c.runc_root, c.core_policy,
                                                              str(c.priority)))))
            for d in c.devices:
                labels = container + [str(d.index), d.uuid]
                for metric, value in per_device:
                    metric.add_metric(labels, value(c, d))
        yield from (metric for metric, _ in per_device)
        yield readable
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


def serve(state_dir: str, host: str, port: int):
    """Starts the endpoint in a thread; returns (server, thread). server.server_address
    has the bound port (port 0 picks a free one); server.shutdown() then
    server.server_close() stop it."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(RegionCollector(state_dir))
    server_class = _Server6 if ":" in host else _Server
    server = server_class((host, port), MetricsHandler.factory(registry))
    thread = threading.Thread(target=server.serve_forever, name="hami-metrics", daemon=True)
    thread.start()
    return server, thread


@click.command("metrics")
@top.state_dir_option
@click.option("--listen", default="127.0.0.1:9464", show_default=True, metavar="HOST:PORT",
              help="address to serve /metrics on")
def metrics_command(state_dir: Optional[str], listen: str):
    """Serve Prometheus metrics of every GPU container until SIGTERM/SIGINT."""
    try:
        host, port = parse_listen(listen)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    state_dir = top.resolve_state_dir(state_dir)
    top.region_module()  # a missing region.h is reported now, not at every scrape
    try:
        server, thread = serve(state_dir, host, port)
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
