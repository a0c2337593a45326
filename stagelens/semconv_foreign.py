"""Names stagelens reads but never emits: vLLM's and NVIDIA DCGM's metrics and labels, the
fallbacks of the dashboards and the rules.

A part of ``stagelens.semconv``, which re-exports every name (read them as ``sc.NAME``).
"""

from __future__ import annotations

from typing import Final

# --------------------------------------------------------------------------------------
# Foreign metrics the dashboards read as fallbacks (emitted by vLLM and by NVIDIA DCGM)
# --------------------------------------------------------------------------------------
VLLM_PREFIX_CACHE_HITS: Final = "vllm:prefix_cache_hits_total"
"""vLLM: prefix-cache hits in tokens."""
VLLM_PREFIX_CACHE_QUERIES: Final = "vllm:prefix_cache_queries_total"
"""vLLM: prefix-cache queries in tokens."""
VLLM_KV_CACHE_USAGE: Final = "vllm:kv_cache_usage_perc"
"""vLLM: KV-cache usage, 0-1 despite the name."""
VLLM_REQUESTS_RUNNING: Final = "vllm:num_requests_running"
"""vLLM: requests in the running batch."""
VLLM_REQUESTS_WAITING: Final = "vllm:num_requests_waiting"
"""vLLM: requests waiting to be scheduled."""
VLLM_PREEMPTIONS: Final = "vllm:num_preemptions_total"
"""vLLM: cumulative preemptions."""
VLLM_GENERATION_TOKENS: Final = "vllm:generation_tokens_total"
"""vLLM: output tokens the engine generated, counted as they are generated: an aborted
request's tokens are in it too (measured: a disconnect storm shows as positive billing drift)."""
VLLM_MODEL_NAME: Final = "model_name"
"""vLLM's label for the served model name (stagelens says ``model``)."""
DCGM_UUID: Final = "UUID"
"""DCGM exporter's label for the GPU UUID (stagelens says ``uuid``)."""
DCGM_GPU_UTIL: Final = "DCGM_FI_DEV_GPU_UTIL"
"""DCGM: GPU utilisation in percent."""
DCGM_SM_ACTIVE: Final = "DCGM_FI_PROF_SM_ACTIVE"
"""DCGM: SM activity, 0-1."""
DCGM_FB_USED: Final = "DCGM_FI_DEV_FB_USED"
"""DCGM: framebuffer used, MiB."""
DCGM_POWER: Final = "DCGM_FI_DEV_POWER_USAGE"
"""DCGM: board power, watts."""
