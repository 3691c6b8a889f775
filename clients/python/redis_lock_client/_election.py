"""Leader election over one lock key, in the shape of etcd's Election: campaign, proclaim,
leader, observe, resign.

The leader holds the lock (a watchdog renews it); its public value is the grant's LABEL, which
everyone reads with LOCK.WHO, never the token. Its fence is its term: terms only grow, and a
leader's writes go through ``guarded()`` so that a deposed leader (paused past its lease, cut
off) cannot write once a newer term exists. Leadership is a lease: after a leader dies, the
next one is elected when the lease (plus any lock-delay) runs out.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional

from ._lock import Lock, LockError, LockLost, RetryPolicy, _text


@dataclass(frozen=True)
class Leader:
    """Who leads: the value it proclaimed (its label), its term (fence) and its client id."""

    value: str
    term: int
    client_id: int


def _as_map(reply: Any) -> dict:
    """A map reply (RESP3) or a flat field/value list (RESP2) as a dict with text keys."""
    if isinstance(reply, dict):
        items = reply.items()
    else:
        items = zip(reply[::2], reply[1::2])
    return {_text(k): v for k, v in items}


class Election:
    """Campaign for leadership of ``name`` with leases of ``ttl_ms``.

    ``client`` is a ``redis.Redis``: a campaign blocks one of its connections while it waits, so
    give it a ``socket_timeout`` longer than the wait (or none). ``observe()`` needs keyspace
    notifications of module events on the server (``notify-keyspace-events`` with ``K`` and
    ``d``, or ``KA``). ``on_lost`` is called once if this candidate's leadership is lost (its
    lease ran out, it was force-released), as ``Lock``'s is.
    """

    def __init__(
        self,
        client: Any,
        name: Any,
        ttl_ms: int,
        *,
        on_lost: Optional[Callable[[Lock], None]] = None,
        retry: RetryPolicy = RetryPolicy(),
    ):
        self._client = client
        self.key = name
        self.ttl_ms = ttl_ms
        self.on_lost = on_lost
        self.retry = retry
        self._lock: Optional[Lock] = None

    # ---- leading ---------------------------------------------------------------------------

    def campaign(self, value: str, wait_ms: int = 0) -> int:
        """Wait (on the server, first come first served) to lead, with ``value`` as the public
        value; returns the term. ``wait_ms`` 0 waits without a limit; when a positive wait runs
        out, ``LockNotAcquired`` is raised. The lease is renewed by a watchdog until
        ``resign()``."""
        if self._lock is not None and self._lock.held:
            raise LockError(self.key, "already leading: resign first")
        lock = Lock(
            self._client,
            self.key,
            self.ttl_ms,
            wait_ms=wait_ms,
            watchdog=True,
            label=value,
            on_lost=self.on_lost,
            retry=self.retry,
        )
        term = lock.acquire()
        self._lock = lock
        return term

    @property
    def term(self) -> Optional[int]:
        """The term (fence) of this candidate's leadership; None before any."""
        return self._lock.fence if self._lock is not None else None

    @property
    def leading(self) -> bool:
        """True while this candidate leads (by the local lease too)."""
        return self._lock is not None and self._lock.held

    def proclaim(self, value: str) -> None:
        """Change the public value without giving up leadership (the term stays). Raises
        ``LockLost`` when this candidate no longer leads."""
        if self._lock is None:
            raise LockError(self.key, "not leading: campaign first")
        self._lock.relabel(value)

    def guarded(self, *command: Any) -> Any:
        """Run one Redis command only while this term is current (``LOCK.GUARD``); raises
        ``LockLost`` when a newer term exists (the command did not run)."""
        if self._lock is None:
            raise LockLost(self.key, "not leading")
        return self._lock.guarded(*command)

    def resign(self) -> bool:
        """Stop leading (release). True when this candidate was still leading."""
        if self._lock is None:
            return False
        lock, self._lock = self._lock, None
        return lock.release()

    # ---- watching --------------------------------------------------------------------------

    def leader(self) -> Optional[Leader]:
        """The current leader, or None when nobody leads."""
        who = self._client.execute_command("LOCK.WHO", self.key, "COUNT", 1)
        if who is None:
            return None
        holders = _as_map(who).get("holders") or []
        if not holders:
            return None
        holder = _as_map(holders[0])
        return Leader(
            value=_text(holder["label"]),
            term=int(holder["fence"]),
            client_id=int(holder["client_id"]),
        )

    def observe(self, stop: threading.Event, idle_s: float = 1.0) -> Iterator[Optional[Leader]]:
        """Yield the leader (None: nobody leads) now and at every change, in order, each change
        once, until ``stop`` is set (it is looked at least every ``idle_s``). Driven by keyspace
        events of the key; every (re)subscription reads the leader again, so nothing is missed
        across a reconnect."""
        db = self._client.connection_pool.connection_kwargs.get("db", 0)
        channel = f"__keyspace@{db}__:{_text(self.key)}"
        last: Any = object()
        while not stop.is_set():
            pubsub = self._client.pubsub(ignore_subscribe_messages=True)
            try:
                pubsub.subscribe(channel)
                # Subscribed first, read second: a change between the two is seen by both.
                current = self.leader()
                if current != last:
                    last = current
                    yield current
                while not stop.is_set():
                    message = pubsub.get_message(timeout=idle_s)
                    if message is None:
                        continue
                    if message.get("data") in (b"lock.renew", "lock.renew"):
                        continue
                    current = self.leader()
                    if current != last:
                        last = current
                        yield current
            except (ConnectionError, OSError) as error:
                if stop.is_set():
                    break
                del error  # resubscribe and read again
            except Exception as error:  # noqa: BLE001 - redis-py's connection errors
                if stop.is_set() or "Connection" not in type(error).__name__:
                    raise
            finally:
                pubsub.close()
