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
    cat > "$WORK/hami.toml" <<EOF
state_dir = "$WORK/state"
libvgpu = "$ROOT/build/libvgpu.so"
EOF
else
    where="the simulated GPU (no NVIDIA driver on this host)"
    # The demo's own allocator state and simulated-GPU state, removed at the end.
    mkdir -m 1777 "$WORK/sim-shared"
    sed -e "s|^state_dir = .*|state_dir = \"$WORK/state\"|" \
        -e "s|^source = \".*/shared\"$|source = \"$WORK/sim-shared\"|" build/sim/hami.toml > "$WORK/hami.toml"
fi
export HAMI_CONFIG=$WORK/hami.toml

# A bundle: busybox + the vgpu-probe CUDA program, and a spec asking for the slice.
"$PY" scripts/probe/make_bundle.py "$WORK/bundle" --annotation "hami.io/gpumem=$SLICE_MIB" -- \
    /bin/sh -c "echo '\$ nvidia-smi'; nvidia-smi; echo; echo '\$ vgpu-probe fill   # allocate until refused'; vgpu-probe fill"

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
