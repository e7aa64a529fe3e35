#!/usr/bin/env bash
# Installs the container engines the engine tests run, when missing.
exec bash "$(dirname "$0")/install-deps.sh" podman containerd docker.io docker-compose
