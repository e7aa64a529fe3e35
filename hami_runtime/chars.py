"""Whole-string checks of the form [first][rest]{low,high}, for the create
path's names and numbers (the re module costs every create several ms)."""
from __future__ import annotations

DIGITS = frozenset("0123456789")
LETTERS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")
ALNUM = LETTERS | DIGITS
HEX_LOWER = frozenset("0123456789abcdef")
LOWER_ALNUM = frozenset("abcdefghijklmnopqrstuvwxyz0123456789")


def spans(value: str, first: frozenset, rest: frozenset, low: int, high: int) -> bool:
    """As re.fullmatch("[first][rest]{low,high}", value)."""
    return low + 1 <= len(value) <= high + 1 and value[0] in first and \
        all(c in rest for c in value[1:])


def container_id(value: str) -> bool:    # [A-Za-z0-9][A-Za-z0-9_.+-]{0,1023}
    return spans(value, ALNUM, ALNUM | frozenset("_.+-"), 0, 1023)


def gpu_uuid(value: str) -> bool:        # [A-Za-z0-9][A-Za-z0-9_.:-]{0,94}
    return spans(value, ALNUM, ALNUM | frozenset("_.:-"), 0, 94)


def env_name(value: str) -> bool:        # [A-Za-z_][A-Za-z0-9_]*
    return spans(value, LETTERS | {"_"}, ALNUM | {"_"}, 0, len(value))


def number(value: str) -> bool:          # [0-9]{1,10}
    return spans(value, DIGITS, DIGITS, 0, 9)


def root_key(value: str) -> bool:        # [0-9a-f]{16}
    return spans(value, HEX_LOWER, HEX_LOWER, 15, 15)


def dns_label(value: str) -> bool:      # [a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?, a Kubernetes container name
    return spans(value, LOWER_ALNUM, LOWER_ALNUM | {"-"}, 0, 62) and value[-1] in LOWER_ALNUM


def dns_subdomain(value: str) -> bool:  # dot-separated labels, at most 253 characters (pod names)
    return 0 < len(value) <= 253 and all(dns_label(part) for part in value.split("."))
