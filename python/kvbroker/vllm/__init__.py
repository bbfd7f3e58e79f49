# SPDX-License-Identifier: MIT
"""vLLM integration: ``kvbroker.vllm.KVBrokerConnector`` (docs/vllm.md).

vLLM imports this module by its ``kv_connector_module_path`` and takes the
class named by ``kv_connector``. Without vLLM installed, the connector
runs on a stand-in base class with the same interface (``_compat``).
"""

from ._compat import HAVE_VLLM, VLLM_INTERFACE
from ._layout import LayoutError
from ._params import ParamsError
from ._stats import KVBrokerConnectorStats, KVBrokerPromMetrics
from .connector import KVBrokerConnector, KVBrokerMetadata

__all__ = ["KVBrokerConnector", "KVBrokerMetadata", "LayoutError",
           "ParamsError", "HAVE_VLLM", "VLLM_INTERFACE",
           "KVBrokerConnectorStats", "KVBrokerPromMetrics"]
