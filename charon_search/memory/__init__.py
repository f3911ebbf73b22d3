"""Memory model: static state under ZeRO/FSDP, activation liveness, allocator, KV capacity.

Memory is one concept shared by training (``memory_report``/``fits``, used by the search to
prune before any timeline is built), serving (``kv_cache_capacity``) and reports.
"""

from charon_search.memory.liveness import (
    CLASSES,
    BlockActivations,
    ShardingPoint,
    block_activations,
)
from charon_search.memory.profile import ModelMemoryProfile, model_profile
from charon_search.memory.report import (
    LOSS_IMPLS,
    MemoryOptions,
    MemoryReport,
    StageMemory,
    fits,
    memory_report,
    stage_layers,
)
from charon_search.memory.schedule import in_flight_chunks
from charon_search.memory.serving import KvCacheCapacity, kv_bytes_per_token, kv_cache_capacity
from charon_search.memory.static import (
    STATE_RECIPES,
    ParamGroups,
    StateRecipe,
    shard_states,
)

__all__ = [
    "CLASSES",
    "LOSS_IMPLS",
    "STATE_RECIPES",
    "BlockActivations",
    "KvCacheCapacity",
    "MemoryOptions",
    "MemoryReport",
    "ModelMemoryProfile",
    "ParamGroups",
    "ShardingPoint",
    "StageMemory",
    "StateRecipe",
    "block_activations",
    "fits",
    "in_flight_chunks",
    "kv_bytes_per_token",
    "kv_cache_capacity",
    "memory_report",
    "model_profile",
    "shard_states",
    "stage_layers",
]
