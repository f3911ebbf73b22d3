"""Paged KV cache: a block pool plus a prefix radix tree with LRU eviction.

Blocks hold ``block_size`` tokens (vLLM's PagedAttention, Kwon et al. SOSP 2023). Prefix caching
follows vLLM's automatic prefix caching / SGLang's RadixAttention: only *full* blocks are cached,
a block is identified by its position in a shared prefix, blocks referenced by running requests
are pinned, and unreferenced blocks are evicted least-recently-used first, leaves before parents.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Hashable, Sequence

from charon_search.errors import InfeasibleError

__all__ = ["BlockPool", "RadixPrefixCache"]


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
    """The KV blocks of one engine replica: private blocks of requests plus the prefix tree."""

    def __init__(self, num_blocks: int, block_size: int, *, prefix_caching: bool) -> None:
        if num_blocks < 1:
            raise InfeasibleError(
                f"the KV cache has no room: {num_blocks} blocks of {block_size} tokens "
                "(weights and activations fill the memory)"
            )
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.tree = RadixPrefixCache() if prefix_caching else None
        self.private_blocks = 0
        """Blocks owned by one request each (not in the tree)."""

    @property
    def used_blocks(self) -> int:
        return self.private_blocks + (self.tree.num_blocks if self.tree else 0)

    @property
    def pinned_blocks(self) -> int:
        """Blocks that cannot be freed without preempting someone."""
        return self.private_blocks + (self.tree.num_pinned if self.tree else 0)

    def available(self) -> int:
        """Blocks obtainable now (free + evictable cached)."""
        return self.num_blocks - self.pinned_blocks

    def reserve(self, n: int) -> bool:
        """Make ``n`` blocks free (evicting cached ones); False if impossible."""
        free = self.num_blocks - self.used_blocks
        if free >= n:
            return True
        if self.tree is None or self.available() < n:
            return False
        self.tree.evict(n - free)
        return self.num_blocks - self.used_blocks >= n

    def blocks_for(self, tokens: float) -> int:
        return -(-int(tokens) // self.block_size)
