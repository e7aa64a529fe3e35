# make install / make uninstall / make deb: the runtime in a Python environment
# of its own under $(PREFIX)/lib/hami, made with $(PYTHON) (the layout:
# packaging/install.py; with it the node agent's systemd unit,
# $(PREFIX)/lib/systemd/system/hami-agent.service, which make install does not
# start). DESTDIR stages the same files for packagers; they name
# PREFIX, and work once copied there. make uninstall also removes the node's
# config cache (/var/cache/hami, /var/lib/hami/cache-key: the runtime's own
# files there, never through a link; NODE_ROOT puts those paths under another
# root, as the tests do) and names what it leaves.
PYTHON ?= python3
SYSCONFDIR ?= /etc
DEB_PYTHON ?= /usr/bin/python3
DEB_DIR ?= $(BUILD)
DEB_MAINTAINER ?= hami-runtime maintainers <root@localhost>
INSTALL_ARGS = --prefix '$(PREFIX)' --destdir '$(DESTDIR)' --sysconfdir '$(SYSCONFDIR)'
LAUNCHER_BUILD = --launcher-cc '$(LAUNCHER_CC) $(LAUNCHER_SRC)' --build '$(BUILD)'

# SIM=1: wired to the simulated GPU that make sim builds, for a machine with no
# NVIDIA driver (packaging/install_sim.py: a copy of it under $(PREFIX)/lib/hami/sim
# and a config naming it; hamictl doctor passes). make uninstall removes it too.
SIM ?=
install: build $(if $(SIM),sim)
	$(PY) packaging/install.py install $(INSTALL_ARGS) --python '$(PYTHON)' $(LAUNCHER_BUILD)
	$(if $(SIM),$(PY) packaging/install_sim.py install $(INSTALL_ARGS) --build '$(BUILD)')

uninstall:
	python3 packaging/install_sim.py uninstall $(INSTALL_ARGS)
	python3 packaging/install.py uninstall $(INSTALL_ARGS) --node-root '$(NODE_ROOT)'

deb: build
	$(PY) packaging/install.py deb --python '$(DEB_PYTHON)' $(LAUNCHER_BUILD) --out '$(DEB_DIR)' \
		--maintainer '$(DEB_MAINTAINER)'
