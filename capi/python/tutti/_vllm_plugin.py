"""vLLM's ``vllm.general_plugins`` entry point (pyproject.toml): registers ``TuttiConnector`` with
vLLM's KV connector factory, so a ``kv_transfer_config`` of ``{"kv_connector": "TuttiConnector",
...}`` finds it with no ``kv_connector_module_path``.

vLLM calls every general plugin in each process it starts (the front end, the engine core, each
worker), possibly more than once in one process: registering twice is a no-op here. The factory
imports ``tutti.vllm`` only when an engine asks for the connector, so a plugin that is installed
but unused costs vLLM nothing but this module.
"""

from __future__ import annotations

import logging

CONNECTOR = "TuttiConnector"
MODULE = "tutti.vllm"

log = logging.getLogger("vllm.tutti")


def register() -> None:
    try:
        from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    except ImportError as e:  # a vLLM without the v1 connector factory
        log.warning("tutti: vLLM's KV connector factory is not importable (%s); "
                    "use kv_connector_module_path=%r", e, MODULE)
        return
    registry = getattr(KVConnectorFactory, "_registry", None)
    if isinstance(registry, dict) and CONNECTOR in registry:
        return
    try:
        KVConnectorFactory.register_connector(CONNECTOR, MODULE, CONNECTOR)
    except ValueError:  # registered meanwhile (the factory refuses a second registration)
        pass
