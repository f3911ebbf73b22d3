"""Paged KV cache: a block pool plus a prefix radix tree with LRU eviction.

Blocks hold ``block_size`` tokens (vLLM's PagedAttention, Kwon et al. SOSP 2023). Prefix caching
follows vLLM's automatic prefix caching / SGLang's RadixAttention: only *full* blocks are cached,
a block is identified by its position in a shared prefix, blocks referenced by running requests
are pinned, and unreferenced blocks are evicted least-recently-used first, leaves before parents.

Models whose layers mix full and sliding-window (or chunked local) attention keep only the
window's keys in the windowed layers (``KvWindow``): vLLM's hybrid KV cache manager
(``v1/core/kv_cache_coordinator.py``, ``SlidingWindowManager`` / ``ChunkedLocalAttentionManager``)
groups the layers so that every group has the same number of layers, gives each group its own
block table over one shared pool of equally sized pages, and frees a windowed group's blocks
once they fall out of the window. The pool then counts *pages* (one block of one layer group):
a request of ``n`` tokens holds ``full_pages x ceil(n / block_size)`` pages of the full-attention
groups plus ``window_pages x min(ceil(n / block_size), window_blocks)`` of the windowed ones.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from charon_search.errors import InfeasibleError

__all__ = ["BlockPool", "KvWindow", "RadixPrefixCache"]


@dataclass(frozen=True, slots=True)
class KvWindow:
    """How a model with sliding-window (or chunked local) attention layers pages its KV cache.

    The KV layers form ``full_pages + window_pages`` equal groups (layer counts divided by their
    greatest common divisor: gpt-oss 18 + 18 layers -> 1 + 1, Gemma 3 27B 10 + 52 -> 5 + 26);
    a windowed layer keeps at most ``window_blocks`` blocks of a request."""

    full_pages: int
    window_pages: int
    window_blocks: int

    @classmethod
    def for_layers(cls, full_layers: int, window_layers: int, window_tokens: int,
                   block_size: int) -> KvWindow | None:
        """The paging of ``full_layers`` full-attention and ``window_layers`` windowed KV layers
        whose window is ``window_tokens`` keys; None when no layer is windowed. A window of
        ``w`` keys ending at any position spans at most ``ceil((w - 1) / block_size) + 1``
        blocks (vLLM ``SlidingWindowManager``: blocks wholly before ``n - w + 1`` are freed)."""
        if window_layers <= 0 or window_tokens <= 0:
            return None
        g = math.gcd(full_layers, window_layers)
        return cls(full_pages=full_layers // g, window_pages=window_layers // g,
                   window_blocks=-(-(window_tokens - 1) // block_size) + 1)

    @property
    def pages_per_block(self) -> int:
        """Pages of one block of tokens in every layer group."""
        return self.full_pages + self.window_pages


class _RadixNode:
    __slots__ = ("children", "key", "last_access_s", "parent", "refs")

    def __init__(self, key: Hashable, parent: _RadixNode | None) -> None:
        self.key = key
        self.parent = parent
        self.children: dict[Hashable, _RadixNode] = {}
        self.refs = 0
        self.last_access_s = 0.0


class RadixPrefixCache:
    """A radix tree of cached KV blocks keyed by per-block content keys.

    Each tree node is one block. ``match`` finds the longest cached prefix of a key sequence,
    ``acquire`` pins a path (and inserts missing blocks), ``release`` unpins it, and ``evict``
    frees unpinned leaves in LRU order.
    """

    def __init__(self) -> None:
        self._root = _RadixNode(None, None)
        self.num_blocks = 0
        """Blocks held by the tree (pinned or not)."""
        self.num_pinned = 0
        """Blocks referenced by at least one running request."""
        self._lru: list[tuple[float, int, _RadixNode]] = []
        self._seq = itertools.count()

    @property
    def num_evictable(self) -> int:
        return self.num_blocks - self.num_pinned

    def match(self, keys: Sequence[Hashable]) -> int:
        """Number of leading blocks of ``keys`` already cached."""
        node, n = self._root, 0
        for k in keys:
            child = node.children.get(k)
            if child is None:
                break
            node, n = child, n + 1
        return n

    def acquire(self, keys: Sequence[Hashable], now_s: float) -> int:
        """Pin the path of ``keys``, inserting blocks that are missing; returns blocks inserted."""
        node, inserted = self._root, 0
        for k in keys:
            child = node.children.get(k)
            if child is None:
                child = _RadixNode(k, node)
                node.children[k] = child
                self.num_blocks += 1
                inserted += 1
            if child.refs == 0:
                self.num_pinned += 1
            child.refs += 1
            child.last_access_s = now_s
            node = child
        return inserted

    def release(self, keys: Sequence[Hashable], now_s: float) -> None:
        """Unpin the path of ``keys`` (acquired before)."""
        node = self._root
        for k in keys:
            node = node.children[k]
            node.refs -= 1
            node.last_access_s = now_s
            if node.refs == 0:
                self.num_pinned -= 1
                if not node.children:
                    heapq.heappush(self._lru, (now_s, next(self._seq), node))

    def evict(self, num_blocks: int) -> int:
        """Free up to ``num_blocks`` unpinned blocks, least recently used leaves first."""
        freed = 0
        while freed < num_blocks and self._lru:
            t, _, node = heapq.heappop(self._lru)
            parent = node.parent
            if (node.refs or node.children or t != node.last_access_s or parent is None
                    or parent.children.get(node.key) is not node):
                continue  # stale heap entry
            del parent.children[node.key]
            self.num_blocks -= 1
            freed += 1
            if parent is not self._root and parent.refs == 0 and not parent.children:
                heapq.heappush(self._lru, (parent.last_access_s, next(self._seq), parent))
        return freed


class BlockPool:
    """The KV pages of one engine replica: private pages of requests plus the prefix tree.

    Without a ``window`` a page is a block of ``block_size`` tokens in every layer. With one, a
    block of tokens in every layer is ``window.pages_per_block`` pages and a request's windowed
    layers hold only the blocks of its last ``window`` tokens; a cached prefix block keeps the
    KV of all its layers (all its pages). ``num_blocks`` is the capacity in blocks of tokens in
    every layer (what the memory model gives), ``num_pages`` the same in pages."""

    def __init__(self, num_blocks: int, block_size: int, *, prefix_caching: bool,
                 window: KvWindow | None = None) -> None:
        if num_blocks < 1:
            raise InfeasibleError(
                f"the KV cache has no room: {num_blocks} blocks of {block_size} tokens "
                "(weights and activations fill the memory)"
            )
        self.window = window
        self.pages_per_block = window.pages_per_block if window else 1
        self.num_blocks = num_blocks
        self.num_pages = num_blocks * self.pages_per_block
        self.block_size = block_size
        self.tree = RadixPrefixCache() if prefix_caching else None
        self.owned_pages = 0
        """Pages owned by one request each (not in the tree)."""

    @property
    def tree_pages(self) -> int:
        """Pages held by the prefix tree."""
        return self.tree.num_blocks * self.pages_per_block if self.tree else 0

    @property
    def tree_pinned_pages(self) -> int:
        """Pages of the prefix tree that running requests reference."""
        return self.tree.num_pinned * self.pages_per_block if self.tree else 0

    @property
    def used_pages(self) -> int:
        """Pages in use (private and cached)."""
        return self.owned_pages + self.tree_pages

    @property
    def pinned_pages(self) -> int:
        """Pages that cannot be freed without preempting someone."""
        return self.owned_pages + self.tree_pinned_pages

    def available(self) -> int:
        """Pages obtainable now (free + evictable cached)."""
        return self.num_pages - self.pinned_pages

    def reserve(self, n: int) -> bool:
        """Make ``n`` pages free (evicting cached blocks); False if impossible."""
        free = self.num_pages - self.used_pages
        if free >= n:
            return True
        if self.tree is None or self.available() < n:
            return False
        self.tree.evict(-(-(n - free) // self.pages_per_block))
        return self.num_pages - self.used_pages >= n

    def evict_overflow(self) -> None:
        """Evict cached blocks until the used pages fit the pool again."""
        over = self.used_pages - self.num_pages
        if self.tree is not None and over > 0:
            self.tree.evict(-(-over // self.pages_per_block))

    def private_pages(self, tokens: float, hit_blocks: int = 0) -> int:
        """Pages a request storing ``tokens`` tokens owns when its first ``hit_blocks`` blocks
        are shared prefix-cache blocks: its other blocks in every full-attention group, and
        the blocks of its window that the shared prefix does not cover."""
        blocks = -(-int(tokens) // self.block_size)
        w = self.window
        if w is None:
            return blocks - hit_blocks
        in_window = min(blocks, w.window_blocks)
        shared = max(0, hit_blocks - (blocks - in_window))
        return w.full_pages * (blocks - hit_blocks) + w.window_pages * (in_window - shared)

    def pages_for(self, tokens: float) -> int:
        """Pages of a request storing ``tokens`` tokens (no shared prefix)."""
        return self.private_pages(tokens)

    def decode_pages_upper(self, stored_tokens: float, n: int, hit_blocks: int, *,
                           window_tokens: float = 0.0) -> int:
        """An upper bound on the private pages of ``n`` requests storing ``stored_tokens``
        tokens together, ``hit_blocks`` of their blocks shared, ``window_tokens`` of their
        tokens in their windows (``sum(min(stored, window_blocks x block_size))``): each
        request's last block may be partial (``+ n``)."""
        blocks = int(stored_tokens / self.block_size) + n
        w = self.window
        if w is None:
            return blocks - hit_blocks
        return w.full_pages * (blocks - hit_blocks) + w.window_pages * min(
            int(window_tokens / self.block_size) + n, n * w.window_blocks)

    @property
    def capacity_tokens(self) -> int:
        """Tokens the pool holds when every request keeps its tokens in every layer."""
        return self.num_blocks * self.block_size
