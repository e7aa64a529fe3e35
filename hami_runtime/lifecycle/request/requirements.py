"""NVIDIA_REQUIRE_* as NVIDIA's runtime reads them: what a CUDA image needs of
the node's driver and GPUs, checked at create.

Every NVIDIA_REQUIRE_<X> variable must hold (NVIDIA_REQUIRE_JETPACK aside, which
concerns Jetson boards only). Within one, space-separated alternatives are ORed
and comma-separated conditions within an alternative ANDed:
`cuda>=12.4 brand=tesla,driver>=470,driver<471` holds on a driver of CUDA 12.4 or
later, or on a Tesla card with a 470 driver. A condition is PROPERTY OP VALUE with
OP one of = != < <= > >=; `cuda` (the driver's CUDA version), `driver` (its
version) and `arch` (a GPU's compute capability) compare as versions, `brand`
(a GPU's brand) as a word. A condition on another property is skipped, as
NVIDIA's runtime skips it. `arch` and `brand` are asked of every GPU the
container gets. An image with CUDA_VERSION and no NVIDIA_REQUIRE_CUDA (the
oldest CUDA images) requires `cuda>=<its major.minor>`. NVIDIA_DISABLE_REQUIRE
set to a true value turns all of it off.
"""
from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import NamedTuple

from ...errors import HamiError

PREFIX = "NVIDIA_REQUIRE_"
NOT_CHECKED = ("NVIDIA_REQUIRE_JETPACK",)
DISABLE = "NVIDIA_DISABLE_REQUIRE"
CONDITION = re.compile(r"([a-z]+)(!=|<=|>=|=|<|>)(.*)")
VERSION = re.compile(r"[0-9]+(\.[0-9]+)*")
VERSIONED = ("cuda", "driver", "arch")
TRUE = ("1", "t", "true")  # strconv.ParseBool's true values, as NVIDIA's runtime reads them
COMPARE = {"=": lambda c: c == 0, "!=": lambda c: c != 0, "<": lambda c: c < 0,
           "<=": lambda c: c <= 0, ">": lambda c: c > 0, ">=": lambda c: c >= 0}


class NodeFacts(NamedTuple):
    """What the conditions are asked of: the driver's CUDA version and its own
    (node-wide), and per GPU its compute capability and brand."""
    cuda: str            # "12.4"
    driver: str          # "550.54.15"
    gpus: Sequence[Mapping[str, str]]  # [{"arch": "9.0", "brand": "nvidia"}, ...]


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split("."))


def _compare(name: str, have: str, want: str) -> int:
    if name in VERSIONED:
        a, b = _version(have), _version(want)
        width = max(len(a), len(b))
        a, b = a + (0,) * (width - len(a)), b + (0,) * (width - len(b))
    else:
        a, b = have.lower(), want.lower()
    return (a > b) - (a < b)


def requirements(env: Mapping[str, str]) -> list[tuple[str, str, str]]:
    """The image's requirements: (variable, its value, the expression it means);
    none when disabled."""
    if env.get(DISABLE, "").strip().lower() in TRUE:
        return []
    found = [(k, v, v) for k, v in sorted(env.items()) if k.startswith(PREFIX) and k not in NOT_CHECKED]
    legacy = env.get("CUDA_VERSION", "")
    if "NVIDIA_REQUIRE_CUDA" not in env and legacy:
        match = re.match(r"([0-9]+)\.([0-9]+)", legacy)
        if not match:
            raise HamiError("CUDA_VERSION", legacy, "not a CUDA version (major.minor)")
        found.append(("CUDA_VERSION", legacy, f"cuda>={match.group(1)}.{match.group(2)}"))
    return found


def _alternatives(name: str, value: str, expression: str) -> list[list[tuple[str, str, str]]]:
    """[[(property, operator, value), ...] per alternative], checked; unknown
    properties left out."""
    result = []
    for alternative in expression.split(" "):
        conditions = []
        for text in alternative.split(","):
            if not text:
                continue
            match = CONDITION.fullmatch(text)
            if not match:
                raise HamiError(name, value, f"{text!r} is not a condition (PROPERTY OP VALUE)")
            prop, op, wanted = match.groups()
            if prop not in VERSIONED + ("brand",):
                continue
            if prop in VERSIONED and not VERSION.fullmatch(wanted):
                raise HamiError(name, value, f"{text!r}: {wanted!r} is not a version")
            conditions.append((prop, op, wanted))
        if conditions:
            result.append(conditions)
    return result


def _unmet(conditions, facts: NodeFacts) -> str:
    """The first condition of an alternative that some GPU (or the driver) fails, '' if none."""
    for prop, op, value in conditions:
        haves = [facts.cuda] if prop == "cuda" else [facts.driver] if prop == "driver" else \
            [gpu[prop] for gpu in facts.gpus]
        for have in haves:
            if not have or not COMPARE[op](_compare(prop, have, value)):  # "": the node cannot tell
                return f"{prop}{op}{value}"
    return ""


def check(env: Mapping[str, str], facts: NodeFacts) -> None:
    """Refuses (HamiError naming the variable, its value and the unmet condition)
    where the node cannot give the image what it requires."""
    for name, value, expression in requirements(env):
        alternatives = _alternatives(name, value, expression)
        unmet = [_unmet(a, facts) for a in alternatives]
        if alternatives and all(unmet):
            gpus = "; ".join(f"GPU arch {g['arch']} brand {g['brand']}" for g in facts.gpus)
            raise HamiError(name, value, "unsatisfied condition: " + " or ".join(unmet) +
                            f" (this node: CUDA {facts.cuda}, driver {facts.driver}"
                            + (f"; {gpus})" if gpus else ")"))
