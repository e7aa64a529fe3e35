"""Fixtures: a busybox (+ glibc) rootfs, bundles, a private runc root and a
runtime config for the simulated GPU with its state under the test's tmp dir
(node.py has the pieces)."""
import pytest

from .node import Node, copy_sim, make_rootfs, sim_missing, spec_template as make_spec_template


def needs_sim():
    missing = sim_missing()
    if missing:
        pytest.skip(f"run `make build sim` first: missing {missing}")


@pytest.fixture(scope="session")
def sim_copy(tmp_path_factory):
    needs_sim()
    return copy_sim(tmp_path_factory.mktemp("simroot"))


@pytest.fixture(scope="session")
def rootfs(tmp_path_factory):
    return make_rootfs(tmp_path_factory.mktemp("rootfs"))


@pytest.fixture(scope="session")
def spec_template(tmp_path_factory):
    return make_spec_template(tmp_path_factory.mktemp("spec"))


@pytest.fixture(scope="module")
def module_node(tmp_path_factory, rootfs, spec_template, sim_copy):
    n = Node(tmp_path_factory.mktemp("node"), rootfs, spec_template, sim_copy)
    yield n
    n.cleanup()


@pytest.fixture
def node(tmp_path, rootfs, spec_template, sim_copy):
    n = Node(tmp_path, rootfs, spec_template, sim_copy)
    yield n
    n.cleanup()
