# SM limiter test programs (tests/libvgpu/test_sm_*.py builds them through make).
SM_TEST_DIR := $(BUILD)/tests/sm
SM_LOAD_DEPS := tests/libvgpu/sm_load.c libvgpu_src/cuda_api.h

.PHONY: sm-tests
sm-tests: $(SM_TEST_DIR)/sm_load

# Linked to the driver by name, as an application is; libvgpu comes in by LD_PRELOAD.
$(SM_TEST_DIR)/sm_load: $(SM_LOAD_DEPS) | $(BUILD)/sim/lib/libcuda.so
	@mkdir -p $(@D)
	$(CC) $(BASE_CFLAGS) -Ilibvgpu_src $< -o $@ -L$(BUILD)/sim/lib -lcuda -pthread
