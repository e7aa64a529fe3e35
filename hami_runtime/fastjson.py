"""JSON on the create path without importing the json package, which loads
re, enum and the rest (several ms of every create). The parser and the
compact encoder are the json package's own C parts (_json); output and
results are what json.loads and json.dumps give, and anything unusual (an
error, a BOM, a type other than dict, list, tuple, str, int, float, bool,
None, a non-str key) is handed to the json package itself, so errors read
the same."""
from __future__ import annotations

try:
    import _json
except ImportError:  # pragma: no cover - other Pythons
    _json = None

_WS = " \t\n\r"
_CONSTANTS = {"-Infinity": float("-inf"), "Infinity": float("inf"), "NaN": float("nan")}


class _Context:
    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    parse_constant = _CONSTANTS.__getitem__
    memo: dict = {}


_scan = _json.make_scanner(_Context()) if _json else None


class _Unusual(Exception):
    pass


def _json_package():
    import json
    return json


def loads(s):
    if _scan is None:
        return _json_package().loads(s)
    text = s
    if isinstance(s, (bytes, bytearray)):
        if s[:3] == b"\xef\xbb\xbf" or b"\x00" in s[:4]:
            return _json_package().loads(s)
        try:
            text = bytes(s).decode("utf-8", "surrogatepass")
        except UnicodeDecodeError:
            return _json_package().loads(s)
    if not isinstance(text, str) or text.startswith("\ufeff"):
        return _json_package().loads(s)
    start = len(text) - len(text.lstrip(_WS))
    try:
        value, end = _scan(text, start)
    except (StopIteration, ValueError, SystemError):  # SystemError: _json reports errors
        return _json_package().loads(s)             # through json.decoder, not loaded yet
    if text[end:].strip(_WS):
        return _json_package().loads(s)  # extra data
    return value


def load(handle):
    return loads(handle.read())


def _float(value: float) -> str:
    if value != value:
        return "NaN"
    if value in (float("inf"), float("-inf")):
        return "Infinity" if value > 0 else "-Infinity"
    return float.__repr__(value)


def _check(value, depth=0):
    """Only the types this module writes as the json package would."""
    if depth > 200:
        raise _Unusual
    kind = type(value)
    if kind is dict:
        for key, item in value.items():
            if type(key) is not str:
                raise _Unusual
            _check(item, depth + 1)
    elif kind is list or isinstance(value, tuple):
        for item in value:
            _check(item, depth + 1)
    elif kind not in (str, int, float, bool) and value is not None:
        raise _Unusual


def _pretty(value, indent: str, level: int, sort_keys: bool, out: list) -> None:
    if isinstance(value, dict):
        if not value:
            out.append("{}")
            return
        inner = "\n" + indent * (level + 1)
        out.append("{")
        items = sorted(value.items()) if sort_keys else value.items()
        for n, (key, item) in enumerate(items):
            out.append(("," if n else "") + inner + _json.encode_basestring_ascii(key) + ": ")
            _pretty(item, indent, level + 1, sort_keys, out)
        out.append("\n" + indent * level + "}")
    elif isinstance(value, (list, tuple)):
        if not value:
            out.append("[]")
            return
        inner = "\n" + indent * (level + 1)
        out.append("[")
        for n, item in enumerate(value):
            out.append(("," if n else "") + inner)
            _pretty(item, indent, level + 1, sort_keys, out)
        out.append("\n" + indent * level + "]")
    elif isinstance(value, str):
        out.append(_json.encode_basestring_ascii(value))
    elif value is None:
        out.append("null")
    elif value is True or value is False:
        out.append("true" if value else "false")
    elif isinstance(value, int):
        out.append(int.__repr__(value))
    else:
        out.append(_float(value))


def dumps(obj, *, indent=None, sort_keys=False, allow_nan=True) -> str:
    if _json is None or not allow_nan:
        return _json_package().dumps(obj, indent=indent, sort_keys=sort_keys, allow_nan=allow_nan)
    try:
        _check(obj)
    except _Unusual:
        return _json_package().dumps(obj, indent=indent, sort_keys=sort_keys)
    if indent is None:
        encode = _json.make_encoder(None, None, _json.encode_basestring_ascii, None, ": ", ", ",
                                    sort_keys, False, True)
        return "".join(encode(obj, 0))
    out: list = []
    _pretty(obj, " " * indent if isinstance(indent, int) else indent, 0, sort_keys, out)
    return "".join(out)
