"""The name and number checks: each value matches its pattern entirely."""
import pytest

from hami_runtime import names

CASES = {
    "container_id": (names.container_id, ["a", "abc-1.2_3+x", "A" * 1024], ["", "-a", "a b", "a/b", "a\n", "A" * 1025, "é"]),
    "gpu_uuid": (names.gpu_uuid, ["GPU-453c5d90-9eaf", "MIG-1:2", "a" * 95], ["", "GPU 1", "a" * 96, "GPU-1\n"]),
    "mig_uuid": (names.mig_uuid, ["MIG-453c5d90-9eaf", "mig-1"], ["GPU-453c5d90", "MIG", "MIG-1 ", "MIG-1/0/0"]),
    "env_name": (names.env_name, ["A", "_x1", "HAMI_GPUMEM"], ["", "1A", "A-B", "A=B"]),
    "number": (names.number, ["0", "100", "9" * 10], ["", "-1", " 1", "1\n", "9" * 11, "\u0661"]),
    "root_key": (names.root_key, ["0123456789abcdef"], ["0123456789abcdeF", "0123456789abcde", ""]),
    "dns_label": (names.dns_label, ["app", "a-1", "a" * 63], ["", "-a", "a-", "A", "a_b", "a" * 64]),
    "dns_subdomain": (names.dns_subdomain, ["web-0", "a.b.c"], ["", "a..b", "A.b", "a." + "b" * 253]),
}


@pytest.mark.parametrize("check,good,bad", CASES.values(), ids=CASES.keys())
def test_whole_string_checks(check, good, bad):
    assert [v for v in good if not check(v)] == []
    assert [v for v in bad if check(v)] == []
