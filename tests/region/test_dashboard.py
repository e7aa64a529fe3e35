"""The example Grafana dashboard (examples/grafana/hami-node.json): type-checked
against Grafana's own schema (@grafana/schema's TypeScript types, with tsc), its
panels' settings checked, and every query it makes run by a real Prometheus that
scrapes `hamictl metrics` on the simulated GPU (two containers on card 0)."""
import json
import re
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request

import pytest

from tests.conftest import BUILD, ROOT
from tests.region.test_node_metrics import DASHBOARD, Server, holders, node, sim_env  # noqa: F401 (fixtures)

NODE_NAME = "node-1"  # what Server passes as --node-name
SCHEMA_VERSION = "13.2.3"  # @grafana/schema
TYPESCRIPT_VERSION = "5.6.3"
SCHEMA_DIR = BUILD / "grafana-schema"
MODULES = SCHEMA_DIR / "node_modules"
# Panel type -> the panel's own options and custom field config in @grafana/schema.
PANEL_TYPES = {"stat": ("stat", "StatOptions", None), "bargauge": ("bargauge", "BarGaugeOptions", None),
               "timeseries": ("timeseries", "TimeSeriesOptions", "TimeSeriesFieldConfig"),
               "table": ("table", "TableOptions", "TableFieldConfig")}


def load():
    return json.loads(DASHBOARD.read_text())


def panels(dashboard):
    return [p for p in dashboard["panels"] if p["type"] != "row"]


# --- Grafana's schema --------------------------------------------------------

def installed(package, version):
    path = MODULES / package / "package.json"
    return path.exists() and json.loads(path.read_text()).get("version") == version


@pytest.fixture(scope="module")
def tsc():
    """tsc with @grafana/schema, installed into build/grafana-schema when missing."""
    npm = shutil.which("npm")
    if npm is None:
        pytest.skip("npm is not installed")
    if not (installed("@grafana/schema", SCHEMA_VERSION) and installed("typescript", TYPESCRIPT_VERSION)):
        SCHEMA_DIR.mkdir(parents=True, exist_ok=True)
        result = subprocess.run([npm, "install", "--prefix", str(SCHEMA_DIR), "--no-audit", "--no-fund",
                                 f"@grafana/schema@{SCHEMA_VERSION}", f"typescript@{TYPESCRIPT_VERSION}"],
                                capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stdout + result.stderr
    return MODULES / "typescript" / "bin" / "tsc"


def typescript_of(dashboard):
    """The dashboard as a typed literal (excess properties and wrong values are
    errors), and each panel once more as that panel type's own options and field
    config. Grafana fills what a saved dashboard leaves out, so these are partial."""
    lines = ["import type { Dashboard, Panel } from '@grafana/schema';"]
    for kind, options, field in PANEL_TYPES.values():
        lines.append(f"import type {{ Options as {options}"
                     + (f", FieldConfig as {field}" if field else "") + f" }} from 'panelcfg/{kind}';")
    # JSON holds an enum's value, not the enum: Json<T> is T with each string enum
    # as the union of its values (`${E}`), all else as it is.
    lines += ["type Json<T> = T extends string ? `${T}` : T extends (infer U)[] ? Json<U>[] :",
              "    T extends object ? { [K in keyof T]: Json<T[K]> } : T;",
              "type DeepPartial<T> = T extends (infer U)[] ? DeepPartial<U>[] :",
              "    T extends object ? { [K in keyof T]?: DeepPartial<T[K]> } : T;",
              f"export const dashboard: Json<Dashboard> = {json.dumps(dashboard, indent=2)};"]
    for panel in panels(dashboard):
        _, options, field = PANEL_TYPES[panel["type"]]
        custom = f"DeepPartial<{field}>" if field else "Record<string, never>"
        lines.append(f"export const panel{panel['id']}: Json<Panel<DeepPartial<{options}>, {custom}>> = "
                     f"{json.dumps(panel, indent=2)};")
    return "\n".join(lines) + "\n"


def type_check(tsc, tmp_path, sources):
    """tsc --noEmit over {file name: source}: (exit status, output)."""
    types = MODULES / "@grafana" / "schema" / "dist" / "types"
    paths = {"@grafana/schema": [str(types / "index.d.ts")]}
    for kind, _, _ in PANEL_TYPES.values():
        paths[f"panelcfg/{kind}"] = [str(types / "raw" / "composable" / kind / "panelcfg" / "x" / "types.gen.d.ts")]
    for name, source in sources.items():
        (tmp_path / name).write_text(source)
    (tmp_path / "tsconfig.json").write_text(json.dumps({
        "compilerOptions": {"strict": True, "noEmit": True, "target": "es2020", "module": "es2020",
                            "moduleResolution": "node", "skipLibCheck": True, "types": [],
                            "baseUrl": ".", "paths": paths},
        "files": sorted(sources)}))
    result = subprocess.run(["node", str(tsc), "-p", str(tmp_path / "tsconfig.json")], cwd=tmp_path,
                            capture_output=True, text=True, timeout=300)
    return result.returncode, result.stdout + result.stderr


def test_dashboard_type_checks_against_grafanas_schema(tsc, tmp_path):
    dashboard = load()
    assert {p["type"] for p in panels(dashboard)} <= set(PANEL_TYPES)
    good = typescript_of(dashboard)
    # The same with one wrong value: tsc must see it, or the types were never applied.
    bad = json.loads(json.dumps(dashboard))
    stat = next(p for p in bad["panels"] if p["type"] == "stat")
    stat["fieldConfig"]["defaults"]["thresholds"]["mode"] = "relative-ish"
    table = next(p for p in bad["panels"] if p["type"] == "table")
    table["fieldConfig"]["defaults"]["unitt"] = "short"
    status, output = type_check(tsc, tmp_path, {"dashboard.ts": good, "wrong.ts": typescript_of(bad)})
    errors = [line for line in output.splitlines() if "error TS" in line]
    assert status != 0 and errors
    assert [e for e in errors if not e.startswith("wrong.ts")] == [], output
    assert any("relative-ish" in e for e in errors) and any('"unitt"' in e for e in errors), output


# --- the panels' settings ----------------------------------------------------

def test_tables_are_instant_and_merged():
    tables = [p for p in panels(load()) if p["type"] == "table"]
    assert len(tables) == 2
    for table in tables:
        assert all(t.get("format") == "table" and t.get("instant") is True for t in table["targets"])
        assert [t["id"] for t in table["transformations"]][:1] == ["merge"], table["title"]


def test_health_turns_red():
    (stat,) = [p for p in panels(load()) if p["type"] == "stat"]
    steps = stat["fieldConfig"]["defaults"]["thresholds"]["steps"]
    assert [(s["color"], s["value"]) for s in steps] == [("green", None), ("red", 1)]  # counts of what is wrong
    ones = {}  # the 1-when-good figures (driver read, allocator readable) turn red at 0
    for override in stat["fieldConfig"]["overrides"]:
        assert override["matcher"]["id"] == "byFrameRefID"
        (prop,) = override["properties"]
        ones[override["matcher"]["options"]] = [(s["color"], s["value"]) for s in prop["value"]["steps"]]
    assert ones == {"A": [("red", None), ("green", 1)], "B": [("red", None), ("green", 1)]}
    assert "driver_read" in stat["targets"][0]["expr"] and "allocator_readable" in stat["targets"][1]["expr"]


def test_promised_share_is_bounded_and_guarded():
    (bar,) = [p for p in panels(load()) if p["title"] == "Memory promised / promisable"]
    defaults = bar["fieldConfig"]["defaults"]
    assert (defaults["unit"], defaults["min"], defaults["max"]) == ("percentunit", 0, 1)
    assert re.search(r"/ \(hami_gpu_memory_capacity_bytes\{[^}]*\} > 0\)$", bar["targets"][0]["expr"])


def test_waiting_threads_are_a_plain_number():
    (panel,) = [p for p in panels(load()) if p["title"].startswith("Throttled and paused")]
    assert panel["fieldConfig"]["defaults"]["unit"] == "short"


def test_node_is_picked_by_name():
    dashboard = load()
    variable = next(v for v in dashboard["templating"]["list"] if v["name"] == "node")
    assert variable["query"]["query"] == "label_values(hami_node_info, node)"
    assert not any("instance" in json.dumps(v.get("query")) for v in dashboard["templating"]["list"])
    for panel in panels(dashboard):
        for target in panel["targets"]:
            assert 'node=~"$node"' in target["expr"] and "instance" not in target["expr"], target["expr"]
            assert "instance" not in target.get("legendFormat", ""), target


# --- every query, run by Prometheus ------------------------------------------

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def query(base, expr):
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:  # a bad query: 400 with the error in the body
        return json.loads(exc.read())


def concrete(expr):
    """A dashboard query as Grafana sends it with this node picked and all else All."""
    for variable, value in (("$node", NODE_NAME), ("$gpu", ".*"), ("$namespace", ".*"),
                            ("$__rate_interval", "1m")):
        expr = expr.replace(variable, value)
    assert "$" not in expr, expr
    return expr


@pytest.fixture
def prometheus(node, sim_env, tmp_path):
    """`hamictl metrics` and a Prometheus scraping it every second; yields the
    Prometheus' base URL once it holds two scrapes (rate() needs two)."""
    if shutil.which("prometheus") is None:
        subprocess.run(["bash", str(ROOT / "scripts" / "install-deps.sh"), "prometheus"], check=True,
                       timeout=600)
    metrics = Server(node["config"], sim_env)
    target = urllib.parse.urlsplit(metrics.url).netloc
    config = tmp_path / "prometheus.yml"
    config.write_text("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
                      f"scrape_configs:\n  - job_name: hami\n    static_configs:\n      - targets: ['{target}']\n")
    port = free_port()
    log = (tmp_path / "prometheus.log").open("w")
    proc = subprocess.Popen(["prometheus", f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                             f"--web.listen-address=127.0.0.1:{port}"], cwd=tmp_path,
                            stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, (tmp_path / "prometheus.log").read_text()
            try:
                scrapes = query(base, 'count_over_time(up{job="hami"}[1m])')
                if scrapes["status"] == "success" and scrapes["data"]["result"] and \
                        float(scrapes["data"]["result"][0]["value"][1]) >= 3:
                    break
            except OSError:
                pass  # not listening yet
            assert time.monotonic() < deadline, (tmp_path / "prometheus.log").read_text()
            time.sleep(0.5)
        up = query(base, 'up{job="hami"}')["data"]["result"]
        assert [r["value"][1] for r in up] == ["1"], up
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        log.close()
        metrics.stop()


def test_every_query_runs_on_prometheus(prometheus):
    dashboard = load()
    ran = 0
    for panel in panels(dashboard):
        for target in panel["targets"]:
            expr = concrete(target["expr"])
            answer = query(prometheus, expr)
            assert answer["status"] == "success", (panel["title"], expr, answer)
            result = answer["data"]["result"]
            # on this node every panel has something to show, and says which node
            assert result, (panel["title"], expr)
            assert all(r["metric"].get("node") == NODE_NAME for r in result), (expr, result)
            ran += 1
    assert ran == sum(len(p["targets"]) for p in panels(dashboard))
    # the variables' label_values(metric, label) queries find this node's values
    for variable in dashboard["templating"]["list"]:
        if not isinstance(variable.get("query"), dict):
            continue
        found = re.fullmatch(r"label_values\((.*), (\w+)\)", variable["query"]["query"])
        assert found, variable
        answer = query(prometheus, concrete(found.group(1)))
        assert answer["status"] == "success", answer
        # (Prometheus keeps no empty label: a container outside a pod has no pod_namespace)
        values = {r["metric"][found.group(2)] for r in answer["data"]["result"] if found.group(2) in r["metric"]}
        assert values, (variable["name"], answer)
        if variable["name"] == "node":
            assert values == {NODE_NAME}


def test_series_of_every_kind_carry_the_node(prometheus):
    """Not only the HAMi-named ones: every series the endpoint serves names its node."""
    answer = query(prometheus, '{job="hami", node!="%s", __name__!~"up|scrape_.*"}' % NODE_NAME)
    assert answer["status"] == "success" and answer["data"]["result"] == [], answer
    names = query(prometheus, 'count by (__name__) ({job="hami", node="%s"})' % NODE_NAME)["data"]["result"]
    assert {"hami_container_info", "hami_gpu_info", "hami_node_info", "HostGPUMemoryUsage",
            "vGPU_device_memory_usage_in_bytes"} <= {r["metric"]["__name__"] for r in names}
