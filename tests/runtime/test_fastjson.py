"""fastjson reads and writes exactly what the json package does, errors included."""
import json
import subprocess
import sys

import pytest

from hami_runtime import chars, fastjson
from tests.conftest import ROOT

DOCS = [
    json.loads((ROOT / "schemas" / "config.schema.json").read_text()),
    {}, [], "x", 3, 1.5, None, (1, 2), {"t": (1, "a")},
    {"a": [], "b": {}, "c": [1, 2.5, -0.0, 1e300, True, False, None, "é\u2028\"\\\x01"]},
    [1, [2, [3, {}]]], {"z": 1, "a": {"y": [1, {"k": "v"}], "b": 2}},
    {1: "an int key"}, {"nan": float("nan"), "inf": float("-inf")},
]
FORMATS = [{}, {"indent": 2}, {"indent": 1, "sort_keys": True}, {"sort_keys": True}]


@pytest.mark.parametrize("doc", DOCS, ids=range(len(DOCS)))
@pytest.mark.parametrize("options", FORMATS, ids=str)
def test_dumps_as_json(doc, options):
    assert fastjson.dumps(doc, **options) == json.dumps(doc, **options)


@pytest.mark.parametrize("text", ['{"a": [1, 2.0, "x"]}', ' \n[1] \n', b'{"a": 1}', '"\\u00e9"', "1e5",
                                  "NaN", b'"\xc3\xa9"'])
def test_loads_as_json(text):
    assert repr(fastjson.loads(text)) == repr(json.loads(text))


def failure(function, text):
    try:
        function(text)
    except Exception as exc:  # noqa: BLE001 - the very exception is compared
        return type(exc), str(exc)
    return None


@pytest.mark.parametrize("text", ["", "{", '{"a": 1} x', "\ufeff{}", b"\xff", b"\xef\xbb\xbf{}", "[1,]",
                                  "{not json"])
def test_errors_as_json(text):  # a BOM in bytes is read, as json does
    assert failure(fastjson.loads, text) == failure(json.loads, text)


def test_errors_before_json_is_loaded():
    """_json reports errors through json.decoder: a process that never loaded it still gets them."""
    code = ("import sys; sys.path.insert(0, sys.argv[1]); from hami_runtime import fastjson\n"
            "assert 'json' not in sys.modules\n"
            "try:\n    fastjson.loads('{not json')\nexcept ValueError as exc:\n    print(type(exc).__name__, exc)")
    out = subprocess.run([sys.executable, "-I", "-S", "-c", code, str(ROOT)], capture_output=True, text=True)
    assert out.stdout.strip() == "JSONDecodeError Expecting property name enclosed in double quotes: " \
        "line 1 column 2 (char 1)", out.stderr


@pytest.mark.parametrize("check,pattern", [
    (chars.container_id, r"[A-Za-z0-9][A-Za-z0-9_.+-]{0,1023}"),
    (chars.gpu_uuid, r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,94}"),
    (chars.env_name, r"[A-Za-z_][A-Za-z0-9_]*"),
    (chars.number, r"[0-9]{1,10}"),
    (chars.root_key, r"[0-9a-f]{16}"),
])
def test_chars_as_the_patterns(check, pattern):
    import random
    import re
    rng = random.Random(1)
    cases = ["", "a", "0" * 10, "0" * 11, "a" * 95, "a" * 96, "a" * 1024, "a" * 1025,
             "0123456789abcdef", "0123456789abcdeF", "_x", "x\n", "\u0661"]
    cases += ["".join(rng.choice("aZ09_.+-:/ \n\u00e9\u0661fF") for _ in range(rng.randint(0, 20)))
              for _ in range(3000)]
    compiled = re.compile(pattern)
    assert [c for c in cases if bool(compiled.fullmatch(c)) != check(c)] == []
