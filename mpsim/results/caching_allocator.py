"""A model of PyTorch's CUDA caching allocator: how requests become blocks in segments.

PyTorch does not call ``cudaMalloc`` per tensor. It asks the driver for *segments* and
carves them into *blocks*; a freed block stays cached in its segment for the next request
of a fitting size, so the memory the device has reserved only grows during a step. The
rules modelled here are the allocator's documented ones:

- every block is a multiple of 512 bytes; requests up to 1 MiB come from a *small* pool of
  2 MiB segments, larger ones from a *large* pool: a request under 10 MiB gets a 20 MiB
  segment, a bigger one a segment of its own size rounded up to 2 MiB;
- a request takes the smallest cached free block of its pool that fits (best fit, lowest
  address on a tie) and splits off the rest when that rest is worth keeping (at least
  512 bytes in the small pool, more than 1 MiB in the large one); otherwise it keeps the
  whole block and the difference is internal fragmentation;
- a freed block merges with free neighbours in its segment;
- when a new segment would take the reserved total past the device, the allocator first
  returns its entirely free segments to the driver; if that is not enough the request
  fails (an ``oom`` event). The model records the first failure and then carries on as
  if the device were larger, so the rest of the step still shows what it would need.

With recording on, every action is appended to ``trace`` as the allocator's history
entries are (``alloc``, ``free_requested`` / ``free_completed``, ``segment_alloc``,
``segment_free``, ``oom``); ``segments`` returns the state in the layout of
``torch.cuda.memory._snapshot()``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

MiB = 2**20
BLOCK_ROUND_BYTES = 512
SMALL_REQUEST_BYTES = 1 * MiB  # up to this: the small pool
SMALL_SEGMENT_BYTES = 2 * MiB
MID_REQUEST_BYTES = 10 * MiB  # below this: a shared 20 MiB segment of the large pool
MID_SEGMENT_BYTES = 20 * MiB
LARGE_SEGMENT_ROUND_BYTES = 2 * MiB
FIRST_ADDRESS = 0x7F0000000000  # where the model's device address space starts (any fixed value)


def block_bytes(request_bytes: int) -> int:
    """The block size a request is rounded up to."""
    return max(BLOCK_ROUND_BYTES, -(-request_bytes // BLOCK_ROUND_BYTES) * BLOCK_ROUND_BYTES)


def segment_bytes(block: int) -> int:
    """The size of the segment the allocator asks the driver for when no cached block fits."""
    if block <= SMALL_REQUEST_BYTES:
        return SMALL_SEGMENT_BYTES
    if block < MID_REQUEST_BYTES:
        return MID_SEGMENT_BYTES
    return -(-block // LARGE_SEGMENT_ROUND_BYTES) * LARGE_SEGMENT_ROUND_BYTES


@dataclass
class Block:
    address: int
    size: int
    requested_bytes: int = 0  # 0: free (cached)
    frames: list = field(default_factory=list)

    @property
    def free(self) -> bool:
        return self.requested_bytes == 0


@dataclass
class Segment:
    address: int
    size: int
    pool: str  # "small" or "large"
    blocks: list[Block]


class CachingAllocator:
    """One device's allocator; ``recording`` says whether actions go into ``trace``."""

    def __init__(self, capacity_bytes: int):
        self.capacity_bytes = capacity_bytes
        self.segments: list[Segment] = []
        self.trace: list[dict] = []
        self.recording = False
        self.time_us = 0  # stamped on every recorded event
        self.out_of_memory = False  # whether a request has already failed
        self._next_address = FIRST_ADDRESS
        self._owner: dict[int, tuple[Segment, Block]] = {}  # address of an allocated block -> where it is

    @property
    def reserved_bytes(self) -> int:
        return sum(segment.size for segment in self.segments)

    @property
    def allocated_bytes(self) -> int:
        return sum(block.requested_bytes for segment in self.segments for block in segment.blocks)

    def _record(self, action: str, **fields) -> None:
        if self.recording or action == "oom":  # a failure is worth showing even before the recording starts
            self.trace.append({"action": action, **fields, "stream": 0, "time_us": self.time_us})

    def malloc(self, request_bytes: int, frames: list) -> int:
        """Allocate ``request_bytes`` (> 0) and return the block's address."""
        size = block_bytes(request_bytes)
        pool = "small" if size <= SMALL_REQUEST_BYTES else "large"
        fits = [(block.size, block.address, segment, block) for segment in self.segments if segment.pool == pool
                for block in segment.blocks if block.free and block.size >= size]
        if fits:
            _, _, segment, block = min(fits, key=lambda fit: fit[:2])
        else:
            segment = self._new_segment(segment_bytes(size), pool, request_bytes, frames)
            block = segment.blocks[0]
        rest = block.size - size
        if (rest >= BLOCK_ROUND_BYTES) if pool == "small" else (rest > SMALL_REQUEST_BYTES):
            index = segment.blocks.index(block)
            segment.blocks.insert(index + 1, Block(block.address + size, rest))
            block.size = size
        block.requested_bytes, block.frames = request_bytes, frames
        self._owner[block.address] = (segment, block)
        self._record("alloc", addr=block.address, size=request_bytes, frames=frames)
        return block.address

    def free(self, address: int) -> None:
        """Free the block at ``address``; it stays cached in its segment."""
        segment, block = self._owner.pop(address)
        for action in ("free_requested", "free_completed"):
            self._record(action, addr=address, size=block.requested_bytes, frames=block.frames)
        block.requested_bytes, block.frames = 0, []
        merged: list[Block] = []
        for piece in segment.blocks:
            if merged and merged[-1].free and piece.free:
                merged[-1].size += piece.size
            else:
                merged.append(piece)
        segment.blocks = merged

    def _new_segment(self, size: int, pool: str, request_bytes: int, frames: list) -> Segment:
        if self.reserved_bytes + size > self.capacity_bytes:
            for segment in [s for s in self.segments if all(block.free for block in s.blocks)]:
                self.segments.remove(segment)
                self._record("segment_free", addr=segment.address, size=segment.size, frames=[])
            if self.reserved_bytes + size > self.capacity_bytes and not self.out_of_memory:
                self.out_of_memory = True
                self._record("oom", size=request_bytes, device_free=self.capacity_bytes - self.reserved_bytes,
                             frames=frames)
        segment = Segment(self._next_address, size, pool, [Block(self._next_address, size)])
        self._next_address += size
        self.segments.append(segment)
        self._record("segment_alloc", addr=segment.address, size=size, frames=frames)
        return segment

    def snapshot_segments(self) -> list[dict]:
        """The segments as ``torch.cuda.memory._snapshot()`` lists them (device 0, stream 0)."""
        result = []
        for segment in self.segments:
            blocks = [{"address": b.address, "size": b.size, "requested_size": b.requested_bytes,
                       "state": "inactive" if b.free else "active_allocated", "frames": b.frames}
                      for b in segment.blocks]
            allocated = sum(b.size for b in segment.blocks if not b.free)
            result.append({"device": 0, "address": segment.address, "total_size": segment.size,
                           "allocated_size": allocated, "active_size": allocated,
                           "requested_size": sum(b.requested_bytes for b in segment.blocks), "stream": 0,
                           "segment_type": segment.pool, "segment_pool_id": (0, 0), "is_expandable": False,
                           "blocks": blocks})
        return result
