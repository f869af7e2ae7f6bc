"""The KV caches, and the memory they take.

- :mod:`.base`: the layer-cache contract (:class:`LayerCache`), the full cache
  (:class:`LayerKVCache`, :class:`KVCache`);
- :mod:`.sliding`: a sliding window in a ring buffer (:class:`SlidingWindowKVCache`);
- :mod:`.quantized`: 8-bit (:class:`Int8KVCache`), 16-bit (:class:`HalfKVCache`) and KIVI's 4-bit
  (:class:`KiviKVCache`, simulated) storage;
- :mod:`.paging`: memory handed out in blocks, counted (:func:`occupancy`; the allocator is
  :class:`kvlib.serve.BlockManager`);
- :mod:`.sizes`: the size formula (:func:`kv_cache_bytes`) and when the cache outweighs the weights;
- :mod:`.model_shapes`: the shapes of a few published models (:data:`MODEL_SHAPES`; those with
  multi-head latent attention in :data:`MLA_SHAPES`).
"""
from __future__ import annotations

from .base import KVCache, LayerCache, LayerKVCache
from .model_shapes import MLA_SHAPES, MODEL_SHAPES, MLAShape, ModelShape, count_parameters, model_shape
from .paging import (Occupancy, RequestLengths, blocks_for, occupancy, per_request_occupancy,
                     reserved_slots, sample_requests)
from .quantized import (HalfKVCache, HalfLayerKVCache, Int8KVCache, Int8LayerKVCache, KiviKVCache, KiviLayerKVCache,
                        dequantize_int8, quantize_int8)
from .sizes import bytes_per_number, crossover_tokens, kv_bytes_per_token, kv_cache_bytes, weight_bytes
from .sliding import SlidingWindowKVCache, SlidingWindowLayerCache

__all__ = ["LayerCache", "LayerKVCache", "KVCache", "SlidingWindowLayerCache", "SlidingWindowKVCache",
           "Int8LayerKVCache", "Int8KVCache", "HalfLayerKVCache", "HalfKVCache", "KiviLayerKVCache", "KiviKVCache", "quantize_int8", "dequantize_int8",
           "Occupancy", "RequestLengths", "sample_requests", "blocks_for", "reserved_slots", "occupancy",
           "per_request_occupancy", "bytes_per_number", "kv_bytes_per_token", "kv_cache_bytes", "weight_bytes",
           "crossover_tokens", "MODEL_SHAPES", "ModelShape", "MLA_SHAPES", "MLAShape", "count_parameters", "model_shape"]
