# hami-runtime: `make demo` runs the main job, `make test` runs every test.
# Both install what they need (Debian packages, a Python virtual environment).
SHELL := /bin/bash
BUILD := build
VENV := .venv
PY := $(VENV)/bin/python
PREFIX ?= /usr/local
CC ?= gcc
CUDA_INCLUDE ?= /usr/local/cuda/include
BASE_CFLAGS := -O2 -g -fPIC -Wall -Wextra -Werror -std=gnu11 -D_GNU_SOURCE

.PHONY: all build sim deps venv clients test demo bench install uninstall deb clean
all: build

include mk/*.mk

build: $(BUILD)/libvgpu.so

deps: $(BUILD)/.deps
$(BUILD)/.deps: scripts/install-deps.sh
	bash scripts/install-deps.sh
	@mkdir -p $(BUILD) && touch $@

venv: $(VENV)/.installed
$(VENV)/.installed: pyproject.toml | $(BUILD)/.deps
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $@

test: deps venv build sim
	$(PY) -m pytest tests

demo: deps venv build sim
	bash scripts/demo.sh

bench: deps venv build sim
	$(PY) bench/run_all.py

clean:
	rm -rf $(BUILD)
