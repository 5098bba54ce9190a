"""The asyncio twin of governor.store.redis_slot: a `redis.asyncio.Redis` to the primary that
owns the store's one Cluster slot, for the per-step path on the event loop (redis-py's
asyncio Cluster client is not used: under concurrent calls it lost replies of scripts that
ran). Its connections look the owner up when they connect (the look-up, only when the owner
is not known or may have changed, runs in a thread), check it as the blocking ones do, and
are found again after a MOVED or a lost connection; a MOVED target is never followed."""

from __future__ import annotations

import asyncio
from typing import Any

import redis.asyncio
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import AskError, ConnectionError, ResponseError, TimeoutError

from governor.store.redis_slot import SlotMap, owns


class AsyncSlotOwnerConnection(redis.asyncio.Connection):
    """SlotOwnerConnection (governor.store.redis_slot), on an event loop."""

    def __init__(self, *, slot_map: SlotMap, **kwargs: Any) -> None:
        self.slot_map = slot_map
        self._moved = False  # a MOVED or ASK came on this connection: it is to another node
        self._serves_slot = False  # this connection's node said it is the primary serving the slot
        super().__init__(**kwargs)

    async def connect_check_health(self, check_health: bool = True, retry_socket_connect: bool = True) -> None:
        if self.is_connected:
            return
        for attempt in (1, 2):
            self.host, self.port = self.slot_map.current or await asyncio.to_thread(self.slot_map.owner)
            self._serves_slot = False
            try:
                return await super().connect_check_health(check_health=check_health, retry_socket_connect=False)
            except (ConnectionError, TimeoutError):
                self.slot_map.stale()
                if attempt == 2 or self._serves_slot:  # as SlotOwnerConnection: a second owner, once
                    raise

    async def on_connect_check_health(self, check_health: bool = True) -> None:
        await super().on_connect_check_health(check_health=check_health)
        try:
            await self.send_command("CLUSTER", "NODES")
            nodes = await self.read_response()
        except ResponseError as exc:
            raise ConnectionError(f"Redis Cluster: {self.host}:{self.port} is no cluster node ({exc})") from exc
        if not owns(nodes, self.slot_map.slot):
            raise ConnectionError(f"Redis Cluster: {self.host}:{self.port} is not the primary serving slot "
                                  f"{self.slot_map.slot}")
        self._serves_slot = True

    async def read_response(self, *args: Any, **kwargs: Any) -> Any:
        try:
            response = await super().read_response(*args, **kwargs)
        except AskError:
            self._wrong_node()
            raise
        except (ConnectionError, TimeoutError):
            self.slot_map.stale()
            raise
        if isinstance(response, AskError):
            self._wrong_node()
        return response

    def _wrong_node(self) -> None:
        self._moved = True
        self.slot_map.stale()

    def should_reconnect(self) -> bool:
        return self._moved or super().should_reconnect()

    def reset_should_reconnect(self) -> None:
        self._moved = False
        super().reset_should_reconnect()


class AsyncSlotOwnerSSLConnection(AsyncSlotOwnerConnection, redis.asyncio.SSLConnection):
    pass


def async_slot_owner_client(slot_map: SlotMap, *, connect: dict[str, Any], on_connect: Any) -> redis.asyncio.Redis:
    """slot_owner_client's asyncio twin."""
    retry = Retry(NoBackoff(), 1, supported_errors=(AskError,))
    pool = redis.asyncio.ConnectionPool(
        connection_class=AsyncSlotOwnerSSLConnection if slot_map.tls else AsyncSlotOwnerConnection,
        slot_map=slot_map, retry=retry, redis_connect_func=on_connect, **connect)
    return redis.asyncio.Redis.from_pool(pool)
