"""KV-cache block bookkeeping: free lists, ref counts, the hash-chained prefix cache and the swap pool.

Pure Python: the scheduler asks it for blocks; the model runner only ever sees block ids.
Only full blocks are shared (through the prefix cache), and a full block is never written
again, so no copy-on-write is ever needed: the partial tail block always belongs to one sequence.

Sliding-window layers (gpt-oss alternates them with full-attention ones) keep their KV in blocks of their own,
`seq.sliding_table`, from the same pool: block b holds full-attention layer j's KV when it sits in a block_table,
sliding layer j's when it sits in a sliding_table (the model runner pairs the layers on one cache tensor, so a
block is one layer of each kind's worth of bytes). A sliding table keeps only the blocks its window can still
see: once no query to come reaches a block, it goes back to the pool and its entry becomes NO_BLOCK. So a sequence
pays full-length KV only in its full-attention layers, and the window's blocks in the others (vLLM's hybrid KV
cache manager, SlidingWindowManager, does the same with a null block). Prefix caching stays exact: sliding blocks
are registered too (under their own keys), and a prefix hit of k blocks needs the full layers' k blocks and the
sliding layers' blocks inside the window of the first token computed after them.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Hashable, Iterable

from railyard.engine.sched.sequence import Sequence, SequenceStatus
from railyard.errors import ConfigError
from railyard.model.kv_fit import blocks_to_hold, kv_shortfall

_ROOT_HASH = 0x5EED
NO_BLOCK = -1  # a sliding table's entry for a block its window no longer sees (freed; never read)


def hash_block(parent_hash: int, tokens: Iterable[int]) -> int:
    """Hash of a full block chained to its prefix; ints and tuples hash the same in every process."""
    return hash((parent_hash, tuple(tokens)))


def sliding_key(block_hash: int) -> tuple[str, int]:
    """The prefix-cache key of a sliding-window layers' block (same tokens and prefix as the full layers' block
    `block_hash`, different contents): kept apart from the full blocks' int keys."""
    return ("sliding", block_hash)


def root_hash(lora_int_id: int = 0) -> int:
    """The seed of a sequence's hash chain: a LoRA adapter's id mixed in (vLLM's extra keys), so the KV computed
    under one adapter is never served to another adapter or to the base model (0)."""
    return hash((_ROOT_HASH, lora_int_id)) if lora_int_id else _ROOT_HASH


def prefix_block_hashes(token_ids: list[int], block_size: int, lora_int_id: int = 0) -> list[int]:
    """Hash chain over the full blocks of a token list (what the router compares with replicas' caches)."""
    hashes, parent = [], root_hash(lora_int_id)
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = hash_block(parent, token_ids[start:start + block_size])
        hashes.append(parent)
    return hashes


def check_kv_fits(num_blocks: int, block_size: int, max_model_len: int, max_chunk: int,
                  sliding_window: int | None) -> None:
    """Refuse a KV cache that cannot hold one sequence of max_model_len (a request the engine accepted could then
    never run), saying which max_model_len it does hold; checked as soon as the cache is sized, before graphs
    and warm-up spend the start's seconds."""
    short = kv_shortfall(num_blocks, block_size, max_model_len, max_chunk, sliding_window)
    if short is None:
        return
    advice = (f"--max-model-len {short.fits} fits, or give the cache more memory" if short.fits
              else "give the cache more memory")
    raise ConfigError(f"{short.describe()}: {advice} (a higher --gpu-memory-utilization, a smaller "
                      "--max-num-batched-tokens, more GPUs)")


class BlockPool:
    """Mechanism: free list, ref counts, cached-block map and LRU of unreferenced cached blocks."""

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self.ref_counts = [0] * num_blocks
        self.block_hash: list[Hashable | None] = [None] * num_blocks
        self.free: deque[int] = deque(range(num_blocks))  # ref 0, holds nothing reusable
        self.cached: dict[Hashable, int] = {}  # hash (or sliding_key) -> block
        self.evictable: OrderedDict[int, None] = OrderedDict()  # ref 0 but cached, oldest first

    @property
    def num_free(self) -> int:
        return len(self.free) + len(self.evictable)

    def allocate(self) -> int:
        if self.free:
            block = self.free.popleft()
        elif self.evictable:
            block, _ = self.evictable.popitem(last=False)
            del self.cached[self.block_hash[block]]
            self.block_hash[block] = None
        else:
            raise RuntimeError("KV block pool exhausted (the scheduler should have checked)")
        self.ref_counts[block] = 1
        return block

    def acquire(self, block: int) -> None:
        """Take one more reference on a block (a prefix-cache hit)."""
        if self.ref_counts[block] == 0:
            del self.evictable[block]
        self.ref_counts[block] += 1

    def release(self, block: int) -> None:
        if self.ref_counts[block] <= 0:
            raise RuntimeError(f"block {block} released more often than acquired")
        self.ref_counts[block] -= 1
        if self.ref_counts[block] == 0:
            if self.block_hash[block] is not None:
                self.evictable[block] = None
            else:
                self.free.append(block)

    def register(self, block: int, block_hash: Hashable) -> None:
        """Make a full, computed block findable by its hash (first writer wins)."""
        if block_hash in self.cached or self.block_hash[block] is not None:
            return
        self.cached[block_hash] = block
        self.block_hash[block] = block_hash

    def lookup(self, block_hash: Hashable) -> int | None:
        return self.cached.get(block_hash)

    def reset_cache(self) -> None:
        """Forget every unreferenced cached block (used blocks keep their contents)."""
        for block in list(self.evictable):
            del self.cached[self.block_hash[block]]
            self.block_hash[block] = None
            self.free.append(block)
        self.evictable.clear()

    def problems(self, expected_refs: list[int], name: str) -> list[str]:
        issues = []
        free, evict = set(self.free), set(self.evictable)
        if len(free) != len(self.free):
            issues.append(f"{name}: a block is in the free list twice")
        if free & evict:
            issues.append(f"{name}: blocks both free and evictable: {sorted(free & evict)[:5]}")
        for block in range(self.num_blocks):
            ref, h = self.ref_counts[block], self.block_hash[block]
            if ref != expected_refs[block]:
                issues.append(f"{name}: block {block} has ref {ref} but {expected_refs[block]} holders")
            if ref == 0 and block not in free and block not in evict:
                issues.append(f"{name}: block {block} leaked (ref 0, not free)")
            if ref > 0 and (block in free or block in evict):
                issues.append(f"{name}: block {block} in use but also free")
            if block in free and h is not None:
                issues.append(f"{name}: free block {block} still has a hash")
            if block in evict and h is None:
                issues.append(f"{name}: evictable block {block} has no hash")
            if h is not None and self.cached.get(h) != block:
                issues.append(f"{name}: block {block} hash not mapped back")
        if len(self.cached) != sum(h is not None for h in self.block_hash):
            issues.append(f"{name}: cache map and block hashes disagree")
        return issues


class BlockManager:
    """Policy: which blocks a sequence gets, prefix reuse, swap in/out."""

    def __init__(self, num_gpu_blocks: int, num_cpu_blocks: int, block_size: int,
                 enable_prefix_caching: bool = True, sliding_window: int | None = None) -> None:
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        # Tokens a query sees in the sliding-window layers (itself included); None: the model has no such layers
        # (or keeps their KV with the full layers'): sequences hold no sliding table.
        self.sliding_window = sliding_window
        self.gpu = BlockPool(num_gpu_blocks)
        self.cpu = BlockPool(num_cpu_blocks)
        self.prefix_queries = 0  # tokens looked up
        self.prefix_hits = 0  # tokens found

    def reset_prefix_cache(self) -> None:
        """Forget every cached block no sequence holds (sleep mode: the KV cache's contents are about to go)."""
        self.gpu.reset_cache()
        self.cpu.reset_cache()

    # -- sizes -----------------------------------------------------------------------------------
    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def window_start_block(self, first_position: int) -> int:
        """The first block the sliding window of a query at first_position (or any later one) sees."""
        return max(0, first_position - self.sliding_window + 1) // self.block_size

    def blocks_to_hold(self, num_tokens: int, max_chunk: int) -> int:
        """The most blocks one sequence of num_tokens holds at once, prefilled in chunks of at most max_chunk
        tokens (blocks_to_hold below)."""
        return blocks_to_hold(num_tokens, max_chunk, self.block_size, self.sliding_window)

    @property
    def num_free_blocks(self) -> int:
        return self.gpu.num_free

    @property
    def num_used_blocks(self) -> int:
        return self.gpu.num_blocks - self.gpu.num_free

    # -- prefix cache ----------------------------------------------------------------------------
    def _extend_hashes(self, seq: Sequence, num_tokens: int) -> None:
        bs = self.block_size
        while (len(seq.block_hashes) + 1) * bs <= num_tokens:
            i = len(seq.block_hashes)
            parent = seq.block_hashes[-1] if seq.block_hashes else root_hash(seq.lora.lora_int_id if seq.lora else 0)
            seq.block_hashes.append(hash_block(parent, (seq.token_at(j) for j in range(i * bs, (i + 1) * bs))))

    def find_cached_prefix(self, seq: Sequence) -> list[int]:
        """Cached blocks covering the longest prefix of seq, leaving at least one token to compute."""
        if not self.enable_prefix_caching:
            return []
        self._extend_hashes(seq, seq.num_known_tokens)
        max_blocks = (seq.num_tokens - 1) // self.block_size
        hits = []
        for h in seq.block_hashes[:max_blocks]:
            block = self.gpu.lookup(h)
            if block is None:
                break
            hits.append(block)
        if self.sliding_window is not None:  # the longest hit whose window the sliding blocks still cover
            while hits and self._sliding_hit(seq, len(hits)) is None:
                hits.pop()
        return hits

    def _sliding_blocks_of_hit(self, seq: Sequence, cached: list[int]) -> list[int]:
        hit = self._sliding_hit(seq, len(cached))
        if hit is None:
            raise RuntimeError(f"sequence {seq.seq_id}: a prefix hit without its sliding-window blocks "
                               "(take hits from find_cached_prefix)")
        return hit

    def _sliding_hit(self, seq: Sequence, num_blocks: int) -> list[int] | None:
        """The cached sliding blocks that a hit of num_blocks full blocks needs (those the window of the next
        token sees), NO_BLOCK before them; None when one of them is not cached."""
        first = self.window_start_block(num_blocks * self.block_size)
        table = [NO_BLOCK] * first
        for h in seq.block_hashes[first:num_blocks]:
            block = self.gpu.lookup(sliding_key(h))
            if block is None:
                return None
            table.append(block)
        return table

    def record_prefix_lookup(self, num_queried: int, num_hit: int) -> None:
        self.prefix_queries += num_queried
        self.prefix_hits += num_hit

    def cache_full_blocks(self, seq: Sequence) -> None:
        """Register the full blocks whose KV is now computed so later prompts can reuse them."""
        if not self.enable_prefix_caching:
            return
        # A block is hashed once its KV is computed and the host knows all its tokens (the last one may
        # still be on the device under asynchronous scheduling).
        num_tokens = min(seq.num_computed_tokens, seq.num_known_tokens)
        self._extend_hashes(seq, num_tokens)
        n_full = min(num_tokens // self.block_size, len(seq.block_table))
        # Blocks are registered in order, so only the tail since the last registered one needs work
        # (scanning every full block of every sequence each step cost milliseconds at batch 256).
        first = n_full
        while first > 0 and not self._is_registered(seq.block_table[first - 1], seq.block_hashes[first - 1]):
            first -= 1
        for i in range(first, n_full):
            self.gpu.register(seq.block_table[i], seq.block_hashes[i])
        # The sliding blocks still held (a block leaves the window only after it was computed, and so registered
        # here, unless its last token was on the device then: such a block is freed uncached).
        for i in range(n_full - 1, -1, -1) if self.sliding_window is not None else ():
            block = seq.sliding_table[i] if i < len(seq.sliding_table) else NO_BLOCK
            if block == NO_BLOCK or self._is_registered(block, sliding_key(seq.block_hashes[i])):
                break
            self.gpu.register(block, sliding_key(seq.block_hashes[i]))

    def _is_registered(self, block: int, block_hash: Hashable) -> bool:
        """Registered (or another block already holds this hash: register would do nothing)."""
        return self.gpu.block_hash[block] is not None or block_hash in self.gpu.cached

    # -- allocation ------------------------------------------------------------------------------
    def can_admit(self, seq: Sequence, cached: list[int], num_tokens: int) -> bool:
        need = self.blocks_for(num_tokens) - len(cached)
        held = list(cached)
        if self.sliding_window is not None:
            sliding = self._sliding_blocks_of_hit(seq, cached)
            need += self.blocks_for(num_tokens) - len(sliding)
            held += [b for b in sliding if b != NO_BLOCK]
        reclaimed = sum(1 for b in held if self.gpu.ref_counts[b] == 0)
        return need <= self.gpu.num_free - reclaimed

    def admit(self, seq: Sequence, cached: list[int], num_tokens: int) -> bool:
        """Give a waiting sequence its cached prefix blocks plus new ones for num_tokens in total."""
        if seq.block_table:
            raise RuntimeError(f"sequence {seq.seq_id} admitted while holding blocks")
        if not self.can_admit(seq, cached, num_tokens):
            return False
        for block in cached:
            self.gpu.acquire(block)
        seq.block_table = list(cached)
        if self.sliding_window is not None:
            seq.sliding_table = self._sliding_blocks_of_hit(seq, cached)
            for block in seq.sliding_table:
                if block != NO_BLOCK:
                    self.gpu.acquire(block)
        seq.num_computed_tokens = len(cached) * self.block_size
        self._grow(seq, num_tokens)
        return True

    def allocate_slots(self, seq: Sequence, num_new_tokens: int) -> bool:
        """Make room for num_new_tokens more tokens of a running sequence; all or nothing (the sliding blocks its
        window has left behind go back to the pool either way)."""
        total = seq.num_computed_tokens + num_new_tokens
        need = self.blocks_for(total) - len(seq.block_table)
        if self.sliding_window is not None:
            self._drop_out_of_window(seq)
            need += self.blocks_for(total) - len(seq.sliding_table)
        if need > self.gpu.num_free:
            return False
        self._grow(seq, total)
        return True

    def _grow(self, seq: Sequence, num_tokens: int) -> None:
        while len(seq.block_table) < self.blocks_for(num_tokens):
            seq.block_table.append(self.gpu.allocate())
        while self.sliding_window is not None and len(seq.sliding_table) < self.blocks_for(num_tokens):
            seq.sliding_table.append(self.gpu.allocate())

    def _drop_out_of_window(self, seq: Sequence) -> None:
        """Release the sliding blocks no query from the next token to compute on can see."""
        table = seq.sliding_table
        for i in range(min(self.window_start_block(seq.num_computed_tokens), len(table))):
            if table[i] != NO_BLOCK:
                self.gpu.release(table[i])
                table[i] = NO_BLOCK

    def free(self, seq: Sequence) -> None:
        # Tail first: the blocks least likely to be shared become the first evicted.
        for block in reversed(seq.block_table):
            self.gpu.release(block)
        for block in reversed(seq.sliding_table):
            if block != NO_BLOCK:
                self.gpu.release(block)
        for block in reversed(seq.cpu_block_table):
            self.cpu.release(block)
        for block in reversed(seq.cpu_sliding_table):
            if block != NO_BLOCK:
                self.cpu.release(block)
        seq.block_table, seq.sliding_table = [], []
        seq.cpu_block_table, seq.cpu_sliding_table = [], []

    # -- swap ------------------------------------------------------------------------------------
    def can_swap_out(self, seq: Sequence) -> bool:
        live_sliding = sum(1 for b in seq.sliding_table if b != NO_BLOCK)
        return len(seq.block_table) + live_sliding <= self.cpu.num_free

    def swap_out(self, seq: Sequence) -> list[tuple[int, int]]:
        """Move a sequence's KV to the CPU pool; returns (gpu_block, cpu_block) copies to make first."""
        seq.cpu_block_table, mapping = self._move(seq.block_table, self.gpu, self.cpu)
        seq.cpu_sliding_table, sliding = self._move(seq.sliding_table, self.gpu, self.cpu)
        seq.block_table, seq.sliding_table = [], []
        return mapping + sliding

    def can_swap_in(self, seq: Sequence, num_new_tokens: int) -> bool:
        blocks = self.blocks_for(seq.num_computed_tokens + num_new_tokens)
        total = max(len(seq.cpu_block_table), blocks)
        if self.sliding_window is not None:
            live = sum(1 for b in seq.cpu_sliding_table if b != NO_BLOCK)
            total += live + max(0, blocks - len(seq.cpu_sliding_table))
        return total <= self.gpu.num_free

    def swap_in(self, seq: Sequence) -> list[tuple[int, int]]:
        """Bring a swapped sequence back; returns (cpu_block, gpu_block) copies to make first."""
        seq.block_table, mapping = self._move(seq.cpu_block_table, self.cpu, self.gpu)
        seq.sliding_table, sliding = self._move(seq.cpu_sliding_table, self.cpu, self.gpu)
        seq.cpu_block_table, seq.cpu_sliding_table = [], []
        self.cache_full_blocks(seq)
        return mapping + sliding

    @staticmethod
    def _move(table: list[int], src: BlockPool, dst: BlockPool) -> tuple[list[int], list[tuple[int, int]]]:
        """A table's blocks moved to dst (NO_BLOCK entries stay so): (the new table, (src, dst) copies to make)."""
        moved = [NO_BLOCK if b == NO_BLOCK else dst.allocate() for b in table]
        for block in reversed(table):
            if block != NO_BLOCK:
                src.release(block)
        return moved, [(a, b) for a, b in zip(table, moved) if a != NO_BLOCK]

    # -- checks ----------------------------------------------------------------------------------
    def check_invariants(self, live: Iterable[Sequence]) -> None:
        """Raise AssertionError if any block leaked, was freed twice, or ref counts disagree with holders."""
        gpu_refs = [0] * self.gpu.num_blocks
        cpu_refs = [0] * self.cpu.num_blocks
        issues = []
        for seq in live:
            if seq.status is SequenceStatus.FINISHED and (seq.block_table or seq.cpu_block_table
                                                          or seq.sliding_table or seq.cpu_sliding_table):
                issues.append(f"finished sequence {seq.seq_id} still holds blocks")
            gpu_held = seq.block_table + [b for b in seq.sliding_table if b != NO_BLOCK]
            for b in gpu_held:
                gpu_refs[b] += 1
            for b in seq.cpu_block_table + [b for b in seq.cpu_sliding_table if b != NO_BLOCK]:
                cpu_refs[b] += 1
            if len(set(gpu_held)) != len(gpu_held):
                issues.append(f"sequence {seq.seq_id} holds a block twice")
            if self.sliding_window is not None and seq.block_table and len(seq.sliding_table) != len(seq.block_table):
                issues.append(f"sequence {seq.seq_id}: sliding table of {len(seq.sliding_table)} blocks beside "
                              f"{len(seq.block_table)} full ones")
        issues += self.gpu.problems(gpu_refs, "gpu")
        issues += self.cpu.problems(cpu_refs, "cpu")
        if issues:
            raise AssertionError("; ".join(issues[:10]))

    def cached_block_hashes(self) -> set[int]:
        """Hashes of every block the prefix cache can serve now (for prefix-aware routing): the full layers'."""
        return {h for h in self.gpu.cached if isinstance(h, int)}
