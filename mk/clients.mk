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
