"""Allocation over literal GPUs and allocations: capacity, filters, policies."""
import pytest

from hami_runtime.errors import HamiError
from hami_runtime.lifecycle.node_state.allocator import allocate
from hami_runtime.lifecycle.request.requests import parse
from hami_runtime.node.gpu import GpuInfo

GPUS = [GpuInfo(0, "GPU-0", "NVIDIA A100-SXM4-40GB", 40960, 0),
        GpuInfo(1, "GPU-1", "NVIDIA H100 80GB HBM3", 81920, 1)]


def entry(*devices):
    return {"devices": [{"uuid": u, "mem_mib": m, "cores": c} for u, m, c in devices]}


def run(annotations, entries=(), env=(), **kw):
    options = dict(split_count=10, memory_scaling=1.0, policy="binpack")
    options.update(kw)
    return [(g.uuid, g.mem_mib, g.cores) for g in allocate(parse(annotations, list(env)), GPUS,
                                                           list(entries), **options)]


@pytest.mark.parametrize("annotations,entries,options,expected", [
    ({"hami.io/gpumem": "1000"}, [], {}, [("GPU-0", 1000, 0)]),
    ({"hami.io/gpumem": "1000"}, [entry(("GPU-1", 10, 0))], {}, [("GPU-1", 1000, 0)]),
    ({"hami.io/gpumem": "1000"}, [entry(("GPU-1", 10, 0))], {"policy": "spread"}, [("GPU-0", 1000, 0)]),
    ({"hami.io/gpumem-percentage": "50", "hami.io/gpucores": "30"}, [], {}, [("GPU-0", 20480, 30)]),
    ({"hami.io/gpu": "1"}, [], {}, [("GPU-0", 40960, 0)]),
    ({"hami.io/gpu": "1"}, [], {"default_memory_mib": 2048, "default_cores": 10}, [("GPU-0", 2048, 10)]),
    ({"hami.io/gpu": "1"}, [], {"memory_scaling": 2.0}, [("GPU-0", 81920, 0)]),
    ({"hami.io/gpu": "2", "hami.io/gpumem": "5"}, [], {}, [("GPU-0", 5, 0), ("GPU-1", 5, 0)]),
    ({"hami.io/gpumem": "5", "hami.io/use-gputype": "h100"}, [], {}, [("GPU-1", 5, 0)]),
    ({"hami.io/gpumem": "5", "hami.io/nouse-gputype": "a100"}, [], {}, [("GPU-1", 5, 0)]),
    ({"hami.io/gpumem": "5", "hami.io/gpu-uuid": "GPU-1"}, [], {}, [("GPU-1", 5, 0)]),
    ({"hami.io/gpumem": "5", "hami.io/nouse-gpu-uuid": "GPU-0"}, [], {}, [("GPU-1", 5, 0)]),
    ({"hami.io/gpumem": "41000"}, [], {}, [("GPU-1", 41000, 0)]),
    ({"hami.io/gpucores": "50"}, [entry(("GPU-0", 1, 60))], {}, [("GPU-1", 81920, 50)]),
    ({"hami.io/vgpu-devices-allocated": "GPU-1,NVIDIA,300,20:"}, [], {}, [("GPU-1", 300, 20)]),
    ({"hami.io/gpu-uuid": "GPU-1"}, [], {}, [("GPU-1", 81920, 0)]),
    ({"nvidia.com/gpu-uuid": "GPU-1", "hami.io/gpumem": "9"}, [], {}, [("GPU-1", 9, 0)]),
])
def test_allocates(annotations, entries, options, expected):
    assert run(annotations, entries, **options) == expected


def test_env_indices():
    assert run({}, env=["NVIDIA_VISIBLE_DEVICES=1", "HAMI_GPUMEM=7"]) == [("GPU-1", 7, 0)]
    assert [u for u, _, _ in run({}, env=["NVIDIA_VISIBLE_DEVICES=all", "HAMI_GPUMEM=7"])] == \
        ["GPU-0", "GPU-1"]


def test_split_count_limits_slots():
    full = [entry(("GPU-0", 1, 0)) for _ in range(3)]
    with pytest.raises(HamiError, match="3/3 slots used"):
        run({"hami.io/gpumem": "1", "hami.io/gpu-uuid": "GPU-0"}, full, split_count=3)


@pytest.mark.parametrize("annotations,entries,field,text", [
    ({"hami.io/gpumem": "90000"}, [], "request", "0 of 1 GPU"),
    ({"hami.io/gpu": "3"}, [], "request", "2 of 3"),
    ({"hami.io/gpumem": "1", "hami.io/gpu-uuid": "GPU-9"}, [], "hami.io/gpu-uuid", "no GPU"),
    ({"hami.io/gpu-uuid": "GPU-9"}, [], "hami.io/gpu-uuid", "no GPU"),
    ({"nvidia.com/gpu-uuid": "GPU-9"}, [], "nvidia.com/gpu-uuid", "no GPU"),
    ({"hami.io/gpumem": "1", "hami.io/use-gputype": "v100"}, [], "request", "matches"),
    ({"hami.io/vgpu-devices-allocated": "GPU-7,NVIDIA,1,1:"}, [], "hami.io/vgpu-devices-allocated",
     "no GPU"),
    ({"hami.io/vgpu-devices-allocated": "GPU-0,NVIDIA,1,50:"}, [entry(("GPU-0", 1, 60))],
     "hami.io/vgpu-devices-allocated", "cores"),
])
def test_refusals(annotations, entries, field, text):
    with pytest.raises(HamiError) as caught:
        run(annotations, entries)
    assert caught.value.field == field and text in caught.value.line()


def invalid(*devices, reason="devices[0].mem_mib=-5 is not a whole number in 1..1073741824"):
    return {"forged@0123456789abcdef": {"entry": entry(*devices), "reason": reason}}


@pytest.mark.parametrize("bad,entries,blocked", [
    (invalid(("GPU-0", -40960, 0)), [], ["GPU-0"]),         # negative memory frees nothing
    (invalid(("GPU-1", 1, -100)), [], ["GPU-1"]),            # nor negative cores
    (invalid(("GPU-7", -1, 0)), [], []),                    # a GPU not on this node
    ({"x@0123456789abcdef": {"entry": "garbage", "reason": "entry is not an object"}}, [],
     ["GPU-0", "GPU-1"]),                                    # unreadable: holds every GPU
    ({}, [entry(("GPU-0", 50000, 0))], ["GPU-0"]),           # more than the GPU has
])
def test_invalid_state_never_counts_as_free(bad, entries, blocked):
    for gpu in ("GPU-0", "GPU-1"):
        request = {"hami.io/gpumem": "1", "hami.io/gpu-uuid": gpu}
        if gpu in blocked:
            with pytest.raises(HamiError, match="hamictl doctor"):
                run(request, entries, invalid=bad)
        else:
            assert run(request, entries, invalid=bad) == [(gpu, 1, 0)]


# A node with GPU 1 in MIG mode: two instances of it (1:0, 1:1) are devices of their own.
MIG_GPU = GpuInfo(1, "GPU-1", "NVIDIA H100 80GB HBM3", 81920, 1, mig_mode=True)
MIG_NODE = [GPUS[0], MIG_GPU,
            MIG_GPU._replace(uuid="MIG-a", model="NVIDIA H100 80GB HBM3 MIG 1g.10gb", memory_mib=9984,
                             mig_mode=False, parent="GPU-1", mig_index=0, gpu_instance=9, compute_instance=0),
            MIG_GPU._replace(uuid="MIG-b", model="NVIDIA H100 80GB HBM3 MIG 3g.40gb", memory_mib=40192,
                             mig_mode=False, parent="GPU-1", mig_index=1, gpu_instance=2, compute_instance=0)]


def run_mig(annotations, env=(), entries=(), **kw):
    options = dict(split_count=10, memory_scaling=1.0, policy="binpack", default_memory_mib=0)
    options.update(kw)
    return [(g.uuid, g.mem_mib, g.cores) for g in allocate(parse(annotations, list(env)), MIG_NODE,
                                                           list(entries), **options)]


@pytest.mark.parametrize("annotations,env,options,expected", [
    # named: by GPU:MIG index, by UUID, by CDI name; whole, whatever the node's defaults
    ({}, ["NVIDIA_VISIBLE_DEVICES=1:0"], {}, [("MIG-a", 9984, 0)]),
    ({}, ["NVIDIA_VISIBLE_DEVICES=MIG-b"], {"default_memory_mib": 1000, "default_cores": 20},
     [("MIG-b", 40192, 0)]),
    ({"cdi.k8s.io/p": "nvidia.com/gpu=1:1,nvidia.com/gpu=1:0"}, [], {}, [("MIG-a", 9984, 0), ("MIG-b", 40192, 0)]),
    ({"hami.io/gpu-uuid": "MIG-b"}, [], {}, [("MIG-b", 40192, 0)]),
    ({}, ["NVIDIA_VISIBLE_DEVICES=0,1:1"], {}, [("GPU-0", 40960, 0), ("MIG-b", 40192, 0)]),
    # not named: never a MIG instance, never a GPU in MIG mode
    ({"hami.io/gpu": "1", "hami.io/gpumem": "5"}, [], {}, [("GPU-0", 5, 0)]),
    ({}, ["NVIDIA_VISIBLE_DEVICES=all", "HAMI_GPUMEM=5"], {}, [("GPU-0", 5, 0)]),
    ({"hami.io/gpumem": "5", "hami.io/use-gputype": "h100"}, [], {}, None),
])
def test_mig_instances_are_devices_when_named(annotations, env, options, expected):
    if expected is None:
        with pytest.raises(HamiError, match="no GPU on this node matches"):
            run_mig(annotations, env, **options)
    else:
        assert run_mig(annotations, env, **options) == expected


def test_a_mig_instance_is_one_containers():
    held = [entry(("MIG-a", 9984, 0))]
    with pytest.raises(HamiError, match="GPU 1:0: 1/1 slots used"):
        run_mig({}, ["NVIDIA_VISIBLE_DEVICES=1:0"], held)
    assert run_mig({}, ["NVIDIA_VISIBLE_DEVICES=1:1"], held) == [("MIG-b", 40192, 0)]


@pytest.mark.parametrize("annotations,env,field,text", [
    ({}, ["NVIDIA_VISIBLE_DEVICES=1"], "NVIDIA_VISIBLE_DEVICES", r"GPU 1 is in MIG mode: name one of its MIG instances \(1:0, 1:1\)"),
    ({"hami.io/gpu-uuid": "GPU-1"}, [], "hami.io/gpu-uuid", "GPU 1 is in MIG mode"),
    ({}, ["NVIDIA_VISIBLE_DEVICES=1:5"], "NVIDIA_VISIBLE_DEVICES", "no MIG instance with this index"),
    ({}, ["NVIDIA_VISIBLE_DEVICES=MIG-c"], "NVIDIA_VISIBLE_DEVICES", "no MIG instance with this UUID"),
    ({"cdi.k8s.io/p": "nvidia.com/gpu=7"}, [], "cdi.k8s.io/p", "no GPU with this index"),
    ({}, ["NVIDIA_VISIBLE_DEVICES=1:0", "HAMI_GPUMEM=100"], "NVIDIA_VISIBLE_DEVICES",
     "MIG instance 1:0 is given whole .*: ask no HAMI_GPUMEM with it"),
    ({"cdi.k8s.io/p": "nvidia.com/gpu=MIG-b", "hami.io/gpucores": "20"}, [], "cdi.k8s.io/p",
     "ask no hami.io/gpucores with it"),
])
def test_mig_refusals(annotations, env, field, text):
    with pytest.raises(HamiError, match=text) as caught:
        run_mig(annotations, env)
    assert caught.value.field == field


@pytest.mark.parametrize("annotations,entries,reason", [
    # more GPUs asked than the node has: it says how many it has and what each has free
    ({"hami.io/gpu": "3"}, [],
     "2 of 3 GPU(s) have room: the node has 2 GPU(s); GPU 0 has room (40960 of 40960 MiB free, "
     "40960 asked); GPU 1 has room (81920 of 81920 MiB free, 81920 asked)"),
    ({"hami.io/gpumem": "50000"}, [entry(("GPU-1", 40000, 0))],
     "0 of 1 GPU(s) have room: the node has 2 GPU(s); GPU 0: 40960 of 40960 MiB free, 50000 asked; "
     "GPU 1: 41920 of 81920 MiB free, 50000 asked"),
    ({"hami.io/gpu": "2", "hami.io/gpumem": "5", "hami.io/use-gputype": "h100"}, [],
     "1 of 2 GPU(s) have room: the node has 2 GPU(s), 1 match the request; GPU 1 has room "
     "(81920 of 81920 MiB free, 5 asked)"),
    ({"hami.io/gpumem": "5", "hami.io/use-gputype": "v100"}, [],
     "no GPU on this node matches its filters (the node has 2 GPU(s))"),
])
def test_capacity_refusals_say_what_the_node_has(annotations, entries, reason):
    with pytest.raises(HamiError) as refused:
        run(annotations, entries)
    assert refused.value.reason == reason and "()" not in refused.value.line()
