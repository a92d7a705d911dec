"""The compact record of rollout ids that sealed: :class:`SealedIds`.

A sealed rollout id must never run again (Gym forgets a key once a commit released it, so Gym
cannot say so), yet the orchestrator forgets a rollout's full record at each committed
checkpoint to keep its memory flat. What outlives the record is an 8-byte digest of the id
(BLAKE2b, 64 bits): 8 bytes per id, a few more while an id sits in the newest generation.

Digests live in generations of sorted ``array('Q')``: one per committed checkpoint, adjacent
small generations merged, the oldest dropped once more than ``retention`` ids are held (so at
least the ``retention`` most recent ids are always known). A lookup bisects each generation.
Two ids share a digest with probability about n / 2**64 for n ids held: such an id would be
answered ``forgotten`` instead of being run, never run twice.

Pure and synchronous: no I/O. :meth:`to_bytes` / :meth:`from_bytes` give the checkpoint part's
file form (little-endian u64, generations concatenated, oldest first, with their sizes).
"""

from __future__ import annotations

import hashlib
import struct
import sys
from array import array
from bisect import bisect_left
from collections.abc import Iterable

DEFAULT_RETENTION = 10_000_000  # ids; 80 MB of digests at most, plus a generation in flight
_MERGE_FRACTION = 8  # adjacent generations merge while together <= retention / 8


def id_digest(rollout_id: str) -> int:
    """The 64-bit digest of a rollout id."""
    return int.from_bytes(hashlib.blake2b(rollout_id.encode(), digest_size=8).digest(), "little")


class SealedIds:
    """Digests of sealed rollout ids, oldest generation first (see the module docstring)."""

    def __init__(self, retention: int = DEFAULT_RETENTION) -> None:
        if not isinstance(retention, int) or isinstance(retention, bool) or retention < 1:
            raise ValueError(f"retention must be an int >= 1, got {retention!r}")
        self.retention = retention
        self._generations: list[array[int]] = []
        self._newest: set[int] = set()  # since the last seal_generation()
        self.dropped = 0  # ids dropped past the retention

    def __len__(self) -> int:
        return sum(len(g) for g in self._generations) + len(self._newest)

    def __contains__(self, rollout_id: object) -> bool:
        if not isinstance(rollout_id, str):
            return False
        digest = id_digest(rollout_id)
        if digest in self._newest:
            return True
        for gen in self._generations:
            i = bisect_left(gen, digest)
            if i < len(gen) and gen[i] == digest:
                return True
        return False

    @property
    def generations(self) -> int:
        return len(self._generations) + (1 if self._newest else 0)

    def add(self, rollout_ids: Iterable[str]) -> None:
        """Remember these ids (they sealed)."""
        self._newest.update(id_digest(r) for r in rollout_ids)

    def seal_generation(self) -> None:
        """Close the newest generation (at a committed checkpoint): sorted, merged with small
        neighbours, the oldest dropped past the retention."""
        if self._newest:
            self._generations.append(array("Q", sorted(self._newest)))
            self._newest = set()
        limit = max(1, self.retention // _MERGE_FRACTION)
        while len(self._generations) > 1 and (
            len(self._generations[-1]) + len(self._generations[-2]) <= limit
        ):
            newer = self._generations.pop()
            older = self._generations.pop()
            self._generations.append(array("Q", sorted(set(older) | set(newer))))
        while len(self._generations) > 1 and len(self) - len(self._generations[0]) >= (
            self.retention
        ):
            self.dropped += len(self._generations.pop(0))

    def to_bytes(self) -> bytes:
        """The file form: a count of generations, each size, then every digest (LE u64)."""
        self.seal_generation()
        head = struct.pack("<Q", len(self._generations)) + b"".join(
            struct.pack("<Q", len(g)) for g in self._generations
        )
        body = b"".join(_le(g) for g in self._generations)
        return head + body

    @classmethod
    def from_bytes(cls, data: bytes, retention: int = DEFAULT_RETENTION) -> SealedIds:
        """The record :meth:`to_bytes` wrote. Raises ValueError on a torn or foreign file."""
        if len(data) < 8:
            raise ValueError("sealed ids: file too short")
        (count,) = struct.unpack_from("<Q", data, 0)
        offset = 8 + 8 * count
        if count > len(data) or offset > len(data):
            raise ValueError("sealed ids: bad generation count")
        sizes = struct.unpack_from(f"<{count}Q", data, 8)
        if offset + 8 * sum(sizes) != len(data):
            raise ValueError("sealed ids: size does not match the file")
        out = cls(retention)
        for size in sizes:
            gen = array("Q")
            gen.frombytes(data[offset : offset + 8 * size])
            if sys.byteorder != "little":
                gen.byteswap()
            if any(gen[i] >= gen[i + 1] for i in range(len(gen) - 1)):
                raise ValueError("sealed ids: a generation is not sorted")
            out._generations.append(gen)
            offset += 8 * size
        return out


def _le(gen: array[int]) -> bytes:
    if sys.byteorder == "little":
        return gen.tobytes()
    swapped = array("Q", gen)
    swapped.byteswap()
    return swapped.tobytes()
