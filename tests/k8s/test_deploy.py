"""deploy/'s manifests: each one valid against Kubernetes' own schemas (strict:
no field the API server would drop), and wired to each other as the docs say."""
import tomllib
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from kubernetes_validate import utils as kv_utils

from hami_runtime.config_model import NodeConfig
from tests.conftest import ROOT

DEPLOY = ROOT / "deploy"
# the oldest Kubernetes still served upstream's patches at the time of writing, and the newest
# the validator knows
VERSIONS = ["1.31.0", sorted(kv_utils.all_versions(), key=lambda v: tuple(map(int, v.split("."))))[-1]]


def project_version():
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


def documents(*files):
    return [doc for path in files for doc in yaml.safe_load_all(Path(path).read_text()) if doc]


def install_docs():
    return documents(*sorted(DEPLOY.glob("*.yaml")))


def uninstall_docs():
    return documents(*sorted((DEPLOY / "uninstall").glob("*.yaml")))


def by_kind(docs, kind):
    return [d for d in docs if d["kind"] == kind]


@pytest.mark.parametrize("version", VERSIONS)
def test_every_manifest_is_valid_strictly(version):
    docs = install_docs() + uninstall_docs()
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == sorted(["Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "ConfigMap",
                            "RuntimeClass", "DaemonSet", "Service", "DaemonSet"]), kinds
    for doc in docs:
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{doc['kind']}/{doc['metadata']['name']} on Kubernetes {version}: {exc}")


def test_manifests_are_wired_together():
    docs = install_docs()
    [ns] = by_kind(docs, "Namespace")
    namespace = ns["metadata"]["name"]
    assert namespace == "hami-system"
    assert all(d["metadata"].get("namespace", namespace) == namespace for d in docs)
    [runtime_class] = by_kind(docs, "RuntimeClass")
    assert runtime_class["handler"] == "hami"
    assert runtime_class["scheduling"]["nodeSelector"] == {"hami.io/runtime": "ready"}
    [role] = by_kind(docs, "ClusterRole")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]}]
    [ds] = by_kind(docs, "DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    assert ds["spec"]["selector"]["matchLabels"].items() <= ds["spec"]["template"]["metadata"]["labels"].items()
    assert pod["serviceAccountName"] == by_kind(docs, "ServiceAccount")[0]["metadata"]["name"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists"} in pod["tolerations"]
    image = f"hami-runtime-node:{project_version()}"
    every = pod["initContainers"] + pod["containers"]
    assert {c["image"] for c in every} == {image}
    [install] = pod["initContainers"]
    assert install["command"][:3] == ["python3", "/opt/hami-runtime/packaging/node_installer.py", "install"]
    assert install["securityContext"] == {"privileged": True}
    [host] = [v for v in pod["volumes"] if v["name"] == "host"]
    assert host["hostPath"]["path"] == "/"
    commands = {c["name"]: c["command"] for c in pod["containers"]}
    assert commands["agent"][:4] == ["chroot", "/host", "/usr/local/hami/bin/hamictl", "agent"]
    assert commands["metrics"][3:] == ["metrics", "--listen", "0.0.0.0:9464"]
    [metrics] = [c for c in pod["containers"] if c["name"] == "metrics"]
    assert metrics["ports"] == [{"name": "metrics", "containerPort": 9464, "protocol": "TCP"}]
    [service] = by_kind(docs, "Service")
    assert service["spec"]["selector"] == ds["spec"]["selector"]["matchLabels"]
    assert service["spec"]["ports"][0]["name"] == "metrics"
    assert service["spec"]["ports"][0]["targetPort"] == "metrics"
    assert "app.kubernetes.io/name" in service["metadata"]["labels"]  # what a ServiceMonitor selects
    # the engine and the node config come from the ConfigMap
    [cm] = by_kind(docs, "ConfigMap")
    assert cm["data"]["engine"] in ("containerd", "crio")
    NodeConfig.model_validate(tomllib.loads(cm["data"]["config.toml"]))
    [volume] = [v for v in pod["volumes"] if v["name"] == "node-config"]
    assert volume["configMap"]["name"] == cm["metadata"]["name"]


def test_uninstall_replaces_the_same_daemonset():
    [ds] = by_kind(install_docs(), "DaemonSet")
    [un] = uninstall_docs()
    assert (un["metadata"]["name"], un["metadata"]["namespace"]) == (ds["metadata"]["name"],
                                                                      ds["metadata"]["namespace"])
    assert un["spec"]["selector"] == ds["spec"]["selector"]
    [init] = un["spec"]["template"]["spec"]["initContainers"]
    assert init["command"][2] == "uninstall" and "--restart-engine" in init["command"]
