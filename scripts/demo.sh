#!/usr/bin/env bash
# make demo: one container through hami-runtime with a 1 GiB GPU slice.
# Inside it, nvidia-smi shows the card the container was given, and a CUDA
# program allocates until refused. Runs on the real GPU when an NVIDIA driver
# is present, otherwise on the simulated one (build/sim). Leaves nothing behind.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=${PY:-$ROOT/.venv/bin/python}
RUNTIME=$ROOT/.venv/bin/hami-runtime
SLICE_MIB=1024
ID=hami-demo-$$
WORK=$(mktemp -d /tmp/hami-demo.XXXXXX)

cleanup() {
    "$RUNTIME" --root "$WORK/runc" delete --force "$ID" >/dev/null 2>&1 || true
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

indent() { sed 's/^/    /'; }

# Which GPU: the real driver when the host has one, else the simulated one.
if [ -e /dev/nvidiactl ] && ldconfig -p | grep -q 'libcuda\.so\.1 '; then
    where="the real GPU (NVIDIA driver found)"
    driver_libs=$(ldconfig -p | awk '/libcuda\.so\.1 |libnvidia-ml\.so\.1 /{print $NF}')
    driver_libs="$driver_libs $(command -v nvidia-smi || true)"
    cat > "$WORK/hami.toml" <<EOF
state_dir = "$WORK/state"
libvgpu = "$ROOT/build/libvgpu.so"
EOF
else
    where="the simulated GPU (no NVIDIA driver on this host)"
    driver_libs="$ROOT/build/sim/lib/libcuda.so.1 $ROOT/build/sim/lib/libnvidia-ml.so.1 $ROOT/build/sim/bin/nvidia-smi"
    # The demo's own allocator state and simulated-GPU state, removed at the end.
    mkdir -m 1777 "$WORK/sim-shared"
    sed -e "s|^state_dir = .*|state_dir = \"$WORK/state\"|" \
        -e "s|^source = \".*/shared\"$|source = \"$WORK/sim-shared\"|" build/sim/hami.toml > "$WORK/hami.toml"
fi
export HAMI_CONFIG=$WORK/hami.toml

# A bundle: busybox + the vgpu-probe CUDA program, and a spec asking for the slice.
lib_args=()
for lib in $ROOT/build/libvgpu.so $driver_libs; do lib_args+=(--lib-from "$lib"); done
"$PY" scripts/probe/build_image.py "$WORK/image" "${lib_args[@]}" >/dev/null
mkdir -p "$WORK/bundle"
mv "$WORK/image/rootfs" "$WORK/bundle/rootfs"
"$PY" - "$WORK/bundle/config.json" "$SLICE_MIB" <<'EOF'
import json, subprocess, sys
path, mib = sys.argv[1], sys.argv[2]
subprocess.run(["runc", "spec", "--bundle", path.rsplit("/", 1)[0]], check=True)
spec = json.load(open(path))
spec["process"]["terminal"] = False
spec["process"]["args"] = ["/bin/sh", "-c",
                           "echo '$ nvidia-smi'; nvidia-smi; echo; "
                           "echo '$ vgpu-probe fill   # allocate until refused'; vgpu-probe fill"]
spec["annotations"] = {"hami.io/gpumem": mib}
json.dump(spec, open(path, "w"), indent=1)
EOF

echo "hami-runtime demo on $where"
echo "container $ID asks for hami.io/gpumem=$SLICE_MIB (a ${SLICE_MIB} MiB slice of one GPU)"
echo
echo "inside the container:"
set +e
(cd "$WORK/bundle" && timeout 120 "$RUNTIME" --root "$WORK/runc" run "$ID") > "$WORK/out" 2>&1
status=$?
set -e
indent < "$WORK/out"
echo
if [ $status -ne 0 ]; then
    echo "the container failed (exit $status)"
    exit 1
fi
got=$(sed -n 's/^allocated \([0-9]*\) MiB.*/\1/p' "$WORK/out")
echo "result: the program got $got MiB of device memory (its CUDA context holds the rest of"
echo "        the ${SLICE_MIB} MiB slice); the next allocation was refused, as the limit says."
