"""Container ids are checked before any of them becomes part of a path."""
import pytest

from hami_runtime.errors import HamiError
from hami_runtime.ids import check_container_id


@pytest.mark.parametrize("cid", ["c1", "a.b", "A_b-c+d", "9" * 1024])
def test_accepted(cid):
    assert check_container_id(cid) == cid


@pytest.mark.parametrize("cid", ["", "..", "a..b", "../x", "a/b", ".hidden", "-a", "abc\n", "a\nb",
                                 "a b", "a\x00b", "9" * 1025, None, 7])
def test_refused(cid):
    with pytest.raises(HamiError):
        check_container_id(cid)
