# SPDX-License-Identifier: MIT
"""A model of how vLLM 0.25 .. 0.32 drives a V1 KV connector, written from
vLLM's source at named commits (versions.py): the scheduler
(scheduler.py, kv_cache.py, objects.py), the GPU workers' runner call
orders and KV cache forms (worker.py), engine cores and a P/D harness
(engine.py). Used by tests/python/test_vllm_model*.py."""
