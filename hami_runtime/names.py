"""Whole-string checks of the names and numbers the runtime reads from specs,
annotations and state files: each value must match its pattern entirely."""
from __future__ import annotations

import re

CONTAINER_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]{0,1023}")  # runc's own rule
GPU_UUID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,94}")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
NUMBER = re.compile(r"[0-9]{1,10}")
ROOT_KEY = re.compile(r"[0-9a-f]{16}")
DNS_LABEL = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")  # a Kubernetes container name


def container_id(value: str) -> bool:
    return CONTAINER_ID.fullmatch(value) is not None


def gpu_uuid(value: str) -> bool:
    return GPU_UUID.fullmatch(value) is not None


def env_name(value: str) -> bool:
    return ENV_NAME.fullmatch(value) is not None


def number(value: str) -> bool:
    return NUMBER.fullmatch(value) is not None


def root_key(value: str) -> bool:
    return ROOT_KEY.fullmatch(value) is not None


def dns_label(value: str) -> bool:
    return DNS_LABEL.fullmatch(value) is not None


def dns_subdomain(value: str) -> bool:
    """Dot-separated labels, at most 253 characters (pod names)."""
    return 0 < len(value) <= 253 and all(dns_label(part) for part in value.split("."))
