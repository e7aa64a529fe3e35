"""nvidia-ml-py on the simulated driver, bare and under libvgpu."""


def test_nvml_sees_one_card_of_the_granted_size(client):
    out = client.run("nvml")
    assert out["count"] == 1
    assert out["uuid"].startswith("GPU-")
    assert out["name"]
    assert out["total_mib"] == client.total_mib
    assert out["used_le_total"]
