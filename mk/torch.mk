# PyTorch's CUDA 13 stack (tests/torch) in an environment of its own: the CUDA 12
# clients of .venv and cuda-bindings 13, which torch needs, cannot share one. It is
# made again only when its pins change (~5.5 GB, a few minutes).
TORCH_PINS := tests/torch/requirements.txt
TORCH_VENV := $(BUILD)/torch/venv

torch: $(TORCH_VENV)/.installed
$(TORCH_VENV)/.installed: $(TORCH_PINS) | $(BUILD)/.deps
	rm -rf $(TORCH_VENV)
	python3 -m venv $(TORCH_VENV)
	$(TORCH_VENV)/bin/python -m pip install -q --no-deps -r $(TORCH_PINS)
	touch $@

test bench: torch
.PHONY: torch
