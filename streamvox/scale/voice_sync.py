"""One replica's cloned voices kept the same as the shared voice store's.

Replicas share one voices directory (`--voices-dir`, on shared storage across machines). A replica's
engine registers a voice once, so an upload through another replica, or a delete, must reach this
engine too. Before each request that may name a voice, `refresh` compares the directory's inode and
modification time with those of the last sync (one `stat`, on the event loop: it costs microseconds,
and a thread hop would cost more); only when they differ does it list the store (in a thread), load
and register the voices this engine lacks, and remove the ones that are gone. Every store change
(a voice written, renamed into place or deleted) changes the directory's modification time.

Uploads and deletes through this replica hold the same lock (`changing`), so a sync never sees a
voice half added or half removed by this replica.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from streamvox.engine.client import EngineUnavailable, VoiceRefused

log = logging.getLogger(__name__)


class VoiceSync:
    def __init__(self, state) -> None:
        """`state`: the app's `AppState` (its `engine` and `voice_store`)."""
        self.state = state
        self._seen: tuple[int, int] | None = None  # the directory's (inode, mtime) at the last full sync
        self._stored: dict[str, tuple[int, int]] = {}  # registered voice -> its store entry when registered
        self._lock = asyncio.Lock()

    def _signature(self) -> tuple[int, int] | None:
        try:
            stat = os.stat(self.state.voice_store.root)
        except FileNotFoundError:
            return None
        return stat.st_ino, stat.st_mtime_ns

    def _applies(self) -> bool:
        engine = self.state.engine
        return engine.is_ready and engine.info is not None and engine.info.voice_cloning

    async def refresh(self) -> None:
        if not self._applies() or self._signature() == self._seen:
            return
        async with self._lock:
            await self._sync()

    @asynccontextmanager
    async def changing(self) -> AsyncIterator[None]:
        """Hold off other syncs while this replica adds or deletes a voice (after syncing first)."""
        async with self._lock:
            if self._applies():
                await self._sync()
            yield

    async def _sync(self) -> None:
        signature = self._signature()
        if signature == self._seen:
            return
        store, engine = self.state.voice_store, self.state.engine
        stored = await asyncio.to_thread(store.entries)
        for name in list(engine.voices):
            # A voice the engine restored by itself (at a core start) is taken to be the stored one.
            entry = self._stored.setdefault(name, stored.get(name, (-1, -1)))
            if stored.get(name) != entry:
                engine.remove_voice(name)
                del self._stored[name]
        for name, entry in sorted(stored.items()):
            if name in engine.voices:
                continue
            try:
                sample = await asyncio.to_thread(store.load, name)
                await engine.add_voice(sample)
            except EngineUnavailable:
                return  # the engine restarts and loads the store itself; sync again on the next request
            except VoiceRefused as refused:
                log.warning("stored voice %r was refused by the model: %s", name, refused.message)
                continue
            except (OSError, ValueError, KeyError, RuntimeError) as exc:  # RuntimeError: libsndfile's errors
                log.warning("stored voice %r could not be loaded: %s", name, exc)
                continue
            self._stored[name] = entry
        self._seen = signature
