"""The naive lock the tests hold the helper against: each shortcut below is one that client-side
locks have shipped and users have reported. Every failure-case test runs on both and must find a
problem here and none in the helper, so the tests are shown able to fail.

Shaped like ``redis_lock_client.Lock`` (acquire, release, renew, check, held, the watchdog
pause hook) so that one test body drives either.
"""

from __future__ import annotations

import os
import threading
from typing import Any, Callable, Optional


class NaiveLock:
    def __init__(self, client: Any, key: str, ttl_ms: int, *, wait_ms: Optional[int] = None,
                 watchdog: bool = False, on_lost: Optional[Callable] = None, **_ignored: Any):
        self._client = client
        self.key = key
        self.ttl_ms = ttl_ms
        self.wait_ms = wait_ms
        self.watchdog = watchdog
        self.on_lost = on_lost  # never called: no loss is ever noticed (RedLock.net #92)
        self.fence: Optional[int] = None
        self.held = False
        self._token: Optional[bytes] = None
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._watchdog_paused: Callable[[], None] = lambda: None

    @property
    def lost(self) -> bool:
        return not self.held

    def acquire(self) -> bool:
        # A lost reply is treated as "not acquired" and retried with a new token, orphaning
        # the grant the first attempt may have made.
        for _ in range(3):
            self._token = os.urandom(16)
            command = ["LOCK.ACQUIRE", self.key, self._token, self.ttl_ms]
            if self.wait_ms is not None:
                command += ["WAIT", self.wait_ms]
            try:
                reply = self._client.execute_command(*command)
            except ConnectionError:
                continue
            except Exception as error:  # noqa: BLE001
                if "Connection" in type(error).__name__:
                    continue
                raise
            if reply is None:
                return False
            self.fence, self.held = int(reply), True
            if self.watchdog:
                self._stop.clear()
                self._thread = threading.Thread(target=self._watch, daemon=True)
                self._thread.start()
            return True
        return False

    # redis-py #621: __enter__ hands back the outcome, and the body runs either way.
    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()

    def release(self) -> bool:
        # Redisson #7272 / #1626: the watchdog is told to stop but not waited for.
        self._stop.set()
        self.held = False
        return self._client.execute_command("LOCK.RELEASE", self.key, self._token) == 1

    def renew(self) -> None:
        self._client.execute_command("LOCK.RENEW", self.key, self._token, self.ttl_ms)

    def extend(self, more_ms: int) -> None:
        # redis-py #629: extending adds to what is left instead of setting the lease.
        info = self._client.execute_command("LOCK.INFO", self.key)
        fields = dict(zip(info[::2], info[1::2])) if isinstance(info, list) else info
        left = int(fields[b"ttl"])
        self._client.execute_command("LOCK.RENEW", self.key, self._token, left + more_ms)

    def check(self) -> int:
        if self.fence is None:
            raise RuntimeError("never acquired")
        return self.fence  # believes it holds whatever happened (Redisson #5698)

    def fenced(self, work: Callable[[int], Any]) -> Any:
        return work(self.check())

    def _watch(self) -> None:
        while not self._stop.wait(self.ttl_ms / 3000):
            self._watchdog_paused()
            # Renews even if the timer fired long after the lease ended, and ignores a 0.
            self.renew()
