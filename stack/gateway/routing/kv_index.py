"""Which KV blocks each replica's engine holds, from the engines' own KV events (gateway.replica_routing: kv_events).

vLLM's block hashes depend on its hash algorithm and PYTHONHASHSEED, so they are not recomputed here. A stored
block's event carries its token ids, its block size and its parent's hash: the index keys every block by a
chain of its own (the parent's key and the block's token ids, hashed by Python's tuple hash, which for integers
needs no seed), and keeps per replica vLLM's hash -> that key, to apply BlockRemoved. A prompt's token ids,
cut in blocks of the same size and chained the same way, then name the blocks it would hit on each replica.

Expected blocks: a prompt just routed to a replica is not in its events until its prefill has stored it (~0.1-1 s
later); a second request with the same prefix in that window would see no holder and could go elsewhere, to be
prefilled twice and cached on both (the copy evicts another prefix). So the choice notes the prompt's blocks as
expected on the chosen replica (`expect`) until its events confirm them or `expect_s` passes, as SGLang's router
inserts a routed prompt into its tree at once.

Bounded: each replica remembers at most `max_blocks` blocks (its oldest stored first forgotten; vLLM evicts
least recently used blocks too). A block whose parent the index does not know (forgotten, or stored before the
gateway listened and not replayed) is not indexed: no prompt can reach it from its first block anyway.
"""

from __future__ import annotations

import time
from collections import Counter, OrderedDict
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field

ROOT = 0x5F3759DF  # the chain's start for a model's own blocks (a LoRA adapter's start with its name)


def chain(parent: int, tokens: Sequence[int]) -> int:
    return hash((parent, *tokens))


def seed(lora: str | None) -> int:
    return ROOT if not lora else hash((ROOT, lora))


def prompt_keys(token_ids: Sequence[int], block_size: int, lora: str | None = None) -> list[int]:
    """The keys of a prompt's full blocks, first to last."""
    keys, parent = [], seed(lora)
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = chain(parent, token_ids[start : start + block_size])
        keys.append(parent)
    return keys


@dataclass
class ReplicaBlocks:
    # (medium, vLLM's block hash) -> our key, oldest stored first
    by_hash: OrderedDict[tuple[str | None, Hashable], int] = field(default_factory=OrderedDict)
    held: Counter[int] = field(default_factory=Counter)  # our key -> its (medium, hash) entries
    block_size: int | None = None
    stored: int = 0  # blocks indexed since the index (re)started
    removed: int = 0
    skipped: int = 0  # stored blocks not indexed: unknown parent, or keys the gateway cannot compute
    expected: OrderedDict[int, float] = field(default_factory=OrderedDict)  # our key -> until when (monotonic)


class KvIndex:
    def __init__(self, max_blocks: int = 262_144, expect_s: float = 5.0, clock=time.monotonic) -> None:
        self.max_blocks = max_blocks
        self.expect_s = expect_s
        self.clock = clock
        self.replicas: dict[str, ReplicaBlocks] = {}
        self.holders: dict[int, set[str]] = {}

    def _of(self, replica: str) -> ReplicaBlocks:
        return self.replicas.setdefault(replica, ReplicaBlocks())

    # -- the events --------------------------------------------------------------------------------------------
    def stored(self, replica: str, block_hashes: Sequence[Hashable], parent: Hashable | None, token_ids: Sequence[int],
               block_size: int, medium: str | None = None, lora: str | None = None,
               extra_keys: Sequence[object] | None = None) -> int:  # fmt: skip
        """vLLM's BlockStored: `block_hashes[i]` holds token_ids[i*block_size:(i+1)*block_size]. Returns the
        blocks indexed."""
        book = self._of(replica)
        book.block_size = block_size
        if parent is None:
            key: int | None = seed(lora)
        else:
            key = book.by_hash.get((medium, parent))
        done = 0
        for i, vllm_hash in enumerate(block_hashes):
            extra = extra_keys[i] if extra_keys and i < len(extra_keys) else None
            # Multimodal inputs or a cache salt are in the block's hash; a prompt's token ids cannot say them.
            if key is None or (extra and tuple(extra) != (lora,)):
                book.skipped += len(block_hashes) - i
                break
            key = chain(key, token_ids[i * block_size : (i + 1) * block_size])
            self._hold(replica, book, (medium, vllm_hash), key)
            book.expected.pop(key, None)
            done += 1
        book.stored += done
        return done

    def _hold(self, replica: str, book: ReplicaBlocks, entry: tuple[str | None, Hashable], key: int) -> None:
        old = book.by_hash.pop(entry, None)
        if old is not None:
            self._release(replica, book, old)
        book.by_hash[entry] = key
        book.held[key] += 1
        self.holders.setdefault(key, set()).add(replica)
        while len(book.by_hash) > self.max_blocks:
            _entry, oldest = book.by_hash.popitem(last=False)
            self._release(replica, book, oldest)

    def _release(self, replica: str, book: ReplicaBlocks, key: int) -> None:
        book.held[key] -= 1
        if book.held[key] <= 0:
            del book.held[key]
            holders = self.holders.get(key)
            if holders is not None:
                holders.discard(replica)
                if not holders:
                    del self.holders[key]

    def removed(self, replica: str, block_hashes: Iterable[Hashable], medium: str | None = None) -> None:
        book = self.replicas.get(replica)
        if book is None:
            return
        for vllm_hash in block_hashes:
            key = book.by_hash.pop((medium, vllm_hash), None)
            if key is not None:
                book.expected.pop(key, None)
                self._release(replica, book, key)
                book.removed += 1

    def cleared(self, replica: str) -> None:
        """AllBlocksCleared (a reset of the prefix cache, a sleep at level 2): it holds nothing now."""
        self.drop(replica)
        self._of(replica)

    def drop(self, replica: str) -> None:
        """Forget the replica (lost, restarted, or its events missed and not replayed)."""
        book = self.replicas.pop(replica, None)
        if book is None:
            return
        for key in book.held:
            holders = self.holders.get(key)
            if holders is not None:
                holders.discard(replica)
                if not holders:
                    del self.holders[key]

    def expect(self, replica: str, keys: Sequence[int]) -> None:
        """A prompt with these block keys was just routed to `replica`: count them as held there until its
        events store them or expect_s passes (bounded like the blocks themselves)."""
        book = self.replicas.get(replica)
        if book is None or not self.expect_s:
            return
        until = self.clock() + self.expect_s
        for key in keys:
            book.expected.pop(key, None)
            if key not in book.held:  # held already: its events say when it leaves
                book.expected[key] = until
        while len(book.expected) > self.max_blocks:
            book.expected.popitem(last=False)

    def _expected(self, book: ReplicaBlocks, key: int, now: float) -> bool:
        until = book.expected.get(key)
        if until is None:
            return False
        if until < now:
            del book.expected[key]
            return False
        return True

    # -- the choice --------------------------------------------------------------------------------------------
    def block_size(self, replicas: Iterable[str]) -> int | None:
        return next((b.block_size for r in replicas if (b := self.replicas.get(r)) and b.block_size), None)

    def matches(self, token_ids: Sequence[int], replicas: Sequence[str], lora: str | None = None) -> dict[str, int]:
        """Per replica: the prompt tokens its cache holds from the start (whole blocks), or is expected to hold."""
        size = self.block_size(replicas)
        hits = dict.fromkeys(replicas, 0)
        if size is None:
            return hits
        now = self.clock()
        alive = {r for r in replicas if r in self.replicas}
        for depth, key in enumerate(prompt_keys(token_ids, size, lora)):
            holding = self.holders.get(key, set())
            for r in list(alive):
                if r not in holding and not self._expected(self.replicas[r], key, now):
                    hits[r] = depth * size
                    alive.discard(r)
            if not alive:
                return hits
        for r in alive:
            hits[r] = (len(token_ids) // size) * size
        return hits

    def blocks(self, replica: str) -> int:
        book = self.replicas.get(replica)
        return len(book.by_hash) if book else 0

    def describe(self, replica: str) -> dict[str, int | None]:
        book = self.replicas.get(replica) or ReplicaBlocks()
        return {"blocks": len(book.by_hash), "block_size": book.block_size, "stored": book.stored,
                "removed": book.removed, "skipped": book.skipped, "expected": len(book.expected)}  # fmt: skip
