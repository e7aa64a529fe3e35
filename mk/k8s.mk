# make k8s-image: the image deploy/'s DaemonSet runs, hami-runtime-node:<version>,
# as an OCI archive (build/k8s/hami-runtime-node-<version>.oci.tar) made with no
# registry: a debootstrap'd Debian rootfs (cached under build/k8s/rootfs-<key>)
# with the built tree at /opt/hami-runtime and its wheelhouse (scripts/k8s_image.py).
# Load it with `podman load -i` or `ctr -n k8s.io images import` on each node.
# make k8s-check (not part of make test): tests/k8s, then that image run in a
# real container against a host root in a temp dir (tests/k8s/k8s_check.py), and
# pods through CRI by the hami handler on the containerd it configured, on the
# simulated GPU (tests/k8s/cri_check.py).
K8S_IMAGE_ARGS ?=
.PHONY: k8s-image k8s-check
k8s-image: deps venv build
	$(PY) scripts/k8s_image.py --build '$(BUILD)' $(K8S_IMAGE_ARGS)

k8s-check: k8s-image
	$(PY) -m pytest -q tests/k8s
	$(PY) tests/k8s/k8s_check.py --image '$(BUILD)/k8s/hami-runtime-node-$(shell $(PY) -c 'import sys; sys.path.insert(0, "packaging"); import install; print(install.version())').oci.tar'
