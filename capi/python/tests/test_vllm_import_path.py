"""The connector as vLLM loads it: through ``kv_connector_module_path``, subclassing vLLM's base.

vLLM itself cannot be installed here, so a minimal package named ``vllm``
providing ``vllm.distributed.kv_transfer.kv_connector.v1.base`` (an abstract
``KVConnectorBase_V1`` with vLLM's abstract methods and constructor, for the
0.10 and the 0.11 constructor signatures) is put on the path of a fresh
interpreter. There ``tutti.vllm`` must pick the real-vLLM branch, the class
must be instantiable (every abstract method implemented), and a store-then-load
flow must move the right bytes.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
PKG = HERE.parent

BASE = '''
import enum
from abc import ABC, abstractmethod


class KVConnectorRole(enum.Enum):
    SCHEDULER = 0
    WORKER = 1


class KVConnectorMetadata(ABC):
    pass


class KVConnectorBase_V1(ABC):
    def __init__(self, vllm_config, role{extra_param}):
        self._connector_metadata = None
        self._vllm_config = vllm_config
        self._kv_transfer_config = vllm_config.kv_transfer_config
        self._role = role
        self.init_args = (vllm_config, role{extra_arg})

    @property
    def role(self):
        return self._role

    def bind_connector_metadata(self, connector_metadata):
        self._connector_metadata = connector_metadata

    def clear_connector_metadata(self):
        self._connector_metadata = None

    def _get_connector_metadata(self):
        assert self._connector_metadata is not None
        return self._connector_metadata

    def register_kv_caches(self, kv_caches):
        return

    @abstractmethod
    def start_load_kv(self, forward_context, **kwargs): ...

    @abstractmethod
    def wait_for_layer_load(self, layer_name): ...

    @abstractmethod
    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs): ...

    @abstractmethod
    def wait_for_save(self): ...

    def get_finished(self, finished_req_ids):
        return None, None

    def get_block_ids_with_load_errors(self):
        return set()

    @abstractmethod
    def get_num_new_matched_tokens(self, request, num_computed_tokens): ...

    @abstractmethod
    def update_state_after_alloc(self, request, blocks, num_external_tokens): ...

    @abstractmethod
    def build_connector_meta(self, scheduler_output): ...

    def request_finished(self, request, block_ids):
        return False, None
'''

SCRIPT = '''
import importlib, sys
from types import SimpleNamespace
sys.path.insert(0, {tests!r})
import tutti
from tutti import vllm as tv
from vllm.distributed.kv_transfer.kv_connector.v1 import base
import vllm_standins as s

assert tv.VLLM_AVAILABLE, "tutti.vllm did not pick up vllm"
assert tv.KVConnectorBase_V1 is base.KVConnectorBase_V1
assert issubclass(tv.TuttiConnector, base.KVConnectorBase_V1)
assert issubclass(tv.TuttiConnectorMetadata, base.KVConnectorMetadata)

g = tutti.Geometry(4, 2, 32, 4, "f16")
cfg = s.vllm_config(g, {{"emulated_drives": 2, "emulated_capacity_bytes": 8 << 20, "open_mode": "create"}})
# What vLLM's KVConnectorFactory does with kv_connector_module_path.
ktc = cfg.kv_transfer_config
cls = getattr(importlib.import_module(ktc.kv_connector_module_path), ktc.kv_connector)
args = (cfg, base.KVConnectorRole.WORKER) + ((object(),) if {v011} else ())
c = cls(*args)
assert c.role is base.KVConnectorRole.WORKER and len(c.init_args) == len(args)
c.shutdown()

e = s.MiniEngine(g, dict(ktc.kv_connector_extra_config))
B = g.tokens_per_block
a = s.Request("a", list(range(50, 50 + 3 * B + 1)))
e.step(new=[a])
b = s.Request("b", list(range(50, 50 + 3 * B + 1)))
r = e.step(new=[b])
assert r.matched == {{"b": 3 * B}}, r.matched
assert isinstance(r.meta, base.KVConnectorMetadata)
for i in range(3):
    for layer in range(g.layers):
        assert e.block_kv(e.blocks["b"][i], layer) == e.expected(b.all_token_ids, i, layer)
e.close()
print("ok")
'''


def fake_vllm(root: Path, v011: bool) -> None:
    d = root / "vllm" / "distributed" / "kv_transfer" / "kv_connector" / "v1"
    d.mkdir(parents=True)
    cur = root / "vllm"
    for part in ["", "distributed", "kv_transfer", "kv_connector", "v1"]:
        cur = cur / part if part else cur
        (cur / "__init__.py").write_text("")
    extra = (", kv_cache_config=None", ", kv_cache_config") if v011 else ("", "")
    (d / "base.py").write_text(BASE.format(extra_param=extra[0], extra_arg=extra[1]))


@pytest.mark.parametrize("v011", [False, True], ids=["vllm-0.10-ctor", "vllm-0.11-ctor"])
def test_loaded_like_vllm_loads_it(library, tmp_path, v011):
    fake_vllm(tmp_path, v011)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(PKG)])
    env["TUTTI_LIB"] = library.path
    script = textwrap.dedent(SCRIPT.format(tests=str(HERE), v011=v011))
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    assert done.stdout.strip().endswith("ok")
