"""vLLM's ``vllm.general_plugins`` entry point (pyproject.toml): registers ``TuttiConnector`` with
vLLM's KV connector factory, so a ``kv_transfer_config`` of ``{"kv_connector": "TuttiConnector",
...}`` finds it with no ``kv_connector_module_path``, and the secondary tier ``"tutti"``
(:mod:`tutti.vllm_tier`) with the ``SecondaryTierFactory`` of vLLM's tiered CPU offloading, so a
``secondary_tiers`` entry of ``{"type": "tutti", ...}`` finds it with no ``module_path``.

vLLM calls every general plugin in each process it starts (the front end, the engine core, each
worker), possibly more than once in one process: registering twice is a no-op here. The factory
imports ``tutti.vllm`` only when an engine asks for the connector, so a plugin that is installed
but unused costs vLLM nothing but this module.
"""

from __future__ import annotations

import logging

CONNECTOR = "TuttiConnector"
MODULE = "tutti.vllm"
TIER = "tutti"
TIER_MODULE = "tutti.vllm_tier"
TIER_CLASS = "TuttiTierManager"

log = logging.getLogger("vllm.tutti")


def register() -> None:
    _register_connector()
    _register_tier()


def _register_connector() -> None:
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


def _register_tier() -> None:
    try:
        from vllm.v1.kv_offload.tiering.factory import SecondaryTierFactory
    except ImportError as e:  # a vLLM before tiered offloading (0.32)
        log.debug("tutti: vLLM has no tiered offloading (%s); the 'tutti' secondary tier is not registered", e)
        return
    registry = getattr(SecondaryTierFactory, "_registry", None)
    if isinstance(registry, dict) and TIER in registry:
        return
    try:
        SecondaryTierFactory.register_tier(TIER, TIER_MODULE, TIER_CLASS)
    except ValueError:  # registered meanwhile (the factory refuses a second registration)
        pass
