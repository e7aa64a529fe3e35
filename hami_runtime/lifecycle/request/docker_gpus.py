"""`docker run --gpus`: dockerd asks for GPUs by writing NVIDIA_VISIBLE_DEVICES
(and NVIDIA_DRIVER_CAPABILITIES) into the container's env and a prestart hook
running `nvidia-container-runtime-hook prestart`: NVIDIA's, or the stand-in
make install puts on PATH where NVIDIA's toolkit is not installed. This runtime
serves the env's request itself and takes the hook out of the spec, whichever
it is, so that nothing hands the container GPUs past its slice."""
from __future__ import annotations

import os

# the names NVIDIA's toolkit installs the hook under (dockerd runs the first)
HOOK_NAMES = ("nvidia-container-runtime-hook", "nvidia-container-toolkit")


def is_gpu_hook(hook) -> bool:
    if not isinstance(hook, dict):
        return False
    program = [hook.get("path"), *(hook.get("args") or [])[:1]]
    return any(isinstance(p, str) and os.path.basename(p) in HOOK_NAMES for p in program)


def gpu_hooks(spec: dict) -> list:
    """The prestart hooks that would hand the container GPUs (dockerd's --gpus)."""
    hooks = spec.get("hooks") if isinstance(spec.get("hooks"), dict) else {}
    prestart = hooks.get("prestart") if isinstance(hooks.get("prestart"), list) else []
    return [h for h in prestart if is_gpu_hook(h)]


def without_gpu_hooks(spec: dict, inj=None) -> dict:
    """The spec without them (every other hook kept, in its order); a modifier."""
    hooks = spec.get("hooks")
    if isinstance(hooks, dict) and isinstance(hooks.get("prestart"), list):
        kept = [h for h in hooks["prestart"] if not is_gpu_hook(h)]
        if kept:
            hooks["prestart"] = kept
        else:
            del hooks["prestart"]
    return spec
