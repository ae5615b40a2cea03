"""The ``vllm.general_plugins`` entry point: pyproject.toml declares it, and the function it names
registers ``TuttiConnector`` with vLLM's connector factory, once however often vLLM calls it.

With vLLM importable (scripts/test-python runs this file again with the vLLM venv's Python) the
factory is vLLM's own; without it, a stand-in with the same two calls (``register_connector``
refusing a name twice, ``get_connector_class_by_name``). The real-vLLM tests
(tests/test_real_vllm.py) start vLLM with the installed package and the connector by name in one
process, with the multiprocess executor and with TP=2.
"""

from __future__ import annotations

import importlib
import sys
import types
from pathlib import Path

import pytest

import tutti.vllm
from tutti import _vllm_plugin

PYPROJECT = Path(__file__).resolve().parents[3] / "pyproject.toml"
FACTORY = "vllm.distributed.kv_transfer.kv_connector.factory"


class StandInFactory:
    """vLLM 0.32's KVConnectorFactory registry, reduced to what the plugin uses."""

    _registry: dict = {}

    @classmethod
    def register_connector(cls, name, module_path, class_name):
        if name in cls._registry:
            raise ValueError(f"Connector '{name}' is already registered.")
        cls._registry[name] = lambda: getattr(importlib.import_module(module_path), class_name)

    @classmethod
    def get_connector_class_by_name(cls, name):
        if name not in cls._registry:
            raise ValueError(f"Connector '{name}' is not registered.")
        return cls._registry[name]()


@pytest.fixture
def factory(monkeypatch):
    try:
        mod = importlib.import_module(FACTORY)
        return mod.KVConnectorFactory
    except ImportError:
        pass
    StandInFactory._registry = {}
    parts = FACTORY.split(".")
    for i in range(1, len(parts)):
        name = ".".join(parts[:i])
        if name not in sys.modules:
            pkg = types.ModuleType(name)
            pkg.__path__ = []
            monkeypatch.setitem(sys.modules, name, pkg)
    mod = types.ModuleType(FACTORY)
    mod.KVConnectorFactory = StandInFactory
    monkeypatch.setitem(sys.modules, FACTORY, mod)
    return StandInFactory


def test_pyproject_declares_the_plugin_entry_point():
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11 (CI runs 3.11)
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    value = project["entry-points"]["vllm.general_plugins"]["tutti"]
    module, func = value.split(":")
    assert getattr(importlib.import_module(module), func) is _vllm_plugin.register


def test_the_plugin_registers_tutti_connector_once(factory):
    _vllm_plugin.register()
    _vllm_plugin.register()  # vLLM may load plugins more than once in a process
    assert factory.get_connector_class_by_name("TuttiConnector") is tutti.vllm.TuttiConnector


def test_a_vllm_without_the_factory_gets_a_warning_not_an_error(monkeypatch):
    monkeypatch.setitem(sys.modules, FACTORY, None)  # import fails
    records = []
    monkeypatch.setattr(_vllm_plugin.log, "warning", lambda *a: records.append(a[0] % a[1:]))
    _vllm_plugin.register()
    assert records and "kv_connector_module_path='tutti.vllm'" in records[0]
