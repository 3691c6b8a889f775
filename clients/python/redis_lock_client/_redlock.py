"""Redlock over independent servers running the lock module: for soft locks only.

A majority of N independent primaries (often 5) each grant the same token with ``LOCK.ACQUIRE``;
the lock is held when floor(N/2)+1 granted within the lease, for the lease less the time the
round took and a drift allowance. One server going down does not stop a cron job or a cache
warmer, which is what Redlock is for.

What it does not give: safety for money, inventory or unique constraints. A holder paused (GC,
SIGSTOP, a slow VM) past its validity, or a clock that jumps, lets another client take the
majority while the first still believes it holds the lock: two holders (tests/test_redlock.py
shows it). And there is no global fence: each server's fence orders only that server's grants,
so fences from different servers cannot be compared, and no single number can tell a stale
holder from a current one. ``fenced()`` and ``guarded()`` are therefore refused. For work that
must not be done twice, use one primary with fences (``Lock``), whose stale holders the
storage or ``LOCK.GUARD`` refuses.
"""

from __future__ import annotations

import os
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Any, Optional

from ._lock import (
    MAX_TTL_MS,
    LockArgumentError,
    LockError,
    LockNotAcquired,
    LockPolicyError,
    _is_int,
    _text,
    policy_error,
)

#: The drift allowance: validity = ttl - elapsed - (ttl * DRIFT_FACTOR + 2 ms). It covers the
#: servers' clocks running at slightly different rates over one lease (1%), plus rounding.
DRIFT_FACTOR = 0.01


class RedlockNoFence(LockError):
    """Redlock has no fence that means anything across servers: see the module docstring."""


class Redlock:
    """A lock held by a majority of the independent servers behind ``clients`` (redis-py
    clients, one per server, each running the module).

    ``server_timeout_ms`` bounds each server's answer in a round; a round that took so long
    that less than nothing of the lease is left counts as failed. ``retries`` more rounds
    follow a failed one, after a random pause of up to ``retry_delay_ms``. ``watchdog=True``
    renews by majority every third of the lease; it stops at the first renewal without a
    majority in time (the validity ends then) and before ``release()`` sends anything.
    """

    def __init__(
        self,
        clients: list,
        key: Any,
        ttl_ms: int,
        *,
        server_timeout_ms: int = 50,
        retries: int = 3,
        retry_delay_ms: int = 200,
        watchdog: bool = False,
    ):
        if not clients:
            raise LockArgumentError("servers", "Redlock needs at least one server")
        if not _is_int(ttl_ms) or not 1 <= ttl_ms <= MAX_TTL_MS:
            raise LockArgumentError("ttl", f"ttl_ms must be an integer from 1 to {MAX_TTL_MS}")
        self._clients = list(clients)
        self.key = key
        self.ttl_ms = ttl_ms
        self.quorum = len(self._clients) // 2 + 1
        self.server_timeout_s = server_timeout_ms / 1000
        self.retries = retries
        self.retry_delay_s = retry_delay_ms / 1000
        self._token: Optional[bytes] = None
        self._fences: dict[int, int] = {}
        self._valid_until = 0.0
        self._pool = ThreadPoolExecutor(max_workers=len(self._clients))
        self._mutex = threading.Lock()
        self.watchdog = watchdog
        self._stopping = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def __repr__(self) -> str:
        return f"<Redlock {_text(self.key)} on {len(self._clients)} servers, {len(self._fences)} granted>"

    # ---- state -----------------------------------------------------------------------------

    @property
    def fences(self) -> dict[int, int]:
        """Each granting server's fence, by the server's index in ``clients``. Comparable only
        with later fences of the same server, never across servers."""
        return dict(self._fences)

    @property
    def validity_ms(self) -> float:
        """How much longer the lock is held by the local clock (0 when not held)."""
        return max(0.0, (self._valid_until - time.monotonic()) * 1000)

    @property
    def held(self) -> bool:
        return self._token is not None and time.monotonic() < self._valid_until

    # ---- rounds ----------------------------------------------------------------------------

    def _round(self, *command: Any) -> tuple[dict[int, Any], Optional[LockPolicyError]]:
        """Sends ``command`` to every server at once; the replies that came within the
        per-server timeout, by server index (errors and silence are left out), and the
        ``-POLICY`` refusal of the first server (by index) that answered with one."""
        futures = {
            self._pool.submit(client.execute_command, *command): i
            for i, client in enumerate(self._clients)
        }
        done, _ = wait(futures, timeout=self.server_timeout_s)
        replies = {}
        refusals: dict[int, LockPolicyError] = {}
        for future in done:
            try:
                replies[futures[future]] = future.result()
            except Exception as error:  # noqa: BLE001 - a server that failed did not grant
                refused = policy_error(self.key, error)
                if refused is not None:
                    refused.__cause__ = error
                    refusals[futures[future]] = refused
        return replies, refusals[min(refusals)] if refusals else None

    def acquire(self) -> dict[int, int]:
        """Take the lock on a majority and return the fences by server. Raises
        ``LockNotAcquired`` after ``1 + retries`` failed rounds (every grant of a failed round
        is released, on every server, with the token), and ``LockPolicyError`` at once, after
        that round's release, when any server's lock namespaces refused the request (another
        round would break the same rule)."""
        if self.held:
            raise LockError(self.key, "already held by this Redlock: release it first")
        for attempt in range(1 + self.retries):
            token = os.urandom(16)
            started = time.monotonic()
            replies, refused = self._round("LOCK.ACQUIRE", self.key, token, self.ttl_ms)
            if refused is not None:
                # The request breaks a server's lock namespace: another round would too. Give
                # back what the others granted.
                self._round("LOCK.RELEASE", self.key, token)
                raise refused
            grants = {i: int(r) for i, r in replies.items() if r is not None}
            elapsed = time.monotonic() - started
            validity = self.ttl_ms / 1000 - elapsed - (self.ttl_ms * DRIFT_FACTOR + 2) / 1000
            if len(grants) >= self.quorum and validity > 0:
                self._token = token
                self._fences = grants
                self._valid_until = started + validity
                if self.watchdog:
                    self._start_watchdog()
                return dict(grants)
            # A minority, or too late: give every grant back, even those that answered late.
            self._round("LOCK.RELEASE", self.key, token)
            if attempt < self.retries:
                time.sleep(random.uniform(0, self.retry_delay_s))
        raise LockNotAcquired(
            self.key, f"no majority ({self.quorum} of {len(self._clients)}) within the lease"
        )

    def renew(self) -> bool:
        """Renew on every server; True when a majority renewed in time (the validity starts
        again), False when not (the lock is to be considered lost)."""
        with self._mutex:
            token = self._token
            if token is None or not self.held:
                return False
            started = time.monotonic()
            replies, _ = self._round("LOCK.RENEW", self.key, token, self.ttl_ms)
            renewed = sum(1 for r in replies.values() if r == 1)
            elapsed = time.monotonic() - started
            validity = self.ttl_ms / 1000 - elapsed - (self.ttl_ms * DRIFT_FACTOR + 2) / 1000
            if renewed >= self.quorum and validity > 0 and time.monotonic() < self._valid_until:
                self._valid_until = started + validity
                return True
            self._valid_until = 0.0
            return False

    def _start_watchdog(self) -> None:
        self._stopping.clear()
        self._thread = threading.Thread(target=self._watch, name="redlock-watchdog", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        """Renews by majority every third of the lease; stops at the first failed renewal, when
        the validity runs out, or at release."""
        while not self._stopping.wait(self.ttl_ms / 3000):
            if not self.renew():
                return

    def _stop_watchdog(self) -> None:
        self._stopping.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def release(self) -> int:
        """Stop the watchdog (no renewal is sent after this returns), then release on every
        server (token-checked, so a late grant on a minority server goes too). Returns how many
        servers released."""
        self._stop_watchdog()
        with self._mutex:
            token, self._token = self._token, None
            self._fences = {}
            self._valid_until = 0.0
        if token is None:
            return 0
        replies, _ = self._round("LOCK.RELEASE", self.key, token)
        return sum(1 for r in replies.values() if r == 1)

    def close(self) -> None:
        self._stop_watchdog()
        self._pool.shutdown(wait=False)

    def __enter__(self) -> "Redlock":
        self.acquire()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()

    # ---- what Redlock cannot do ------------------------------------------------------------

    def fenced(self, work: Any) -> Any:
        raise RedlockNoFence(
            self.key,
            "Redlock has no global fence: fences of independent servers are not comparable. "
            "Use Lock on one primary for work that must not run twice",
        )

    def guarded(self, *command: Any) -> Any:
        raise RedlockNoFence(
            self.key,
            "LOCK.GUARD checks one server's fence, which says nothing about the majority. "
            "Use Lock on one primary for fenced writes",
        )
