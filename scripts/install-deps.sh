#!/usr/bin/env bash
# Installs Debian packages when missing: the ones named as arguments, or by
# default what the build, the tests and the demo need. Services that packages
# would start on install are not started (the tests start their own).
set -euo pipefail
packages=("$@")
[ ${#packages[@]} -gt 0 ] || packages=(gcc make runc busybox-static python3-venv)
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "installing: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
policy=/usr/sbin/policy-rc.d
if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' > "$policy" && chmod +x "$policy"
    trap 'rm -f "$policy"' EXIT
fi
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
