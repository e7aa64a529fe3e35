# Simulated GPU driver (tests/simgpu): libcuda.so.1, libnvidia-ml.so.1, nvidia-smi,
# an ld cache that makes $(BUILD)/sim a driver root, and the C test programs.
SIM_SRC := tests/simgpu
SIM_OUT := $(BUILD)/sim
SIM_CFLAGS := $(BASE_CFLAGS) -fvisibility=hidden -Ilibvgpu_src -I$(SIM_SRC) -pthread
SIM_COMMON := sim_config sim_state sim_pids sim_handles
SIM_CUDA_OBJS := $(patsubst %,$(SIM_OUT)/obj/cuda/%.o,$(SIM_COMMON) sim_image sim_engine \
	$(basename $(notdir $(wildcard $(SIM_SRC)/cu_*.c))))
SIM_NVML_OBJS := $(patsubst %,$(SIM_OUT)/obj/nvml/%.o,$(SIM_COMMON) nvml)
SIM_HEADERS := $(SIM_SRC)/sim.h $(SIM_SRC)/sim_pids.h libvgpu_src/cuda_api.h libvgpu_src/nvml_api.h
SIM_TEST_PROGS := $(patsubst $(SIM_SRC)/progs/%.c,$(SIM_OUT)/tests/%,$(wildcard $(SIM_SRC)/progs/*.c))

# Stand-ins for driver files of every NVIDIA_DRIVER_CAPABILITIES class, so tests see
# which a container gets (utility, compute, video, graphics, ngx).
SIM_STAND_IN_LIBS := libnvidia-cfg.so.1 libnvidia-ptxjitcompiler.so.1 libnvidia-encode.so.1 \
	libnvcuvid.so.1 libEGL_nvidia.so.0 libnvidia-glcore.so.1 libnvidia-ngx.so.1
SIM_STAND_IN_PROGS := nvidia-debugdump nvidia-cuda-mps-control

sim: $(SIM_OUT)/lib/libcuda.so $(SIM_OUT)/lib/libnvidia-ml.so $(SIM_OUT)/bin/nvidia-smi \
	$(SIM_OUT)/bin/hami-sim-pids $(SIM_OUT)/etc/ld.so.cache $(SIM_TEST_PROGS)

$(SIM_OUT)/obj/cuda/%.o: $(SIM_SRC)/%.c $(SIM_HEADERS)
	@mkdir -p $(dir $@)
	$(CC) $(SIM_CFLAGS) -c $< -o $@

$(SIM_OUT)/obj/nvml/%.o: $(SIM_SRC)/%.c $(SIM_HEADERS)
	@mkdir -p $(dir $@)
	$(CC) $(SIM_CFLAGS) -c $< -o $@

$(SIM_OUT)/lib/libcuda.so.1: $(SIM_CUDA_OBJS)
	@mkdir -p $(dir $@)
	$(CC) -shared -Wl,-soname,libcuda.so.1 -Wl,-z,defs -pthread -o $@ $^

$(SIM_OUT)/lib/libnvidia-ml.so.1: $(SIM_NVML_OBJS)
	@mkdir -p $(dir $@)
	$(CC) -shared -Wl,-soname,libnvidia-ml.so.1 -Wl,-z,defs -pthread -o $@ $^

$(SIM_OUT)/lib/%.so: $(SIM_OUT)/lib/%.so.1
	ln -sf $(notdir $<) $@

$(SIM_OUT)/bin/nvidia-smi: $(SIM_SRC)/nvidia_smi.c libvgpu_src/nvml_api.h
	@mkdir -p $(dir $@)
	$(CC) $(BASE_CFLAGS) -fvisibility=hidden -Ilibvgpu_src -o $@ $< -ldl

# The host-pid service processes in containers ask (sim_pid_service.c).
$(SIM_OUT)/bin/hami-sim-pids: $(SIM_SRC)/sim_pid_service.c
	@mkdir -p $(dir $@)
	$(CC) $(BASE_CFLAGS) -o $@ $<

$(SIM_OUT)/lib/.stand-ins: $(SIM_SRC)/stand_in.c mk/sim.mk
	@mkdir -p $(SIM_OUT)/lib $(SIM_OUT)/bin
	for so in $(SIM_STAND_IN_LIBS); do \
		$(CC) $(BASE_CFLAGS) -fvisibility=hidden -shared -Wl,-soname,$$so -o $(SIM_OUT)/lib/$$so $< || exit 1; done
	for prog in $(SIM_STAND_IN_PROGS); do \
		printf '#!/bin/sh\necho "%s: a stand-in of the simulated driver"\n' $$prog > $(SIM_OUT)/bin/$$prog; \
		chmod 755 $(SIM_OUT)/bin/$$prog; done
	touch $@

$(SIM_OUT)/etc/ld.so.cache: $(SIM_OUT)/lib/libcuda.so $(SIM_OUT)/lib/libnvidia-ml.so $(SIM_OUT)/lib/.stand-ins
	@mkdir -p $(dir $@)
	echo /lib > $(SIM_OUT)/etc/ld.so.conf
	ldconfig -r $(SIM_OUT)
	ldconfig -C $@ -p | grep -q libnvidia-ml.so.1

$(SIM_OUT)/tests/%: $(SIM_SRC)/progs/%.c $(SIM_OUT)/lib/libcuda.so libvgpu_src/cuda_api.h
	@mkdir -p $(dir $@)
	$(CC) $(BASE_CFLAGS) -Ilibvgpu_src -pthread -o $@ $< -L$(SIM_OUT)/lib -lcuda -ldl
