"""Whatever bytes a container's spec carries (its annotations, its id, its env),
every host tool shows them and the node stays whole: containers made through
the real runtime and runc on the simulated GPU, each with one kind of hostile
bytes (lone surrogates, as config.json's "\\ud800" escapes; ESC sequences,
newlines, NUL; 1 MiB values; invalid UTF-8 written as raw bytes), then `ps`,
`top` (one-shot and --watch), `gpus`, `doctor` (each with --json), and the
metrics, as text in one go and scraped over HTTP in both exposition formats.
Each tool exits as with plain names, prints only printable text (valid UTF-8,
no ESC), its JSON parses, and the labels are the names, bounded and valid.
Deleting the containers frees every allocation."""
import json
import subprocess
import urllib.request
from typing import NamedTuple, Optional

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families as parse_text

from tests.conftest import ROOT

from .node import HAMICTL, RUNTIME, TIMEOUT

MiB = 1 << 20
MAX_SHOWN = 256  # what a name is cut to (display_text.MAX_SHOWN)
ESC = "\x1b"
SANDBOX = "ab" * 32
RAW_MARK = "@RAW@"  # in a spec, replaced by RAW_BYTES once written


class Case(NamedTuple):
    """One container's spec and what the tools must make of it. `labels`: the
    container series' labels expected from it (the names bounded, valid UTF-8);
    `shown`: text the tables show for it (printable: ESC and newlines as '?', a
    lone surrogate as its escape)."""
    id: str
    annotations: dict
    env: tuple = ()
    created: bool = True
    labels: Optional[dict] = None
    shown: str = ""
    raw: bytes = b""  # written over RAW_MARK in config.json: bytes JSON cannot say


CASES = [
    Case("surrogates", {"hami.io/gpumem": "1000", "io.kubernetes.pod.namespace": "ns-\udfff",
                        "io.kubernetes.pod.name": "pod-\ud800-x"},
         labels={"pod_namespace": "ns-\\udfff", "pod_name": "pod-\\ud800-x", "container_name": ""},
         shown="ns-\\udfff/pod-\\ud800-x"),
    Case("controls", {"hami.io/gpumem": "1000", "io.kubernetes.pod.namespace": "a\nb\r",
                      "io.kubernetes.pod.name": f"p{ESC}[2J{ESC}]0;owned\x07",
                      "io.kubernetes.container.name": "\x00c\u009b31m\u202e"},
         labels={"pod_namespace": "a\nb?", "pod_name": "p?[2J?]0;owned?", "container_name": "?c?31m?"},
         shown="a?b?/p?[2J?]0;owned?/?c?31m?"),
    # containerd's own keys on a pod's container: the pod's names say anything
    Case("pod", {"hami.io/gpumem": "1000", "io.kubernetes.cri.container-type": "container",
                 "io.kubernetes.cri.sandbox-id": SANDBOX, "io.kubernetes.cri.container-name": "main",
                 "io.kubernetes.cri.sandbox-namespace": f"ml{ESC}[31m",
                 "io.kubernetes.cri.sandbox-name": "pod-\ud800\n"},
         labels={"pod_namespace": "ml?[31m", "pod_name": "pod-\\ud800\n", "container_name": "main"},
         shown="ml?[31m/pod-\\ud800?/main"),
    Case("mebibyte", {"hami.io/gpumem": "1000", "io.kubernetes.pod.name": "y" * MiB},
         labels={"pod_namespace": "", "pod_name": "y" * MAX_SHOWN, "container_name": ""},
         shown="y" * MAX_SHOWN),
    Case("mebibyte-escapes", {"hami.io/gpumem": "1000", "nerdctl/name": f"{ESC}\ud800" * (MiB // 2)},
         labels={"pod_namespace": "", "pod_name": "",
                 "container_name": ("?\\ud800" * MAX_SHOWN)[:MAX_SHOWN]},
         shown=("?\\ud800" * MAX_SHOWN)[:MAX_SHOWN]),
    Case("env", {}, env=("HAMI_GPUMEM=1000", f"NOTE=\ud800{ESC}[2J\n", "BIG=" + "z" * MiB),
         labels={"pod_namespace": "", "pod_name": "", "container_name": "", "request_source": "env"}),
    # bytes that are not UTF-8 read as U+FFFD, as runc reads them
    Case("invalid-utf8", {"hami.io/gpumem": "1000", "io.kubernetes.pod.name": RAW_MARK},
         raw=b"pod-\xff\xfe[2J\xc0",
         labels={"pod_namespace": "", "pod_name": "pod-\ufffd\ufffd[2J\ufffd", "container_name": ""},
         shown="pod-\ufffd\ufffd[2J\ufffd"),
    Case("request-value", {}, env=(f"HAMI_GPUMEM=1000{ESC}[2J\ud800\nforged",), created=False),
    Case("request-key", {f"{ESC}[2J\ud800.hami.io/gpumem": "1"}, created=False),
]
BAD_ID = f"id\udcff{ESC}[2J"  # as argv: b"id\xff\x1b[2J"
TOOLS = [
    ("ps",), ("ps", "--json"), ("top", "--interval", "0"), ("top", "--interval", "0", "--json"),
    ("top", "--watch", "--interval", "0.1", "--count", "2"), ("gpus",), ("gpus", "--json"),
    ("doctor",), ("doctor", "--json"),
]
CONTAINER_LABELS = ("container", "root", "pod_namespace", "pod_name", "container_name", "request_source")


def cid(case: Case) -> str:
    return f"bytes-{case.id}"


def printable(data: bytes, what: str) -> str:
    """The text of `data`, which must be UTF-8 with every line printable."""
    text = data.decode("utf-8")  # strict: a lone surrogate or a stray byte fails here
    for line in text.split("\n"):
        assert line.isprintable(), f"{what}: not printable: {line[:300]!r}"
    return text


def hamictl(node, *args):
    proc = subprocess.run(HAMICTL + list(args), capture_output=True, env=node.env, timeout=TIMEOUT,
                          cwd=ROOT)
    return proc.returncode, printable(proc.stdout, f"{args} stdout"), printable(proc.stderr, f"{args} stderr")


def write_bundle(node, case: Case):
    bundle = node.bundle(cid(case), case.annotations, env=case.env)
    if case.raw:
        spec = bundle / "config.json"
        spec.write_bytes(spec.read_bytes().replace(RAW_MARK.encode(), case.raw))
    return bundle


@pytest.fixture(scope="module")
def made(module_node):
    """Every case's create, on one node (a log file, debug and above): {case id: result}."""
    node = module_node
    node.write_config(log_file=str(node.tmp / "hami.log"), log_level="debug")
    results = {case.id: node.create(cid(case), write_bundle(node, case), cmd=RUNTIME) for case in CASES}
    results["bad-id"] = node.create(BAD_ID, node.bundle("bad-id", {"hami.io/gpumem": "1000"}), cmd=RUNTIME)
    yield results
    for case in CASES:
        node.runtime("delete", "-f", cid(case), cmd=RUNTIME)


@pytest.mark.parametrize("case", CASES + [Case("bad-id", {}, created=False)], ids=lambda c: c.id)
def test_create_takes_or_refuses_in_one_printable_line(module_node, made, case):
    result = made[case.id]
    assert result.returncode == (0 if case.created else 1), result.stderr
    if case.created:
        assert result.stderr == ""
        return
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("hami-runtime: "), result.stderr
    assert lines[0].isprintable(), lines[0]


def test_the_runtimes_logs_stay_one_printable_line_each(module_node, made):
    node = module_node
    log = printable((node.tmp / "hami.log").read_bytes(), "the runtime's log")
    for case in CASES:
        assert any(f" {cid(case)}" in line for line in log.splitlines()), (case.id, log[-2000:])
    assert "refused: container id=" in log
    # the engine's --log (runc's formats): one JSON string per line
    for line in printable((node.tmp / "runc.log").read_bytes(), "--log").splitlines():
        assert line.startswith("time=") and ESC not in line, line


def test_the_state_keeps_what_the_create_took(module_node, made):
    held = module_node.allocations()
    assert sorted(held) == sorted(cid(c) for c in CASES if c.created)


@pytest.mark.parametrize("args", TOOLS, ids=" ".join)
def test_every_tool_shows_the_node(module_node, made, args):
    rc, out, err = hamictl(module_node, *args)
    assert rc == 0, err
    assert err == ""
    created = [c for c in CASES if c.created]
    if "--json" in args:
        document = json.loads(out)
        if args[0] == "ps":
            assert sorted({row["container"] for row in document}) == sorted(cid(c) for c in created)
            for row in document:
                assert all(len(v) <= MAX_SHOWN for v in row["identity"].values())
        elif args[0] == "top":
            by_id = {c["id"]: c for c in document["containers"]}
            assert sorted(by_id) == sorted(cid(c) for c in created)
            for case in created:
                for label, value in (case.labels or {}).items():
                    assert by_id[cid(case)][label] == value, (case.id, label)
        elif args[0] == "gpus":
            holders = {h["id"]: h for gpu in document for h in gpu["containers"]}
            assert sorted(holders) == sorted(cid(c) for c in created)
        else:
            assert document["healthy"] and document["allocations"] == len(created), document
        return
    if args[0] == "doctor":
        assert f"state is sound, {len(created)} allocation(s)" in out
        return
    for case in created:
        assert cid(case)[:12] in out, (case.id, out[-3000:])
        if case.shown:  # one naming in every tool: <namespace>/<pod>/<container>
            assert case.shown in out, (case.id, out[-3000:])
    assert "y" * (MAX_SHOWN + 1) not in out


def check_container_series(found_labels):
    """found_labels: the labels of every hami_container_region_readable sample."""
    by_id = {labels["container"]: labels for labels in found_labels}
    created = [c for c in CASES if c.created]
    assert sorted(by_id) == sorted(cid(c) for c in created)
    for case in created:
        labels = by_id[cid(case)]
        for label in CONTAINER_LABELS:
            assert len(labels[label]) <= MAX_SHOWN
            labels[label].encode("utf-8")
        for label, value in (case.labels or {}).items():
            assert labels[label] == value, (case.id, label, labels[label][:80])


def readable_labels(families):
    return [s.labels for f in families for s in f.samples if s.name == "hami_container_region_readable"]


def test_metrics_text_carries_every_name(module_node, made):
    """The container series as text in one go (no server, no driver)."""
    from prometheus_client import CollectorRegistry, generate_latest
    from hami_runtime.tools.metrics import RegionCollector
    registry = CollectorRegistry(auto_describe=False)
    registry.register(RegionCollector(str(module_node.state_dir)))
    text = printable(generate_latest(registry), "metrics text")
    check_container_series(readable_labels(parse_text(text)))


@pytest.fixture(scope="module")
def server(module_node, made):
    proc = subprocess.Popen(HAMICTL + ["metrics", "--listen", "127.0.0.1:0"], cwd=ROOT,
                            env=module_node.env, stderr=subprocess.PIPE, text=True)
    line = proc.stderr.readline()
    assert line.startswith("serving http://127.0.0.1:"), line
    yield line.split()[1]
    proc.terminate()
    proc.wait(timeout=10)
    proc.stderr.close()


@pytest.mark.parametrize("accept,parse", [
    ("text/plain; version=0.0.4", parse_text),
    ("application/openmetrics-text; version=1.0.0", parse_openmetrics),
], ids=["text", "openmetrics"])
def test_every_scrape_answers_200_with_parseable_text(server, accept, parse):
    for _ in range(3):  # every scrape, not the first alone
        request = urllib.request.Request(server, headers={"Accept": accept})
        with urllib.request.urlopen(request, timeout=10) as response:
            assert response.status == 200
            body = response.read().decode("utf-8")  # strict
        families = list(parse(body))
        check_container_series(readable_labels(families))
        names = {f.name for f in families}
        assert {"hami_gpu_memory_promised_bytes", "hami_container_memory_limit_bytes"} <= names
        promised = sum(s.value for f in families for s in f.samples
                       if s.name == "hami_gpu_memory_promised_bytes")
        assert promised == 1000 * MiB * sum(c.created for c in CASES)


def test_delete_frees_every_allocation(module_node, made):
    """Last in the module: the node afterwards is as before."""
    node = module_node
    for case in CASES:
        node.runtime("delete", "-f", cid(case), cmd=RUNTIME)
    assert node.allocations() == {}
    rc, out, _ = hamictl(node, "ps", "--json")
    assert rc == 0 and json.loads(out) == []
    plain = node.create("plain", node.bundle("plain", {"hami.io/gpumem": "1000"}), cmd=RUNTIME)
    assert plain.returncode == 0, plain.stderr
    assert list(node.allocations()) == ["plain"]
    node.runtime("delete", "-f", "plain", cmd=RUNTIME)
    assert node.allocations() == {}


def test_large_names_cannot_fill_the_state_file(node):
    for i in range(3):
        result = node.create(f"big{i}", node.bundle(f"big{i}", {
            "hami.io/gpumem": "100", "nerdctl/name": "\ud800" * MiB}), cmd=RUNTIME)
        assert result.returncode == 0, result.stderr
    try:
        after = node.create("after", node.bundle("after", {"hami.io/gpumem": "100"}), cmd=RUNTIME)
        assert after.returncode == 0, after.stderr
    finally:
        for name in ("big0", "big1", "big2", "after"):
            node.runtime("delete", "-f", name, cmd=RUNTIME)
