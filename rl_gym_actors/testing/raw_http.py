"""Raw-socket helpers for tests and benchmarks that talk to the Gym server below HTTP clients
(slow-loris, idle and oversized connections)."""

from __future__ import annotations

import asyncio


async def until_closed(reader: asyncio.StreamReader, timeout_s: float) -> bytes:
    """Everything the server sends until it closes (EOF or reset), within ``timeout_s``."""
    got = b""
    async with asyncio.timeout(timeout_s):
        while True:
            try:
                chunk = await reader.read(65536)
            except ConnectionError:
                return got
            if not chunk:
                return got
            got += chunk
