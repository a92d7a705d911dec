"""The compact fence of settled keys: which keys were ACKed or tombstoned, in 8 bytes a key.

A Gym server must answer ``stale_attempt`` for a settled key for ever, but it need not keep the
key's record in memory: at each committed checkpoint the participant moves its settled keys
here, and the memory per key drops from a record (hundreds of bytes) to one 64-bit hash.

Keys are hashed with BLAKE2b (8 bytes); two keys share a hash with probability about n / 2**64
(for a billion keys, one in 18 billion), and a shared hash would make a fresh key look settled.
Each state keeps sorted ``array('Q')`` segments, one per :meth:`SettledKeys.add_all`, merged so
that there are never more than a few (a lookup is a binary search per segment).
"""

from __future__ import annotations

import bisect
import hashlib
from array import array
from collections.abc import Iterable

from rl_gym_actors.protocol import ExecutionKey, ExecutionState

_MAX_SEGMENTS = 6
SETTLED = (ExecutionState.ACKNOWLEDGED, ExecutionState.TOMBSTONED)


def key_hash(key: ExecutionKey) -> int:
    data = key[0].encode() + b"\0" + str(key[1]).encode()
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


class _HashSet:
    """Sorted segments of 64-bit hashes."""

    def __init__(self) -> None:
        self._segments: list[array] = []

    def __len__(self) -> int:
        return sum(len(s) for s in self._segments)

    def __contains__(self, h: int) -> bool:
        for seg in self._segments:
            i = bisect.bisect_left(seg, h)
            if i < len(seg) and seg[i] == h:
                return True
        return False

    def add_all(self, hashes: Iterable[int]) -> None:
        new = array("Q", sorted(hashes))
        if not new:
            return
        self._segments.append(new)
        # merge the smallest segments while there are too many (sizes stay roughly geometric)
        while len(self._segments) > _MAX_SEGMENTS:
            self._segments.sort(key=len)
            a, b = self._segments.pop(0), self._segments.pop(0)
            self._segments.append(array("Q", sorted(a + b)))

    @property
    def nbytes(self) -> int:
        return sum(s.itemsize * len(s) for s in self._segments)


class SettledKeys:
    """Settled keys by state (``acknowledged`` or ``tombstoned``), 8 bytes each."""

    def __init__(self) -> None:
        self._by_state = {state: _HashSet() for state in SETTLED}

    def add_all(self, keys_by_state: dict[ExecutionState, list[ExecutionKey]]) -> None:
        for state, keys in keys_by_state.items():
            self._by_state[state].add_all(key_hash(k) for k in keys)

    def state_of(self, key: ExecutionKey) -> ExecutionState | None:
        if not self:
            return None
        h = key_hash(key)
        for state, hashes in self._by_state.items():
            if h in hashes:
                return state
        return None

    def __len__(self) -> int:
        return sum(len(h) for h in self._by_state.values())

    def __bool__(self) -> bool:
        return any(len(h) for h in self._by_state.values())

    @property
    def nbytes(self) -> int:
        return sum(h.nbytes for h in self._by_state.values())
