"""The Lock guard: one acquisition at a time, its fence, an optional watchdog, fenced calls.

Every rule here answers a bug seen in client-side locks:

- the body of ``with Lock(...)`` runs only when the lock was granted (a failed acquire raises);
- the watchdog renews with a token-checked ``LOCK.RENEW`` that *sets* the lease, and every
  renewal is sent while holding ``_mutex`` after checking ``_stopping``: ``release()`` sets
  ``_stopping`` and then takes ``_mutex``, so once it sends ``LOCK.RELEASE`` no renewal can follow;
- the lease is tracked locally and conservatively (``_lease_end`` = when the successful ACQUIRE or
  RENEW was *sent* + ttl): a watchdog that wakes late, or a reply that arrives late, means the lock
  is lost, never renewed back into a second holder; ``check()`` says so too without a watchdog;
- a lost reply is not a lost grant: ACQUIRE is retried with the same token, which gets its own
  fence back if the first attempt was granted; a connection that could not be opened sent
  nothing, so it is reported at once (``LockConnectionError``), never as "unknown";
- retrying stops ``RetryPolicy.deadline`` after the first failure whatever the attempts left, so
  a client that retries on its own (redis-py >= 6) does not multiply the wait;
- a loss is reported through ``on_lost`` exactly once, by whichever thread sees it first (the
  watchdog, or the caller's ``lost``/``check()``/``fenced()``/``renew()``/``guarded()``/
  ``transaction()``/``release()``): ``_mark_lost`` records the first reason, ``_report_loss``
  hands the report to one thread only, and is never called with ``_mutex`` held.
"""

from __future__ import annotations

import logging
import math
import os
import random
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional, TypeVar

from redis import exceptions as rx

log = logging.getLogger("redis_lock_client")

T = TypeVar("T")

# Replies a client should resend (same token) after a short wait: the cluster is moving or
# failing over, the key moved, the node became a replica or is still loading. Not READONLY: a
# resend on the same connection reaches the same replica (redis-py's Sentinel client turns it
# into a ConnectionError itself, which is retried), and it is never "unknown": nothing ran.
_RETRY_PREFIXES = ("TRYAGAIN", "CLUSTERDOWN", "UNBLOCKED", "LOADING", "MASTERDOWN")


# Why a lock is lost when LOCK.RENEW answers 0.
_NOT_HELD = "LOCK.RENEW replied 0: the token no longer holds it"

# The largest values any server with the module accepts: lock.max-ttl can be raised to one year,
# a WAIT timeout to 2^45 ms, a semaphore to 10000 permits. Beyond them nothing can be granted.
MAX_TTL_MS = 31_536_000_000
MAX_WAIT_MS = 2**45
MAX_LIMIT = 10_000
# The longest label a server accepts (LABEL), in bytes (printable ASCII: one byte a character).
MAX_LABEL_LEN = 128


class LockArgumentError(ValueError):
    """A setting that makes no sense, refused before any command is sent. ``reason`` is one
    keyword, the same in every helper of this repository (clients/conformance/README.md):
    ``ttl``, ``watchdog-ttl``, ``wait``, ``limit``, ``shared+limit``, ``retry``, ``label``,
    ``sync`` (``sync`` not None and not ``(numreplicas >= 0, timeout_ms from 1 to 2**45)``) or
    ``fsync`` (``fsync_ms`` not None and not an integer from 1 to 2**45)."""

    def __init__(self, reason: str, message: str):
        super().__init__(f"{reason}: {message}")
        self.reason = reason


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class LockError(Exception):
    """Base of this package's errors; ``key`` names the lock."""

    def __init__(self, key: Any, message: str):
        super().__init__(f"{_text(key)}: {message}")
        self.key = key


class LockNotAcquired(LockError):
    """Another token holds the lock (or others queue first), or the WAIT budget ran out."""


class LockLost(LockError):
    """The lock is no longer held: its lease ran out, a renewal failed or came too late, or
    an operator force-released it. Stop working on the protected resource."""


class LockUnknown(LockError):
    """A request was sent but its reply was lost, and the retries (same token) ran out before
    the outcome was known, or a retry was answered by an error that says nothing about the try
    whose reply was lost (``-POLICY``, ``-READONLY``, ``-MOVED``, ``-NOREPLICAS`` ...). A grant
    that did happen ends with its lease (the helper also tried to release it)."""


class LockPolicyError(LockError):
    """The server's lock namespaces refused the request (a ``-POLICY`` reply, from a server with
    ``lock.namespaces`` in ``enforce`` mode): nothing was changed. Never retried: the same
    request breaks the same rule. ``namespace`` names the namespace, ``detail`` the rule broken
    (``ttl 600000 above the namespace's max-ttl 30000``, ``a LABEL is required``); the
    redis-py error is the ``__cause__``."""

    def __init__(self, key: Any, namespace: str, detail: str):
        super().__init__(key, f"refused by the policy of namespace {namespace}: {detail}")
        self.namespace = namespace
        self.detail = detail


def policy_error(key: Any, error: BaseException) -> Optional[LockPolicyError]:
    """``LockPolicyError`` for a ``-POLICY <namespace>: <detail>`` reply, else None."""
    if not isinstance(error, rx.ResponseError):
        return None
    # redis-py strips a code it knows (`ERR POLICY x` arrives as `POLICY x` with status_code
    # "ERR"); a POLICY reply's code is unknown to it and stays in the text.
    if getattr(error, "status_code", None) is not None:
        return None
    text = str(error)
    if not text.startswith("POLICY "):
        return None
    namespace, _, detail = text[len("POLICY ") :].partition(": ")
    return LockPolicyError(key, namespace, detail)


def unconfirmed(error: BaseException) -> bool:
    """Whether ``error`` answers a renewal that the server applied but could not confirm:
    SYNC's ``NOREPLICAS the change was not acknowledged ...: a failover may lose it`` or FSYNC's
    ``ERR the change was not fsynced to the AOF ...``. The lease was renewed on the primary, so
    the lock is still held; only the lease it had before can be counted on."""
    if not isinstance(error, rx.ResponseError):
        return False
    text = str(error)
    if getattr(error, "status_code", None) == "ERR":
        return text.startswith("the change was not fsynced")
    return text.startswith("NOREPLICAS ")


class LockConnectionError(LockError):
    """No connection to the server could be opened: the request was never sent, so nothing was
    granted (or released). Raised at once, without the helper's own retries (the client may have
    retried the connect itself: redis-py >= 6 does by default). The redis-py error is the
    ``__cause__``."""


@dataclass(frozen=True)
class RetryPolicy:
    """Bounded exponential backoff for replies that ask for a retry and for lost connections.

    ``attempts`` counts every try, the first included; the n-th retry waits a random time
    between half and all of ``min(cap, base * 2**n)`` seconds. ``deadline`` (seconds) bounds the
    retrying: no retry starts later than ``deadline`` after the first failure, however many
    attempts are left. One try is one call of the client, with whatever retries the client makes
    inside it (redis-py >= 6 retries on its own by default).
    """

    attempts: int = 6
    base: float = 0.02
    cap: float = 1.0
    deadline: float = 10.0

    def __post_init__(self) -> None:
        if (
            not _is_int(self.attempts)
            or self.attempts < 1
            or not self.base >= 0
            or not self.cap >= 0
            or not self.deadline > 0
        ):
            raise LockArgumentError(
                "retry", "RetryPolicy needs attempts >= 1, delays >= 0 and a deadline > 0"
            )

    def delay(self, retry: int) -> float:
        return min(self.cap, self.base * 2**retry) * random.uniform(0.5, 1.0)


def not_connected(error: BaseException) -> bool:
    """Whether ``error`` says no connection could be opened, so nothing of the command was sent:
    redis-py words every failed connect as "... connecting to ..." (refused, unreachable, DNS,
    timeout), raised while handling the socket's own error."""
    if isinstance(error, rx.BusyLoadingError) or not isinstance(
        error, (rx.ConnectionError, rx.TimeoutError)
    ):
        return False
    return " connecting to " in str(error) or isinstance(
        error.__context__, (ConnectionRefusedError, socket.gaierror)
    )


def reply_lost(error: BaseException) -> bool:
    """Whether ``error`` may hide a command that ran: the connection failed or timed out after
    it was opened (a LOADING reply is the server's answer, not a lost one)."""
    return (
        isinstance(error, (rx.ConnectionError, rx.TimeoutError))
        and not isinstance(error, rx.BusyLoadingError)
        and not not_connected(error)
    )


def is_retriable(error: BaseException) -> bool:
    """Whether ``error`` means "send the same command again (same token) later"."""
    # ConnectionError covers lost connections and BusyLoadingError; TimeoutError a socket
    # timeout. A blocked ACQUIRE whose connection closes is dropped by the server, never granted.
    if isinstance(error, (rx.ConnectionError, rx.TimeoutError)):
        return True
    if isinstance(error, rx.ResponseError):
        return str(error).startswith(_RETRY_PREFIXES) or isinstance(
            error, (rx.TryAgainError, rx.ClusterDownError)
        )
    return False


class Lock:
    """One lock key, taken by one holder at a time with a fresh random token.

    ``client`` is a ``redis.Redis`` or ``redis.cluster.RedisCluster`` (anything with
    ``execute_command``; ``transaction()`` also needs ``pipeline()`` with WATCH, so standalone).
    A blocking acquire holds its connection: give the client a ``socket_timeout`` longer than
    ``wait_ms`` (or none). ``session=True`` ties the grant to the connection that made it: use a
    client with ``single_connection_client=True`` for that. One ``Lock`` belongs to one thread
    of your code (its watchdog thread is its own business). ``label`` names the grant for
    operators (``LABEL``, shown by ``LOCK.WHO`` and the long-hold log; a server module of 0.2.0
    or later): not a secret, and it proves nothing.
    """

    def __init__(
        self,
        client: Any,
        key: Any,
        ttl_ms: int,
        *,
        wait_ms: Optional[int] = None,
        session: bool = False,
        shared: bool = False,
        limit: Optional[int] = None,
        watchdog: bool = False,
        on_lost: Optional[Callable[["Lock"], None]] = None,
        retry: RetryPolicy = RetryPolicy(),
        label: Optional[str] = None,
        sync: Optional[tuple[int, int]] = None,
        fsync_ms: Optional[int] = None,
    ):
        if not _is_int(ttl_ms) or not 1 <= ttl_ms <= MAX_TTL_MS:
            raise LockArgumentError(
                "ttl", f"ttl_ms must be an integer from 1 to {MAX_TTL_MS} (one year), in ms"
            )
        if wait_ms is not None and (not _is_int(wait_ms) or not 0 <= wait_ms <= MAX_WAIT_MS):
            raise LockArgumentError(
                "wait", f"wait_ms must be None (do not wait) or 0 (no limit) to {MAX_WAIT_MS}"
            )
        if limit is not None and (not _is_int(limit) or not 1 <= limit <= MAX_LIMIT):
            raise LockArgumentError(
                "limit", f"limit must be None (not a semaphore) or 1 to {MAX_LIMIT}"
            )
        if shared and limit is not None:
            raise LockArgumentError(
                "shared+limit",
                "shared and limit together are ambiguous: a permit is already a shared hold;"
                " ask for one of them",
            )
        if watchdog and ttl_ms < 3:
            raise LockArgumentError(
                "watchdog-ttl", "a watchdog renews every ttl_ms / 3: ttl_ms must be at least 3"
            )
        if not isinstance(retry, RetryPolicy):
            raise LockArgumentError("retry", "retry must be a RetryPolicy")
        if label is not None and not _valid_label(label):
            raise LockArgumentError(
                "label", "a label is 1 to 128 bytes of printable ASCII without spaces"
            )
        if sync is not None and not (
            isinstance(sync, tuple)
            and len(sync) == 2
            and _is_int(sync[0])
            and _is_int(sync[1])
            and sync[0] >= 0
            and 1 <= sync[1] <= MAX_WAIT_MS
        ):
            raise LockArgumentError(
                "sync",
                f"sync must be None or (numreplicas >= 0, timeout_ms from 1 to {MAX_WAIT_MS})",
            )
        if fsync_ms is not None and (not _is_int(fsync_ms) or not 1 <= fsync_ms <= MAX_WAIT_MS):
            raise LockArgumentError(
                "fsync", f"fsync_ms must be None or a timeout from 1 to {MAX_WAIT_MS} ms"
            )
        self._client = client
        self.key = key
        self.ttl_ms = ttl_ms
        self.wait_ms = wait_ms
        self.session = session
        self.shared = shared
        self.limit = limit
        self.watchdog = watchdog
        self.on_lost = on_lost
        self.retry = retry
        self.label = label
        self.sync = sync
        self.fsync_ms = fsync_ms
        # The local lease: the server counts whole milliseconds from when it ran the command, so
        # allow 1% + 2 ms for rounding and clock rate.
        self._lease_s = max(0.0, ttl_ms * 0.99 - 2) / 1000
        self._token: Optional[bytes] = None
        self._fence: Optional[int] = None
        self._lease_end = 0.0
        self._lost_reason: Optional[str] = None
        # Guards _lost_reason and _loss_reported: the first reason wins, one thread reports.
        self._loss_lock = threading.Lock()
        self._loss_reported = False
        # Held across every renewal round trip: release() takes it after setting _stopping.
        self._mutex = threading.Lock()
        self._stopping = threading.Event()
        self._thread: Optional[threading.Thread] = None
        # A renewal's -POLICY refusal, for renew() to raise (set and read under _mutex).
        self._refused: Optional[LockPolicyError] = None
        # Tests pause the watchdog here, between its timer firing and its renewal.
        self._watchdog_paused: Callable[[], None] = lambda: None

    def __repr__(self) -> str:
        state = "held" if self.held else ("lost" if self.lost else "not held")
        return f"<Lock {_text(self.key)} {state} fence={self._fence}>"

    # ---- state ---------------------------------------------------------------------------

    @property
    def fence(self) -> Optional[int]:
        """The fence of the current grant (None before the first grant). Hand it to the storage
        you protect; it stays readable after a loss, for logs."""
        return self._fence

    @property
    def lost(self) -> bool:
        """True once the grant is known or presumed gone (see ``LockLost``), including as soon
        as the local lease has run out, without waiting for a call. Reading it when it turns
        True reports the loss (``on_lost``) if no other thread did."""
        self._lapsed()
        self._report_loss()
        return self._lost_reason is not None

    @property
    def held(self) -> bool:
        """Granted, not released, not lost, and the lease not yet over by the local clock."""
        return self._token is not None and not self.lost

    def check(self) -> int:
        """The fence, or ``LockLost`` when the lock is no longer held."""
        if self._token is None:
            raise LockError(self.key, "not held: acquire it first")
        if self.lost:
            raise LockLost(self.key, f"lost: {self._lost_reason}")
        return self._fence  # type: ignore[return-value]

    # ---- acquire and release ---------------------------------------------------------------

    def acquire(self) -> int:
        """Take the lock and return its fence. Raises ``LockNotAcquired`` when it is held by
        another token (after waiting ``wait_ms`` on the server if given),
        ``LockConnectionError`` at once when no connection could be opened before any request
        was sent (nothing granted), ``LockUnknown`` when a request was sent, its reply lost, and
        retries (same token) ran out without an answer."""
        if self._token is not None:
            raise LockError(self.key, "already acquired by this Lock: release it first")
        token = os.urandom(16)
        base = ["LOCK.ACQUIRE", self.key, token, self.ttl_ms]
        if self.session:
            base.append("SESSION")
        if self.shared:
            base.append("SHARED")
        if self.limit is not None:
            base += ["LIMIT", self.limit]
        if self.label is not None:
            base += ["LABEL", self.label]
        base += self._durability()
        waits_until = None
        if self.wait_ms:
            waits_until = time.monotonic() + self.wait_ms / 1000
        retries = 0
        maybe_granted = False  # a try was sent and its reply lost
        give_up_at = None  # the retry deadline, from the first failure
        while True:
            command = list(base)
            if self.wait_ms == 0:
                command += ["WAIT", 0]
            elif waits_until is not None:
                left = math.ceil((waits_until - time.monotonic()) * 1000)
                if left >= 1:
                    command += ["WAIT", left]
                # else: the budget is spent; a plain attempt learns whether an earlier
                # (unanswered) try was granted, since the same token gets its fence back.
            sent = time.monotonic()
            try:
                reply = self._client.execute_command(*command)
            except Exception as error:  # noqa: BLE001 - sorted by is_retriable
                if not is_retriable(error):
                    if maybe_granted:
                        # An earlier try whose reply was lost may have been granted: an answer
                        # that is not retried (-POLICY: the policy changed since; -READONLY,
                        # -MOVED: this retry reached another node; -NOREPLICAS: the token's
                        # grant stands, unconfirmed) says nothing about that try.
                        self._forget(token)
                        raise LockUnknown(
                            self.key,
                            f"a retry was answered ({error}) after a try whose reply was lost",
                        ) from error
                    refused = policy_error(self.key, error)
                    if refused is not None:
                        raise refused from error
                    raise
                if not_connected(error) and not maybe_granted:
                    raise LockConnectionError(
                        self.key, f"could not connect, nothing was sent ({error})"
                    ) from error
                maybe_granted = maybe_granted or reply_lost(error)
                retries += 1
                pause, give_up_at = self._next_pause(retries, give_up_at)
                if pause is None:
                    self._forget(token)
                    raise LockUnknown(
                        self.key, f"no answer after {retries} attempts ({error})"
                    ) from error
                time.sleep(pause)
                continue
            if reply is None:
                raise LockNotAcquired(self.key, "held by another token")
            self._token = token
            self._fence = int(reply)
            self._lease_end = sent + self._lease_s
            self._lost_reason = None
            self._loss_reported = False
            self._refused = None
            if (time.monotonic() - sent) * 1000 > self.ttl_ms / 10:
                # Granted at some moment of a long wait: only "after sent" is known, so the local
                # lease would be too short. A renewal now sets a lease whose start is known.
                try:
                    with self._mutex:
                        reason = self._renew_locked(token, anchored=False)
                except rx.ResponseError as error:
                    # Renewed but unconfirmed: the lease it can count on is the grant's, whose
                    # start is not known. Given back, as after any other failed renewal here.
                    self._token = None
                    self._forget(token)
                    raise LockUnknown(
                        self.key, f"granted, but the renewal that anchors the lease: {error}"
                    ) from error
                if reason is not None:
                    # Never handed out: not a loss to report.
                    self._token = None
                    self._lost_reason = None
                    refused, self._refused = self._refused, None
                    if reason == _NOT_HELD:
                        raise LockNotAcquired(self.key, f"granted, but {reason}")
                    # Refused or failed: the grant may stand until its lease ends. Give it
                    # back, so that a refusal leaves nothing changed, as its error says.
                    self._forget(token)
                    if refused is not None:
                        raise refused
                    raise LockUnknown(self.key, f"granted, but {reason}")
            if self.watchdog:
                self._start_watchdog(token)
            return self._fence

    def release(self) -> bool:
        """Stop the watchdog (no renewal is sent after this returns), then release with the
        token. True when the server released this grant; False when it was not held any more
        (expired, force-released: a loss, reported through ``on_lost`` if nothing reported it
        before) or was never acquired."""
        token = self._token
        if token is None:
            return False
        self._lapsed()
        try:
            self._stop_watchdog()
            self._token = None
            try:
                reply, retried = self._call("LOCK.RELEASE", self.key, token)
            finally:
                self._lease_end = 0.0
            # A 0 after a retry may be the answer to our own earlier, unanswered release.
            if reply != 1 and not retried:
                self._mark_lost("LOCK.RELEASE found the token no longer holding the lock")
            return reply == 1
        finally:
            self._report_loss()

    def renew(self) -> None:
        """Renew now (sets the lease to ttl_ms from now). Raises ``LockLost`` if the lock is no
        longer held (also when any reply, an unconfirmed one included, came after the local
        lease ran out), ``LockPolicyError`` when the server's policy refused the renewal (the
        lock then counts as lost, as the watchdog counts it), and redis-py's ``ResponseError``
        when the server renewed in time but could not confirm it (``NOREPLICAS the change was
        not acknowledged ...``, ``the change was not fsynced ...``): the lock is still held,
        and the local lease stays as it was. With a watchdog running there is no need to call
        this."""
        token = self._token
        if token is None:
            raise LockError(self.key, "not held: acquire it first")
        with self._mutex:
            reason = self._renew_locked(token)
            refused, self._refused = self._refused, None
        if reason is not None:
            self._report_loss()
            if refused is not None:
                raise refused
            raise LockLost(self.key, f"lost: {reason}")

    def relabel(self, label: str) -> None:
        """Give the current grant a new public label (``LABEL``), keeping its fence: the token
        asks for the lock again, which refreshes its lease (ttl_ms from now). Raises
        ``LockLost`` when the lock is no longer held by this token."""
        if not _valid_label(label):
            raise LockArgumentError(
                "label", "a label is 1 to 128 bytes of printable ASCII without spaces"
            )
        token = self._token
        if token is None:
            raise LockError(self.key, "not held: acquire it first")
        with self._mutex:
            if self._lost_reason is None and time.monotonic() >= self._lease_end:
                self._mark_lost("the lease ran out before the new label was sent")
            if self._lost_reason is None:
                sent = time.monotonic()
                try:
                    reply = self._client.execute_command(
                        "LOCK.ACQUIRE", self.key, token, self.ttl_ms, "LABEL", label,
                        *self._durability(),
                    )
                except rx.ResponseError as error:
                    refused = policy_error(self.key, error)
                    if refused is not None:
                        raise refused from error
                    raise
                if reply is None or int(reply) != self._fence:
                    self._mark_lost("the token no longer holds the lock (relabel)")
                else:
                    self._lease_end = sent + self._lease_s
                    self.label = label
        if self._lost_reason is not None:
            self._report_loss()
            raise LockLost(self.key, f"lost: {self._lost_reason}")

    def __enter__(self) -> "Lock":
        self.acquire()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            self.release()
        except LockError:
            if exc_type is None:
                raise
            log.warning("releasing %s failed while leaving on %s", _text(self.key), exc_type)

    # ---- fenced calls ----------------------------------------------------------------------

    def fenced(self, work: Callable[[int], T]) -> T:
        """Run ``work(fence)`` if the lock is still held (``LockLost`` otherwise). Pass the fence
        on to every write of the protected resource, which must refuse fences lower than one it
        has seen: the check here cannot stop a pause that happens after it."""
        return work(self.check())

    def guarded(self, *command: Any) -> Any:
        """Run one Redis command only while this grant's fence is current, checked and run in
        one step on the server (``LOCK.GUARD key fence command ...``). Returns the command's
        reply; raises ``LockLost`` when the fence is no longer current (the command did not
        run). Not retried: the command may not be idempotent. In a cluster its keys must share
        the lock's slot (hash tags)."""
        fence = self.check()
        try:
            return self._client.execute_command("LOCK.GUARD", self.key, fence, *command)
        except rx.ResponseError as error:
            if not str(error).startswith("FENCED"):
                raise
            reason = self._mark_lost("LOCK.GUARD says the fence is no longer current")
            self._report_loss()
            raise LockLost(self.key, f"lost: {reason}") from error

    def transaction(self, queue: Callable[[Any], None], *keys: Any, attempts: int = 32) -> list:
        """Write other Redis keys only while this grant is current, atomically: WATCH the lock
        key (and ``keys``), check the fence with LOCK.FENCE, then MULTI, ``queue(pipe)`` adds the
        writes, EXEC. EXEC fails when anything happened to the lock meanwhile (a renewal too), so
        it is retried up to ``attempts`` times. Returns EXEC's replies; ``LockLost`` when the
        fence is no longer current. Standalone servers, or keys of one slot with a client whose
        pipelines support WATCH."""
        for _ in range(attempts):
            fence = self.check()
            with self._client.pipeline(transaction=True) as pipe:
                try:
                    pipe.watch(self.key, *keys)
                    if pipe.execute_command("LOCK.FENCE", self.key, fence) != 1:
                        reason = self._mark_lost("LOCK.FENCE says the fence is no longer current")
                        self._report_loss()
                        raise LockLost(self.key, f"lost: {reason}")
                    pipe.multi()
                    queue(pipe)
                    return pipe.execute()
                except rx.WatchError:
                    continue
        raise LockError(self.key, f"the lock changed during each of {attempts} transactions")

    # ---- the watchdog ----------------------------------------------------------------------

    def _start_watchdog(self, token: bytes) -> None:
        self._stopping.clear()
        thread = threading.Thread(
            target=self._watch, args=(token,), name=f"lock-watchdog {_text(self.key)}", daemon=True
        )
        self._thread = thread
        thread.start()

    def _stop_watchdog(self) -> None:
        self._stopping.set()
        # Waits for a renewal in flight; any later one sees _stopping under the mutex.
        with self._mutex:
            pass
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def _watch(self, token: bytes) -> None:
        interval = self.ttl_ms / 3000
        pause = interval
        reason = None
        while not self._stopping.wait(pause):
            pause = interval
            self._watchdog_paused()
            with self._mutex:
                if self._stopping.is_set():
                    return
                try:
                    reason = self._renew_locked(token)
                except rx.ResponseError as error:
                    # Renewed, unconfirmed (NOREPLICAS, FSYNC): held on the old lease. Renew
                    # again within it (half of what is left, at most a third of the ttl), as
                    # the Rust helper does; past it the next round finds the lease over.
                    log.warning("lock %s renewed unconfirmed: %s", _text(self.key), error)
                    left = self._lease_end - time.monotonic()
                    pause = max(0.0, min(left / 2, interval))
                    continue
                finally:
                    # The refusal is the watchdog's to report (as a loss), not a later
                    # renew()'s to raise: that call sends nothing and answers LockLost.
                    self._refused = None
            if reason is not None:
                break
        if reason is not None:
            self._report_loss()

    def _renew_locked(self, token: bytes, anchored: bool = True) -> Optional[str]:
        """One renewal (with retries while the lease lasts), under ``_mutex``. Returns why the
        lock is lost, or None when renewed. Raises the server's error when the renewal was
        applied but not confirmed (``unconfirmed``) and answered before the local lease ran
        out: the lock is still held and the local lease is left as it was. Any reply after the
        local lease ran out, unconfirmed or not, is a loss. ``anchored=False``: the local lease end is not known
        yet (a grant at an unknown moment of a long wait); the server's 1 alone says the hold
        never lapsed, since RENEW finds nothing to renew once a lease has ended."""
        if self._lost_reason is not None:
            return self._lost_reason
        retries = 0
        while True:
            sent = time.monotonic()
            if anchored and sent >= self._lease_end:
                return self._mark_lost("the lease ran out before the renewal was sent")
            try:
                reply = self._client.execute_command(
                    "LOCK.RENEW", self.key, token, self.ttl_ms, *self._durability()
                )
            except Exception as error:  # noqa: BLE001 - sorted by is_retriable
                refused = policy_error(self.key, error)
                if refused is not None:
                    # The same renewal breaks the same rule every time: the lease cannot be
                    # kept as asked, so the lock counts as lost now, as after a 0.
                    refused.__cause__ = error
                    self._refused = refused
                    return self._mark_lost(f"renewal refused: {error}")
                if anchored and time.monotonic() >= self._lease_end:
                    # Too late, whatever it says: the lease may have ended in between.
                    return self._mark_lost("the renewal was answered after the lease ran out")
                if unconfirmed(error):
                    # Renewed on the primary, not confirmed: still held, on the old lease.
                    raise
                retries += 1
                if not is_retriable(error) or retries >= self.retry.attempts:
                    return self._mark_lost(f"renewal failed: {error}")
                time.sleep(self.retry.delay(retries))
                continue
            if anchored and time.monotonic() >= self._lease_end:
                return self._mark_lost("the renewal was answered after the lease ran out")
            if reply != 1:
                return self._mark_lost(_NOT_HELD)
            self._lease_end = sent + self._lease_s
            return None

    def _mark_lost(self, reason: str) -> str:
        """Records the loss (the first reason wins) and returns the reason recorded. Does not
        report it: the caller calls ``_report_loss()`` once it holds no lock of ours."""
        with self._loss_lock:
            if self._lost_reason is None:
                self._lost_reason = reason
            return self._lost_reason

    def _lapsed(self) -> None:
        """Marks the grant lost when its local lease has run out."""
        if self._lost_reason is None and self._token is not None:
            if time.monotonic() >= self._lease_end:
                self._mark_lost("the lease ran out")

    def _report_loss(self) -> None:
        """Reports a recorded loss once per grant: logs it and calls ``on_lost`` in this thread,
        unless another thread already did. Never called with ``_mutex`` held, so ``on_lost`` may
        call ``release()``."""
        with self._loss_lock:
            if self._lost_reason is None or self._loss_reported:
                return
            self._loss_reported = True
            reason = self._lost_reason
        log.warning("lock %s lost: %s", _text(self.key), reason)
        if self.on_lost is not None:
            try:
                self.on_lost(self)
            except Exception:  # noqa: BLE001 - a callback's bug must not kill the report
                log.exception("on_lost callback of lock %s failed", _text(self.key))

    # ---- plumbing --------------------------------------------------------------------------

    def _call(self, *command: Any) -> tuple[Any, bool]:
        """The reply, and whether the command had to be sent more than once. Retried as
        acquire is: ``LockConnectionError`` when nothing could be sent, ``LockUnknown`` when the
        retries ran out."""
        retries = 0
        maybe_sent = False
        give_up_at = None
        while True:
            try:
                return self._client.execute_command(*command), retries > 0
            except Exception as error:  # noqa: BLE001 - sorted by is_retriable
                if not is_retriable(error):
                    raise
                if not_connected(error) and not maybe_sent:
                    raise LockConnectionError(
                        self.key, f"could not connect, {command[0]} was not sent ({error})"
                    ) from error
                maybe_sent = maybe_sent or reply_lost(error)
                retries += 1
                pause, give_up_at = self._next_pause(retries, give_up_at)
                if pause is None:
                    raise LockUnknown(
                        self.key, f"no answer to {command[0]} after {retries} attempts ({error})"
                    ) from error
                time.sleep(pause)

    def _next_pause(
        self, retries: int, give_up_at: Optional[float]
    ) -> tuple[Optional[float], float]:
        """The pause before retry number ``retries``, or None when the attempts or the deadline
        (counted from the first failure) are used up; and the deadline."""
        now = time.monotonic()
        if give_up_at is None:
            give_up_at = now + self.retry.deadline
        pause = self.retry.delay(retries)
        if retries >= self.retry.attempts or now + pause >= give_up_at:
            return None, give_up_at
        return pause, give_up_at

    def _durability(self) -> list:
        """``SYNC numreplicas timeout-ms`` and ``FSYNC timeout-ms``, as asked."""
        words: list = []
        if self.sync is not None:
            words += ["SYNC", *self.sync]
        if self.fsync_ms is not None:
            words += ["FSYNC", self.fsync_ms]
        return words

    def _forget(self, token: bytes) -> None:
        """After an acquire without an answer: one try to release what may have been granted."""
        try:
            self._client.execute_command("LOCK.RELEASE", self.key, token)
        except Exception:  # noqa: BLE001 - best effort; the lease ends it otherwise
            pass


def _valid_label(label: Any) -> bool:
    """What the server's LABEL takes: 1 to 128 printable ASCII characters without spaces."""
    return (
        isinstance(label, str)
        and 1 <= len(label) <= MAX_LABEL_LEN
        and all("!" <= ch <= "~" for ch in label)
    )


def _text(key: Any) -> str:
    return key.decode("utf-8", "replace") if isinstance(key, bytes) else str(key)
