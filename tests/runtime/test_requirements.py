"""NVIDIA_REQUIRE_* read as NVIDIA's runtime reads them (table-driven), and
checked at create through the runtime: an unmet condition is refused by name."""
import pytest

from hami_runtime.errors import HamiError
from hami_runtime.lifecycle.request.requirements import NodeFacts, check

NODE = NodeFacts(cuda="12.4", driver="550.54.15", gpus=[{"arch": "9.0", "brand": "nvidia"}] * 2)
# what the nvidia/cuda:12.4.1 images carry
CUDA_IMAGE = ("cuda>=12.4 brand=tesla,driver>=470,driver<471 brand=unknown,driver>=470,driver<471 "
              "brand=nvidia,driver>=470,driver<471 brand=geforce,driver>=470,driver<471")


@pytest.mark.parametrize("env", [
    {},
    {"NVIDIA_REQUIRE_CUDA": "cuda>=12.4"},
    {"NVIDIA_REQUIRE_CUDA": "cuda>=12"},
    {"NVIDIA_REQUIRE_CUDA": CUDA_IMAGE},
    {"NVIDIA_REQUIRE_CUDA": "cuda>=13.0 brand=nvidia"},          # space: or
    {"NVIDIA_REQUIRE_DRIVER": "driver>=550,driver<551"},          # comma: and
    {"NVIDIA_REQUIRE_ARCH": "arch>=8.0"},
    {"NVIDIA_REQUIRE_BRAND": "brand=NVIDIA"},                     # brands ignore case
    {"NVIDIA_REQUIRE_CUDA": "cuda>=99.0", "NVIDIA_DISABLE_REQUIRE": "true"},
    {"NVIDIA_REQUIRE_CUDA": "cuda>=99.0", "NVIDIA_DISABLE_REQUIRE": "1"},
    {"NVIDIA_REQUIRE_CUDA": "mig>=1,cuda>=12.0"},                 # unknown property: skipped
    {"NVIDIA_REQUIRE_JETPACK": "jetpack>=99"},                    # Jetson only
    {"CUDA_VERSION": "12.4.1"},                                   # legacy image: cuda>=12.4
    {"CUDA_VERSION": "99.0", "NVIDIA_REQUIRE_CUDA": "cuda>=12.0"},  # the requirement wins
    {"NVIDIA_REQUIRE_CUDA": ""},
])
def test_met(env):
    check(env, NODE)


@pytest.mark.parametrize("env,variable,unmet", [
    ({"NVIDIA_REQUIRE_CUDA": "cuda>=13.0"}, "NVIDIA_REQUIRE_CUDA", "cuda>=13.0"),
    ({"NVIDIA_REQUIRE_CUDA": CUDA_IMAGE.replace("cuda>=12.4", "cuda>=12.8")}, "NVIDIA_REQUIRE_CUDA",
     "cuda>=12.8 or brand=tesla or brand=unknown or driver<471 or brand=geforce"),
    ({"NVIDIA_REQUIRE_DRIVER": "driver>=550,driver<550.40"}, "NVIDIA_REQUIRE_DRIVER", "driver<550.40"),
    ({"NVIDIA_REQUIRE_ARCH": "arch=8.0"}, "NVIDIA_REQUIRE_ARCH", "arch=8.0"),
    ({"NVIDIA_REQUIRE_BRAND": "brand!=nvidia"}, "NVIDIA_REQUIRE_BRAND", "brand!=nvidia"),
    ({"NVIDIA_REQUIRE_CUDA": "cuda>=12.0", "NVIDIA_REQUIRE_X": "driver>600"}, "NVIDIA_REQUIRE_X",
     "driver>600"),                                               # every variable must hold
    ({"CUDA_VERSION": "12.8.0"}, "CUDA_VERSION", "cuda>=12.8"),
    ({"NVIDIA_REQUIRE_CUDA": "cuda>=99", "NVIDIA_DISABLE_REQUIRE": "false"}, "NVIDIA_REQUIRE_CUDA",
     "cuda>=99"),
])
def test_unmet_is_refused_by_name(env, variable, unmet):
    with pytest.raises(HamiError) as caught:
        check(env, NODE)
    assert caught.value.field == variable
    assert f"unsatisfied condition: {unmet} (this node: CUDA 12.4, driver 550.54.15" in str(caught.value)


@pytest.mark.parametrize("env,field", [
    ({"NVIDIA_REQUIRE_CUDA": "cuda"}, "NVIDIA_REQUIRE_CUDA"),
    ({"NVIDIA_REQUIRE_CUDA": "cuda>=twelve"}, "NVIDIA_REQUIRE_CUDA"),
    ({"NVIDIA_REQUIRE_CUDA": "cuda=>12"}, "NVIDIA_REQUIRE_CUDA"),
    ({"CUDA_VERSION": "latest"}, "CUDA_VERSION"),
])
def test_malformed_is_refused_by_name(env, field):
    with pytest.raises(HamiError) as caught:
        check(env, NODE)
    assert caught.value.field == field


# ---- through the runtime (runc bundles, the simulated driver: CUDA 12.4, driver 550.54.15) ----

def created(node, cid, env):
    return node.create(cid, node.bundle(cid, env=env, args=("true",)))


@pytest.mark.parametrize("env", [
    ["NVIDIA_VISIBLE_DEVICES=all", f"NVIDIA_REQUIRE_CUDA={CUDA_IMAGE}"],
    ["NVIDIA_VISIBLE_DEVICES=0", "HAMI_GPUMEM=1000", "NVIDIA_REQUIRE_CUDA=cuda>=13.0",
     "NVIDIA_DISABLE_REQUIRE=true"],
    ["NVIDIA_VISIBLE_DEVICES=0", "HAMI_GPUMEM=1000", "NVIDIA_REQUIRE_ARCH=arch>=9.0",
     "NVIDIA_REQUIRE_BRAND=brand=nvidia"],
])
def test_met_requirements_create(node, env):
    proc = created(node, "met", env)
    assert proc.returncode == 0, proc.stderr
    assert list(node.allocations()) == ["met"]


@pytest.mark.parametrize("env,line", [
    (["NVIDIA_VISIBLE_DEVICES=0", "HAMI_GPUMEM=1000", "NVIDIA_REQUIRE_CUDA=cuda>=13.0 brand=tesla"],
     "hami-runtime: NVIDIA_REQUIRE_CUDA='cuda>=13.0 brand=tesla': unsatisfied condition: cuda>=13.0 "
     "or brand=tesla (this node: CUDA 12.4, driver 550.54.15; GPU arch 9.0 brand nvidia)\n"),
    (["NVIDIA_VISIBLE_DEVICES=all", "CUDA_VERSION=12.8.0"],
     "hami-runtime: CUDA_VERSION='12.8.0': unsatisfied condition: cuda>=12.8 (this node: CUDA "
     "12.4, driver 550.54.15; GPU arch 9.0 brand nvidia; GPU arch 9.0 brand nvidia)\n"),
])
def test_unmet_requirement_refuses_the_create(node, env, line):
    proc = created(node, "unmet", env)
    assert (proc.returncode, proc.stderr) == (1, line)
    assert node.allocations() == {} and node.containers() == []
