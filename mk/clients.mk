# Real CUDA clients (tests/clients). The test extras put the 12.x stack into the
# venv; cuda-bindings 13.x cannot share it, so it goes to a directory of its own,
# at the version the `clients-cu13` extra pins, put on PYTHONPATH by the tests.
CLIENTS_CU13 := $(BUILD)/clients/cu13

clients: $(CLIENTS_CU13)/.installed
$(CLIENTS_CU13)/.installed: pyproject.toml | $(VENV)/.installed
	rm -rf $(CLIENTS_CU13) && mkdir -p $(CLIENTS_CU13)
	$(PY) -I -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["clients-cu13"]))' \
		| xargs $(PY) -m pip install -q --target $(CLIENTS_CU13)
	touch $@

test: clients
.PHONY: clients

# The libcudart client: a C program linked to the libcudart.so.12 of the venv's
# nvidia-cuda-runtime-cu12 wheel (no CUDA toolkit needed).
CUDART_PROBE := $(BUILD)/clients/cudart_probe
clients: $(CUDART_PROBE)
$(CUDART_PROBE): tests/clients/programs/cudart_probe.c | $(VENV)/.installed
	@mkdir -p $(dir $@)
	lib=$$(ls -d $(CURDIR)/$(VENV)/lib/python3*/site-packages/nvidia/cuda_runtime/lib | head -1) && \
		$(CC) $(BASE_CFLAGS) -o $@ $< -L$$lib -l:libcudart.so.12 -Wl,-rpath,$$lib
