# libvgpu.so: the in-container vCUDA library, and the C programs its tests drive.
LIBVGPU_SRC := $(wildcard libvgpu_src/*.c)
LIBVGPU_HDR := $(wildcard libvgpu_src/*.h)
# -Bsymbolic-functions: our own references (the hook table) bind to our hooks,
# whatever the global lookup order; -z defs: nothing left undefined.
LIBVGPU_LDFLAGS := -shared -Wl,-Bsymbolic-functions -Wl,-z,defs -Wl,--as-needed

$(BUILD)/libvgpu.so: $(LIBVGPU_SRC) $(LIBVGPU_HDR) mk/libvgpu.mk
	@mkdir -p $(@D)
	$(CC) $(BASE_CFLAGS) -fvisibility=hidden $(LIBVGPU_LDFLAGS) -o $@ $(LIBVGPU_SRC) -ldl -lpthread

# Test programs (tests/libvgpu): linked against the simulated libcuda, so that
# LD_PRELOAD interposition of linked symbols is exercised too.
LIBVGPU_TEST_PROGS := $(BUILD)/tests/vgpu_probe $(BUILD)/tests/resize_probe $(BUILD)/tests/capture_probe \
	$(BUILD)/tests/libdeepbind_helper.so

$(BUILD)/tests/%: tests/libvgpu/%.c $(BUILD)/sim/lib/libcuda.so libvgpu_src/cuda_api.h libvgpu_src/nvml_api.h
	@mkdir -p $(@D)
	$(CC) $(BASE_CFLAGS) -Ilibvgpu_src -pthread -o $@ $< -L$(BUILD)/sim/lib -Wl,--no-as-needed -lcuda -Wl,--as-needed -ldl

$(BUILD)/tests/libdeepbind_helper.so: tests/libvgpu/deepbind_helper.c $(BUILD)/sim/lib/libcuda.so libvgpu_src/cuda_api.h
	@mkdir -p $(@D)
	$(CC) $(BASE_CFLAGS) -fvisibility=hidden -shared -Ilibvgpu_src -o $@ $< -L$(BUILD)/sim/lib -lcuda

test: $(LIBVGPU_TEST_PROGS)
libvgpu-tests: $(LIBVGPU_TEST_PROGS)
.PHONY: libvgpu-tests

# Benchmark helper (bench/libvgpu_overhead.py)
$(BUILD)/bench/libvgpu_bench: bench/libvgpu_bench.c $(BUILD)/sim/lib/libcuda.so libvgpu_src/cuda_api.h
	@mkdir -p $(@D)
	$(CC) $(BASE_CFLAGS) -Ilibvgpu_src -o $@ $< -L$(BUILD)/sim/lib -lcuda

libvgpu-bench: $(BUILD)/bench/libvgpu_bench
.PHONY: libvgpu-bench
bench: $(BUILD)/bench/libvgpu_bench
