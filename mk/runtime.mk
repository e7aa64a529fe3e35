# hami-runtime: the config for the simulated GPU, and the test program that
# allocates through libcuda inside a container.
SIM_ROOT := $(abspath $(BUILD))/sim

sim: $(BUILD)/sim/hami.toml $(BUILD)/runtime-tests/cuda_alloc

# The host has no nvidia driver: majors come from this /proc/devices stand-in, the
# nvidia-caps minors of MIG instances from this mig-minors one (the driver's format).
# GPU containers get the simulator's state dir and HAMI_SIM_STATE through the
# general extra_mounts / extra_env settings, as any node-specific need would.
$(BUILD)/sim/hami.toml: mk/runtime.mk
	@mkdir -p $(SIM_ROOT)/state $(SIM_ROOT)/shared $(SIM_ROOT)/dev
	@chmod 1777 $(SIM_ROOT)/shared
	@printf 'Character devices:\n  1 mem\n195 nvidia-frontend\n236 nvidia-caps\n511 nvidia-uvm\n\nBlock devices:\n  7 loop\n' > $(SIM_ROOT)/proc-devices
	@awk 'BEGIN { print "config 1"; print "monitor 2"; m = 3; \
	  for (g = 0; g < 16; g++) for (i = 0; i < 15; i++) { printf "gpu%d/gi%d/access %d\n", g, i, m++; \
	    for (c = 0; c < 8; c++) printf "gpu%d/gi%d/ci%d/access %d\n", g, i, c, m++ } }' > $(SIM_ROOT)/mig-minors
	@{ \
	  echo '# hami-runtime config for the simulated GPU (written by make sim)'; \
	  echo 'runtime = ["/usr/sbin/runc", "/usr/bin/runc", "/usr/local/sbin/runc", "/usr/local/bin/runc"]'; \
	  echo 'state_dir = "$(SIM_ROOT)/state"'; \
	  echo 'libvgpu = "$(abspath $(BUILD))/libvgpu.so"'; \
	  echo 'nvml_library = "$(SIM_ROOT)/lib/libnvidia-ml.so.1"'; \
	  echo 'driver_root = "$(SIM_ROOT)"'; \
	  echo 'dev_root = "$(SIM_ROOT)/dev"'; \
	  echo 'proc_devices = "$(SIM_ROOT)/proc-devices"'; \
	  echo 'mig_minors = "$(SIM_ROOT)/mig-minors"'; \
	  echo 'split_count = 10'; \
	  echo 'memory_scaling = 1.0'; \
	  echo 'policy = "binpack"'; \
	  echo ''; \
	  echo '[extra_env]'; \
	  echo 'HAMI_SIM_STATE = "/run/hami-sim/gpu.state"'; \
	  echo ''; \
	  echo '[[extra_mounts]]'; \
	  echo 'source = "$(SIM_ROOT)/shared"'; \
	  echo 'destination = "/run/hami-sim"'; \
	} > $@.tmp && mv $@.tmp $@

$(BUILD)/runtime-tests/cuda_alloc: tests/runtime/cuda_alloc.c libvgpu_src/cuda_api.h $(BUILD)/sim/lib/libcuda.so.1
	@mkdir -p $(dir $@)
	$(CC) -O2 -Wall -Wextra -Werror -std=gnu11 -D_GNU_SOURCE -Ilibvgpu_src -o $@ $< \
		-L$(BUILD)/sim/lib -l:libcuda.so.1

# The launcher: passthrough subcommands exec runc with no interpreter start, and
# so do create/run of a spec that surely asks for no GPU; other creates and
# delete's release run the Python runtime of this tree's virtual environment.
# Python starts without site processing, this tree and the venv's
# site-packages put on its path (HAMI_PYTHONPATH, ':'-separated). What the
# launcher looks for in a spec is the Python side's, written as a header.
build: $(BUILD)/hami-runtime
LAUNCHER_SRC := hami_runtime/launcher/hami-runtime.c hami_runtime/launcher/config.c \
	hami_runtime/launcher/hook.c hami_runtime/launcher/ids.c hami_runtime/launcher/spec_scan.c \
	hami_runtime/launcher/server_client.c
LAUNCHER_HDR := hami_runtime/launcher/config.h hami_runtime/launcher/hook.h \
	hami_runtime/launcher/ids.h hami_runtime/launcher/spec_scan.h hami_runtime/launcher/server_client.h
LAUNCHER_KEYS := $(BUILD)/launcher/spec_keys.h
LAUNCHER_CC := $(CC) -O2 -Wall -Wextra -Werror -std=gnu11 -D_GNU_SOURCE -fvisibility=hidden \
	-I$(abspath $(BUILD))/launcher
$(LAUNCHER_KEYS): hami_runtime/lifecycle/request/launcher_keys.py hami_runtime/lifecycle/request/request_keys.py \
		hami_runtime/lifecycle/request/docker_gpus.py | $(VENV)/.installed
	@mkdir -p $(dir $@)
	$(PY) -I -c 'import sys; sys.path.insert(0, "."); \
		from hami_runtime.lifecycle.request import launcher_keys; launcher_keys.main(sys.argv[1:])' $@
$(BUILD)/hami-runtime: $(LAUNCHER_SRC) $(LAUNCHER_HDR) $(LAUNCHER_KEYS) | $(VENV)/.installed
	@mkdir -p $(dir $@)
	@pypath="$(abspath .):$$($(PY) -I -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"; \
	case "$$pypath" in *"'"*|*'"'*|*'\'*) echo "hami-runtime: unusable path for the launcher: $$pypath" >&2; exit 1;; esac; \
	echo "$(CC) ... -DHAMI_PYTHONPATH='\"$$pypath\"' -o $@ $(LAUNCHER_SRC)"; \
	$(LAUNCHER_CC) -DHAMI_PYTHON='"$(abspath $(PY))"' -DHAMI_PYTHONPATH="\"$$pypath\"" -o $@ $(LAUNCHER_SRC)

# region.py's cffi layout, made once from the same region.h as an out-of-line
# ABI module (no compiler): importing it skips pycparser. region.py uses it only
# while it holds the exact header text found at run time, else parses the header.
build: hami_runtime/node/_region_ffi.py
hami_runtime/node/_region_ffi.py: libvgpu_src/region.h hami_runtime/node/region.py | $(VENV)/.installed
	env -u HAMI_REGION_HEADER $(PY) -I -c 'import sys; sys.path.insert(0, "."); \
		from hami_runtime.node import region; region.emit_module(sys.argv[1], sys.argv[2])' $@ $< >/dev/null
