"""Review 9 of the -POLICY / SYNC / FSYNC change to the client helpers (written by a reviewer,
not the author). Each test shows one suspicion; a test that fails shows a defect.

The same suspicions are tested on the Rust (clients/rust/tests/review9.rs) and Node.js
(clients/node/test/review9.test.js) helpers.
"""

from __future__ import annotations

import threading
import time
import unittest
import uuid

from redis import exceptions as rx
from redis._parsers import BaseParser

from harness import Faults, Server, wait_for
from redis_lock_client import Lock, LockLost, LockUnknown, RetryPolicy

FAST_RETRY = RetryPolicy(attempts=4, base=0.001, cap=0.01)

NOREPLICAS_CHANGE = ("NOREPLICAS the change was not acknowledged by 1 replica(s) within 100 ms:"
                     " a failover may lose it")


def fresh_key() -> str:
    return f"lock:{uuid.uuid4().hex[:12]}"


class Delayed(Faults):
    """Faults, and on the nth LOCK.RENEW: wait ``seconds`` (the reply's own delay, as a SYNC
    renewal that waits for its replicas), then answer with ``error`` without running it."""

    def __init__(self, client, nth: int, seconds: float, error: str) -> None:
        super().__init__(client)
        self.nth, self.seconds, self.error = nth, seconds, error

    def execute_command(self, *args):
        name = str(args[0]).upper()
        if name == "LOCK.RENEW" and self.count("LOCK.RENEW") + 1 == self.nth:
            with self._mutex:
                self._counts[name] = self._counts.get(name, 0) + 1
                self.sent.append(args)
            time.sleep(self.seconds)  # the reply's own delay, not a synchronization
            raise BaseParser.parse_error(self.error)
        return super().execute_command(*args)


class Answered(Faults):
    """Faults that also records the name of every command once its call has returned."""

    def __init__(self, client, faults=()) -> None:
        super().__init__(client, faults)
        self.answered: list[str] = []

    def execute_command(self, *args):
        try:
            return super().execute_command(*args)
        finally:
            self.answered.append(str(args[0]).upper())


class Review9(unittest.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        cls.server = Server()
        cls.r = cls.server.client()

    @classmethod
    def tearDownClass(cls) -> None:
        cls.r.close()
        cls.server.stop()

    def test_a_retry_after_a_lost_reply_answered_otherwise_is_unknown_and_given_back(self) -> None:
        # The first LOCK.ACQUIRE ran (granted) and its reply was lost; the retry (same token) is
        # answered by an error the helper does not retry. As for -POLICY
        # (acquire-retried-after-a-lost-reply-answered-policy), that error says nothing about the
        # first try: the outcome is unknown, and the helper sends one LOCK.RELEASE. NOREPLICAS
        # "the change ..." even says the token's grant stands (a refresh by its own token).
        for error in ("READONLY You can't write against a read only replica.",
                      "MOVED 3999 127.0.0.1:6381",
                      NOREPLICAS_CHANGE):
            with self.subTest(error=error.split()[0]):
                key = fresh_key()
                client = Faults(self.r, [
                    {"at": "LOCK.ACQUIRE", "nth": 1, "fault": "drop-reply"},
                    {"at": "LOCK.ACQUIRE", "nth": 2, "fault": "reply-error", "error": error}])
                try:
                    Lock(client, key, 60000, retry=FAST_RETRY).acquire()
                    raised = None
                except Exception as exc:  # noqa: BLE001 - the type is the assertion
                    raised = exc
                state = self.server.state(key)
                self.assertIsInstance(raised, LockUnknown,
                                      f"raised {raised!r}; the server has the key {state}")
                self.assertEqual(client.count("LOCK.RELEASE"), 1, "one release, best effort")
                self.assertNotEqual(state, "held", "the maybe-grant was given back")

    def test_two_unconfirmed_renewals_do_not_lose_a_lease_that_still_lasts(self) -> None:
        # ttl 900: local lease 889 ms. The watchdog's renewals at 300 and 600 ms are answered
        # NOREPLICAS (renewed, unconfirmed: held on the old lease). The conformance README: "the
        # watchdog renews again later while that lease lasts". Python waits a whole ttl/3 after
        # each, so its third try comes at 900 ms, past the lease: the lock is lost although
        # 289 ms of lease were left. The Rust helper retries within what is left
        # (min(left/2, ttl/3)) and keeps the lock: the same input, different answers.
        key = fresh_key()
        lost = []
        client = Answered(self.r, [{"at": "LOCK.RENEW", "nth": [1, 2], "fault": "reply-error",
                                    "error": NOREPLICAS_CHANGE}])
        lock = Lock(client, key, 900, watchdog=True, on_lost=lost.append)
        lock.acquire()
        try:
            wait_for("a third renewal answered, or a loss",
                     lambda: True if client.answered.count("LOCK.RENEW") >= 3 or lost else None)
            self.assertEqual(lost, [], "the watchdog gave up while the old lease lasted")
            self.assertFalse(lock.lost)
        finally:
            released = lock.release()
        self.assertTrue(released)

    def test_an_unconfirmed_renewal_answered_after_the_lease_ran_out_is_a_loss(self) -> None:
        # renew() sent in time; its NOREPLICAS reply comes after the local lease has run out
        # (a SYNC renewal waits up to its timeout). A renewal answered 1 that late is a loss
        # ("the renewal was answered after the lease ran out"); answered "renewed, unconfirmed"
        # the helper still raises the server's error, which its README says means "the lock is
        # still held": a promise made without evidence. Expected: LockLost, on_lost once.
        key = fresh_key()
        lost = []
        client = Delayed(self.r, nth=1, seconds=0.25, error=NOREPLICAS_CHANGE)
        lock = Lock(client, key, 200, on_lost=lost.append)
        lock.acquire()
        try:
            lock.renew()
            raised = None
        except Exception as exc:  # noqa: BLE001 - the type is the assertion
            raised = exc
        finally:
            lock.release()
        self.assertIsInstance(raised, LockLost, f"renew() raised {raised!r}")
        self.assertEqual(lost, [lock])

    def test_the_watchdog_reports_a_loss_when_a_late_unconfirmed_reply_ends_the_lease(self) -> None:
        # ttl 900 (lease 889 ms), watchdog. Its first renewal (at 300 ms) is answered NOREPLICAS
        # only at about 950 ms, after the lease ran out. The loss is known then; the watchdog
        # reports it only at its next round, a whole ttl/3 later (~1250 ms). The Rust helper
        # reports it at once. Expected: on_lost within 150 ms of that reply.
        key = fresh_key()
        reported = []
        client = Delayed(self.r, nth=1, seconds=0.65, error=NOREPLICAS_CHANGE)
        answered = []
        original = client.execute_command

        def execute_command(*args):
            try:
                return original(*args)
            finally:
                if str(args[0]).upper() == "LOCK.RENEW":
                    answered.append(time.monotonic())

        client.execute_command = execute_command
        lock = Lock(client, key, 900, watchdog=True,
                    on_lost=lambda _: reported.append(time.monotonic()))
        lock.acquire()
        try:
            wait_for("the loss reported", lambda: reported or None)
            self.assertEqual(len(answered), 1)
            late = reported[0] - answered[0]
            self.assertLess(late, 0.15, f"on_lost came {late * 1000:.0f} ms after the reply that"
                                        " ended the lease")
        finally:
            lock.release()


if __name__ == "__main__":
    unittest.main()
