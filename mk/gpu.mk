# make gpu-check: on a machine with an NVIDIA GPU, builds libvgpu, runs tests/gpu and
# bench/gpu/run.py within a 10-minute window and writes a markdown report (machine, driver,
# date, every figure, pass/fail) to $(GPU_CHECK_REPORT), ready for BENCHMARKS.md
# (bench/gpu/check.py). Without a GPU it prints one "no GPU" line and exits 0, measuring and
# writing nothing. Not part of `make test`.
GPU_CHECK_REPORT ?= $(BUILD)/gpu-check/report.md
GPU_CHECK_BUDGET ?= 570
GPU_CHECK_SECONDS ?= 4

gpu-check:
	@python3 bench/gpu/check.py --report '$(GPU_CHECK_REPORT)' --budget '$(GPU_CHECK_BUDGET)' \
		--seconds '$(GPU_CHECK_SECONDS)'
.PHONY: gpu-check

# make gpu-create-phases: on a machine with an NVIDIA GPU (as root, with runc and `make build venv`),
# the runtime latency bench against the node's own driver, with each GPU create's phases
# (bench/runtime_latency.py --real-driver --phases): where a create spends more than on the
# simulator. Without a GPU it prints one line and exits 0. Apart from gpu-check, whose window is
# the tests' and bench/gpu's.
GPU_CREATE_ITERATIONS ?= 8

gpu-create-phases:
	@$(PY) bench/runtime_latency.py --real-driver --phases --iterations '$(GPU_CREATE_ITERATIONS)'
.PHONY: gpu-create-phases
