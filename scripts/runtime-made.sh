#!/bin/sh
# runtime-made.sh LIMITS REGION_DIR BOARDS ro|rw PROGRAM [ARGS...]
#
# Runs PROGRAM as a process of a container made by hami-runtime finds libvgpu's
# files, without the rest of a container, in a mount namespace of its own (as
# root): LIMITS at /.hami/limits (read-only, as the runtime mounts it;
# `rw` only to try a writable one), REGION_DIR read-write at
# /.hami/shared and, unless BOARDS is empty, its `activity` and
# `priority` dirs read-only at /.hami/activity and /.hami/priority
# (the boards; libvgpu_src/region.h). The tests and benchmarks drive libvgpu in
# that mode with it.
set -e
if [ "$1" != --in-namespace ]; then
    exec unshare --mount --propagation private -- sh "$0" --in-namespace "$@"
fi
shift
# The mount point is on the real root, which no tmpfs can cover: where /.hami
# is missing, this makes it on the host's disk (empty; nothing is ever written
# in it but under the tmpfs). The test session removes it when it made it
# (tests/conftest.py, host_left_as_found).
mkdir -p /.hami
mount -t tmpfs -o mode=0755 hami-runtime-made /.hami
touch /.hami/limits
mount --bind -o "$4" "$1" /.hami/limits
mkdir /.hami/shared
mount --bind "$2" /.hami/shared
for board in activity priority; do
    if [ -n "$3" ] && [ -d "$3/$board" ]; then
        mkdir /.hami/$board
        mount --bind -o ro "$3/$board" /.hami/$board
    fi
done
shift 4
exec "$@"
