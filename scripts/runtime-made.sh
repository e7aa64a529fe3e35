#!/bin/sh
# runtime-made.sh LIMITS REGION_DIR BOARD ro|rw PROGRAM [ARGS...]
#
# Runs PROGRAM as a process of a container made by hami-runtime finds libvgpu's
# files, without the rest of a container, in a mount namespace of its own (as
# root): LIMITS at /usr/local/vgpu/limits (read-only, as the runtime mounts it;
# `rw` only to try a writable one), REGION_DIR read-write at
# /usr/local/vgpu/shared and, unless BOARD is empty, the priority board
# read-only at /usr/local/vgpu/priority (libvgpu_src/region.h). The tests and
# benchmarks drive libvgpu in that mode with it.
set -e
if [ "$1" != --in-namespace ]; then
    exec unshare --mount --propagation private -- sh "$0" --in-namespace "$@"
fi
shift
mkdir -p /usr/local/vgpu
mount -t tmpfs -o mode=0755 hami-runtime-made /usr/local/vgpu
touch /usr/local/vgpu/limits
mount --bind -o "$4" "$1" /usr/local/vgpu/limits
mkdir /usr/local/vgpu/shared
mount --bind "$2" /usr/local/vgpu/shared
if [ -n "$3" ]; then
    mkdir /usr/local/vgpu/priority
    mount --bind -o ro "$3" /usr/local/vgpu/priority
fi
shift 4
exec "$@"
