"""hamictl top and metrics over containers the runtime made: each shows the policy
and priority it was created with, and one id under two runc roots is two
containers, each with its own root."""
import json

from hami_runtime.lifecycle.state_layout import root_key

from .node import RUNTIME

# (runc root dir under the node's tmp, annotations) -> what top shows of it
CONTAINERS = [
    ("runc-root", {"hami.io/gpumem": "1000", "hami.io/gpucores": "30",
                   "hami.io/core-policy": "force", "hami.io/priority": "0"}, ("force", 0, 30)),
    ("runc-other", {"hami.io/gpumem": "500"}, ("default", 1, 0)),
]


def test_top_tells_roots_apart_and_shows_policy(node):
    roots = []
    for i, (root, annotations, _) in enumerate(CONTAINERS):
        path = node.tmp / root
        result = node.runtime("--root", str(path), "create", "--bundle",
                              str(node.bundle(f"b{i}", annotations)), "same", cmd=RUNTIME)
        assert result.returncode == 0, result.stderr
        roots.append(str(path))
    try:
        top = node.hamictl("top", "--interval", "0", "--json")
        assert top.returncode == 0, top.stderr
        seen = {c["runc_root"]: c for c in json.loads(top.stdout)["containers"]}
        assert sorted(seen) == sorted(roots)
        for root, (_, _, (policy, priority, cores)) in zip(roots, CONTAINERS):
            c = seen[root]
            assert (c["id"], c["name"], c["root_key"]) == ("same", f"same@{root_key(root)}",
                                                           root_key(root))
            assert (c["core_policy"], c["priority"], c["devices"][0]["sm_limit_pct"]) == (
                policy, priority, cores)
        table = node.hamictl("top", "--interval", "0").stdout.splitlines()
        rows = sorted(tuple(line.split()[i] for i in (1, 4, 5)) for line in table
                      if line.startswith("same "))
        assert rows == sorted((root, policy, ("high", "low")[priority])
                              for root, (_, _, (policy, priority, _)) in zip(roots, CONTAINERS))
    finally:
        for root in roots:
            node.runtime("--root", root, "delete", "-f", "same", cmd=RUNTIME)
