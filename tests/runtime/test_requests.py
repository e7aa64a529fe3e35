"""Request parsing: annotations and env in, a request or a refusal naming key and value."""
import json
from pathlib import Path

import jsonschema
import pytest

from hami_runtime.errors import HamiError
from hami_runtime.lifecycle.request.request_keys import mentions_request
from hami_runtime.lifecycle.request.requests import parse

ANNOTATION_SCHEMA = json.loads(
    (Path(__file__).resolve().parents[2] / "schemas" / "annotations.schema.json").read_text())
UUID_A = "GPU-aaaaaaaa-0000-0000-0000-000000000000"
UUID_B = "GPU-bbbbbbbb-0000-0000-0000-000000000000"
MIG_A = "MIG-aaaaaaaa-1111-0000-0000-000000000000"
CDI = "cdi.k8s.io/nvidia-device-plugin_uuid"  # as NVIDIA's device plugin names its annotation


@pytest.mark.parametrize("annotations,env,expected", [
    ({}, [], None),
    ({"io.kubernetes.cri.container-name": "x"}, ["PATH=/bin"], None),
    ({"hami.io/gpumem": "3000", "hami.io/gpucores": "30"}, [],
     dict(count=1, mem_mib=3000, cores=30, source="annotations")),
    ({"nvidia.com/gpumem": "1024"}, [], dict(mem_mib=1024)),
    ({"hami.io/gpumem": "1024", "nvidia.com/gpumem": "1024"}, [], dict(mem_mib=1024)),
    ({"hami.io/gpu": "2", "hami.io/gpumem-percentage": "50"}, [], dict(count=2, mem_percentage=50)),
    ({"hami.io/gpu": "1", "hami.io/gpu-uuid": f"{UUID_A}, {UUID_B}"}, [],
     dict(use_uuids=(UUID_A, UUID_B))),
    ({"hami.io/gpu": "1", "hami.io/use-gputype": "A100,H100", "hami.io/nouse-gputype": "MIG"}, [],
     dict(use_types=("a100", "h100"), avoid_types=("mig",))),
    ({"hami.io/gpu": "1", "hami.io/core-policy": "force", "hami.io/priority": "0"}, [],
     dict(core_policy="force", priority=0)),
    ({"hami.io/vgpu-devices-allocated": f"{UUID_A},NVIDIA,2000,25:;"}, [],
     dict(count=1, assigned=((UUID_A, 2000, 25),))),
    ({"hami.io/gpu": "1"}, [], dict(oversubscribe=True)),
    ({"hami.io/gpu": "1", "hami.io/oversubscribe": "false"}, [], dict(oversubscribe=False)),
    ({"hami.io/gpu": "1", "nvidia.com/oversubscribe": "true"}, [], dict(oversubscribe=True)),
    ({"hami.io/vgpu-devices-allocated": f"{UUID_A},NVIDIA,2000,25:{UUID_B},NVIDIA,1000,0:"}, [],
     dict(count=2, assigned=((UUID_A, 2000, 25), (UUID_B, 1000, 0)))),
    ({}, ["NVIDIA_VISIBLE_DEVICES=all"], dict(count=None, source="env")),
    ({}, ["NVIDIA_VISIBLE_DEVICES=none", "PATH=/bin"], None),
    ({}, ["NVIDIA_VISIBLE_DEVICES=void"], None),
    ({}, ["NVIDIA_VISIBLE_DEVICES=0,1", "HAMI_GPUMEM=512", "HAMI_GPUCORES=10"],
     dict(count=2, use_indices=(0, 1), mem_mib=512, cores=10)),
    ({}, [f"NVIDIA_VISIBLE_DEVICES={UUID_B}", "HAMI_GPUMEM_PERCENTAGE=25"],
     dict(count=1, use_uuids=(UUID_B,), mem_percentage=25)),
    ({}, ["HAMI_GPUMEM=100"], dict(count=1, mem_mib=100)),
    ({"hami.io/gpumem": "10"}, ["NVIDIA_VISIBLE_DEVICES=all"], dict(count=1, mem_mib=10)),
    # gpu-uuid alone asks for that one GPU
    ({"hami.io/gpu-uuid": UUID_A}, [], dict(count=1, use_uuids=(UUID_A,))),
    ({"nvidia.com/gpu-uuid": UUID_B}, [], dict(count=1, use_uuids=(UUID_B,))),
    # MIG instances by GPU:MIG index or UUID; CDI names, bare names' equals
    ({}, ["NVIDIA_VISIBLE_DEVICES=0:1,1:0"], dict(count=2, use_mig_indices=("0:1", "1:0"), use_indices=())),
    ({}, ["NVIDIA_VISIBLE_DEVICES=1,00:02"], dict(count=2, use_indices=(1,), use_mig_indices=("0:2",))),
    ({}, [f"NVIDIA_VISIBLE_DEVICES={MIG_A}"], dict(count=1, use_uuids=(MIG_A,))),
    ({}, ["NVIDIA_VISIBLE_DEVICES=nvidia.com/gpu=0,nvidia.com/gpu=1"], dict(count=2, use_indices=(0, 1))),
    ({}, ["NVIDIA_VISIBLE_DEVICES=nvidia.com/gpu=all"], dict(count=None, source="env")),
    ({}, [f"NVIDIA_VISIBLE_DEVICES=nvidia.com/gpu={UUID_A}", "HAMI_GPUMEM=100"],
     dict(count=1, use_uuids=(UUID_A,), mem_mib=100)),
    ({}, ["NVIDIA_VISIBLE_DEVICES=nvidia.com/gpu=0:1"], dict(count=1, use_mig_indices=("0:1",))),
    ({CDI: f"nvidia.com/gpu={UUID_A}"}, [], dict(count=1, use_uuids=(UUID_A,), source="annotations")),
    ({CDI: f"nvidia.com/gpu={UUID_A},nvidia.com/gpu={UUID_B}", "hami.io/gpumem": "1000"}, [],
     dict(count=2, use_uuids=(UUID_A, UUID_B), mem_mib=1000)),
    ({"cdi.k8s.io/a": "nvidia.com/gpu=all", "hami.io/gpucores": "20"}, [], dict(count=None, cores=20)),
    ({"cdi.k8s.io/a": "nvidia.com/gpu=0:1"}, ["NVIDIA_VISIBLE_DEVICES=all"], dict(use_mig_indices=("0:1",))),
    ({"cdi.k8s.io/a": "vendor.com/net=eth0", "cdi.k8s.io/b": "nvidia.com/gpu=1"}, [], dict(use_indices=(1,))),
    # another vendor's CDI devices are the engine's
    ({"cdi.k8s.io/net": "vendor.com/net=eth0"}, [], None),
    # keys that only shape a request ask for nothing by themselves
    ({"hami.io/priority": "0"}, [], None),
    ({"hami.io/core-policy": "force"}, [], None),
    ({"hami.io/oversubscribe": "false"}, [], None),
    ({"hami.io/use-gputype": "A100", "nvidia.com/nouse-gpu-uuid": UUID_A}, [], None),
])
def test_parses(annotations, env, expected):
    jsonschema.validate(annotations, ANNOTATION_SCHEMA)
    request = parse(annotations, env)
    # The cheap pre-check never hides a request.
    assert mentions_request(annotations, env, True) or request is None
    if expected is None:
        assert request is None
        return
    for name, value in expected.items():
        got = getattr(request, name)
        if name == "assigned":
            got = tuple((d.uuid, d.mem_mib, d.cores) for d in got)
        assert got == value, name


@pytest.mark.parametrize("annotations,env,expected", [
    ({"hami.io/gpu": "1"}, [], "force"),
    ({}, ["NVIDIA_VISIBLE_DEVICES=all"], "force"),
    ({"hami.io/gpu": "1", "hami.io/core-policy": "default"}, [], "default"),
])
def test_the_node_core_policy_applies_where_the_request_names_none(annotations, env, expected):
    assert parse(annotations, env, core_policy="force").core_policy == expected


def test_env_requests_can_be_turned_off():
    assert parse({}, ["NVIDIA_VISIBLE_DEVICES=all"], env_requests=False) is None
    assert parse({"hami.io/gpu": "1"}, [], env_requests=False).count == 1


@pytest.mark.parametrize("annotations,env,key,value", [
    ({"hami.io/gpumem": "3g"}, [], "hami.io/gpumem", "3g"),
    ({"hami.io/gpumem": "-1"}, [], "hami.io/gpumem", "-1"),
    ({"hami.io/gpumem": "0"}, [], "hami.io/gpumem", "0"),
    ({"hami.io/gpucores": "101"}, [], "hami.io/gpucores", "101"),
    ({"hami.io/gpu": "0"}, [], "hami.io/gpu", "0"),
    ({"hami.io/gpu": "17"}, [], "hami.io/gpu", "17"),
    ({"hami.io/gpumem-percentage": "120"}, [], "hami.io/gpumem-percentage", "120"),
    ({"hami.io/gpumem": "1", "hami.io/gpumem-percentage": "5"}, [], "hami.io/gpumem-percentage", "5"),
    ({"hami.io/gpumem": "1", "nvidia.com/gpumem": "2"}, [], "nvidia.com/gpumem", "2"),
    ({"hami.io/gpu": "1", "hami.io/core-policy": "max"}, [], "hami.io/core-policy", "max"),
    ({"hami.io/gpu": "1", "hami.io/priority": "2"}, [], "hami.io/priority", "2"),
    ({"hami.io/gpu": "1", "hami.io/oversubscribe": "no"}, [], "hami.io/oversubscribe", "no"),
    ({"hami.io/gpu": "1", "hami.io/oversubscribe": "False"}, [], "hami.io/oversubscribe", "False"),
    ({"hami.io/gpu": "1", "hami.io/oversubscribe": "true\n"}, [], "hami.io/oversubscribe", "true\n"),
    ({"hami.io/gpu": "1", "hami.io/oversubscribe": "true", "nvidia.com/oversubscribe": "false"}, [],
     "nvidia.com/oversubscribe", "false"),
    ({"hami.io/gpu": "1", "hami.io/gpu-uuid": UUID_A, "hami.io/nouse-gpu-uuid": UUID_A}, [],
     "hami.io/nouse-gpu-uuid", UUID_A),
    ({"hami.io/gpu": "1", "hami.io/gpu-uuid": "../etc"}, [], "hami.io/gpu-uuid", "../etc"),
    ({"hami.io/vgpu-devices-allocated": f"{UUID_A},NVIDIA,1,1:;{UUID_B},NVIDIA,1,1:;"}, [],
     "hami.io/vgpu-devices-allocated", None),
    ({"hami.io/vgpu-devices-allocated": f"{UUID_A},AMD,1,1:;"}, [],
     "hami.io/vgpu-devices-allocated", None),
    ({"hami.io/vgpu-devices-allocated": f"{UUID_A},NVIDIA,lots,1:"}, [],
     "hami.io/vgpu-devices-allocated", None),
    ({"hami.io/gpu": "2", "hami.io/vgpu-devices-allocated": f"{UUID_A},NVIDIA,1,1:"}, [],
     "hami.io/gpu", "2"),
    ({}, ["NVIDIA_VISIBLE_DEVICES=0,GPU-x"], "NVIDIA_VISIBLE_DEVICES", "0,GPU-x"),
    ({}, ["NVIDIA_VISIBLE_DEVICES=zero"], "NVIDIA_VISIBLE_DEVICES", "zero"),
    ({}, ["NVIDIA_VISIBLE_DEVICES=0", "HAMI_GPUMEM=1.5"], "HAMI_GPUMEM", "1.5"),
    ({}, ["NVIDIA_VISIBLE_DEVICES=none", "HAMI_GPUMEM=5"], "HAMI_GPUMEM", "5"),
    ({}, ["HAMI_GPUMEM=5", "HAMI_GPUMEM_PERCENTAGE=5"], "HAMI_GPUMEM_PERCENTAGE", "5"),
    ({}, ["NVIDIA_VISIBLE_DEVICES=vendor.com/gpu=0"], "NVIDIA_VISIBLE_DEVICES", "vendor.com/gpu=0"),
    ({}, ["NVIDIA_VISIBLE_DEVICES=nvidia.com/gpu=zero"], "NVIDIA_VISIBLE_DEVICES", "nvidia.com/gpu=zero"),
    ({}, ["NVIDIA_VISIBLE_DEVICES=all,0"], "NVIDIA_VISIBLE_DEVICES", "all,0"),
    ({}, [f"NVIDIA_VISIBLE_DEVICES=0:1,{MIG_A}"], "NVIDIA_VISIBLE_DEVICES", f"0:1,{MIG_A}"),
    ({}, ["NVIDIA_VISIBLE_DEVICES=0:1,0:01"], "NVIDIA_VISIBLE_DEVICES", "0:1,0:01"),
    ({}, ["NVIDIA_VISIBLE_DEVICES=0:x"], "NVIDIA_VISIBLE_DEVICES", "0:x"),
    ({}, ["NVIDIA_VISIBLE_DEVICES=0:1:2"], "NVIDIA_VISIBLE_DEVICES", "0:1:2"),
    ({}, ["NVIDIA_VISIBLE_DEVICES=2000"], "NVIDIA_VISIBLE_DEVICES", "2000"),
    ({}, [f"NVIDIA_VISIBLE_DEVICES=MIG-{UUID_A}/1/0"], "NVIDIA_VISIBLE_DEVICES", f"MIG-{UUID_A}/1/0"),
    ({CDI: "nvidia.com/gpu=0", "hami.io/gpu-uuid": UUID_A}, [], CDI, "nvidia.com/gpu=0"),
    ({CDI: "nvidia.com/gpu=0,nvidia.com/gpu=1", "hami.io/gpu": "1"}, [], "hami.io/gpu", "1"),
    ({"cdi.k8s.io/a": "nvidia.com/gpu=0", "cdi.k8s.io/b": "nvidia.com/gpu=1"}, [], "cdi.k8s.io/b", None),
    ({CDI: "nvidia.com/gpu=GPU 1"}, [], CDI, "nvidia.com/gpu=GPU 1"),
    # numbers are plain ASCII digits, nothing around them
    ({"hami.io/gpumem": "100\n"}, [], "hami.io/gpumem", "100\n"),
    ({"hami.io/gpumem": " 100"}, [], "hami.io/gpumem", " 100"),
    ({"hami.io/gpucores": "3\u0660"}, [], "hami.io/gpucores", "3\u0660"),
    ({"hami.io/gpu": "\uff11"}, [], "hami.io/gpu", "\uff11"),
    ({"hami.io/gpu": "+1"}, [], "hami.io/gpu", "+1"),
    ({}, ["NVIDIA_VISIBLE_DEVICES=0", "HAMI_GPUCORES=10\n"], "HAMI_GPUCORES", "10\n"),
    ({"hami.io/gpu": "1", "hami.io/core-policy": "force\n"}, [], "hami.io/core-policy", "force\n"),
    ({"hami.io/vgpu-devices-allocated": f"{UUID_A},NVIDIA,10\n,1:"}, [],
     "hami.io/vgpu-devices-allocated", None),
    ({"hami.io/gpu-uuid": f"{UUID_A}\n"}, [], "hami.io/gpu-uuid", f"{UUID_A}\n"),
])
def test_refuses_naming_key_and_value(annotations, env, key, value):
    with pytest.raises(HamiError) as caught:
        parse(annotations, env)
    assert caught.value.field == key
    if value is not None:
        assert caught.value.value == value
    assert "\n" not in caught.value.line() and key in caught.value.line()


@pytest.mark.parametrize("annotations", [
    {"hami.io/gpumem": "3g"}, {"hami.io/gpumem": "0"}, {"hami.io/gpucores": "101"},
    {"hami.io/gpu": "17"}, {"hami.io/gpumem-percentage": "0"}, {"hami.io/gpu": "1", "hami.io/priority": "2"},
    {"hami.io/gpu": "1", "hami.io/core-policy": "max"}, {"nvidia.com/gpu": "x"},
    {"hami.io/vgpu-devices-allocated": "GPU-a,AMD,1,1:"}, {"hami.io/gpumem": "100\n"},
    {"hami.io/gpu": " 1"}, {"hami.io/gpu-uuid": "GPU-a\n"},
    {"hami.io/gpu": "1", "hami.io/oversubscribe": "yes"}, {CDI: "nvidia.com/gpu=GPU 1"},
])
def test_schema_refuses_what_the_parser_refuses(annotations):
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(annotations, ANNOTATION_SCHEMA)
    with pytest.raises(HamiError):
        parse(annotations, [])
