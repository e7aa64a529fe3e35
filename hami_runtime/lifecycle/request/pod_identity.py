"""Which container of which Kubernetes pod a spec is, from what the CRI engine
writes into it.

containerd's CRI plugin and CRI-O both copy the pod's annotations into every
container's spec, then set their own keys after them (so a pod annotation cannot
pose as one of them): the container's type, the pod sandbox's id and the
container's name in the pod. A pod annotation can still carry the other
engine's keys (CRI-O copies them all; containerd those its allowlist lets
through): a spec with both engines' container type is refused, as one of them
poses as the engine. A spec with neither (podman, ctr, dockerd, runc) is in no pod.
"""
from __future__ import annotations

from typing import NamedTuple


from ...errors import HamiError
from ...names import container_id, dns_label, dns_subdomain

# (type key, sandbox id key, container name key, pod namespace key, pod name key)
ENGINES = (
    ("io.kubernetes.cri.container-type", "io.kubernetes.cri.sandbox-id",        # containerd
     "io.kubernetes.cri.container-name", "io.kubernetes.cri.sandbox-namespace",
     "io.kubernetes.cri.sandbox-name"),
    ("io.kubernetes.cri-o.ContainerType", "io.kubernetes.cri-o.SandboxID",      # CRI-O
     "io.kubernetes.container.name", "io.kubernetes.pod.namespace", "io.kubernetes.pod.name"),
)
CONTAINER_TYPE = "container"
MAX_SANDBOX_ID = 128


class PodMember(NamedTuple):
    """sandbox: the pod sandbox's id; name: the container's name in the pod;
    pod: '<namespace>/<name>' for log lines ('' where the engine does not say)."""
    sandbox: str
    name: str
    pod: str

    def describe(self) -> str:
        return f"container {self.name} of pod {self.pod or 'sandbox ' + self.sandbox[:12]}"


def member(annotations: dict[str, str]) -> PodMember | None:
    """The pod container this spec is, None outside a pod. A CRI container whose
    sandbox id or name is not one is refused, naming the key."""
    typed = [engine[0] for engine in ENGINES if engine[0] in annotations]
    if len(typed) > 1:
        raise HamiError(typed[0], str(annotations[typed[0]]), f"set beside {typed[1]}: one of them is "
                        "a pod annotation posing as the engine's, so which pod this container is in "
                        "cannot be told")
    for type_key, sandbox_key, name_key, namespace_key, pod_key in ENGINES:
        if annotations.get(type_key) != CONTAINER_TYPE:
            continue
        sandbox, name = annotations.get(sandbox_key), annotations.get(name_key)
        if sandbox is None or name is None:
            continue
        if not isinstance(sandbox, str) or len(sandbox) > MAX_SANDBOX_ID or \
                not container_id(sandbox) or ".." in sandbox:
            raise HamiError(sandbox_key, sandbox if isinstance(sandbox, str) else repr(sandbox),
                            f"not a pod sandbox id (letters, digits, '_', '.', '+', '-'; at most "
                            f"{MAX_SANDBOX_ID})")
        if not isinstance(name, str) or not dns_label(name):
            raise HamiError(name_key, name if isinstance(name, str) else repr(name),
                            "not a Kubernetes container name (a DNS label: a-z, 0-9, '-', at most 63)")
        namespace, pod = annotations.get(namespace_key), annotations.get(pod_key)
        shown = f"{namespace}/{pod}" if isinstance(namespace, str) and dns_label(namespace) and \
            isinstance(pod, str) and dns_subdomain(pod) else ""
        return PodMember(sandbox, name, shown)
    return None
