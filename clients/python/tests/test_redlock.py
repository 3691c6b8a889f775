"""Redlock over five local servers: a majority suffices, a minority does not, and the documented
unsafety: a holder paused past its validity while another takes the majority makes two holders.
The same pause against one fenced lock is refused (test_lock.LossReports' stalled worker, and
test_election's paused leader): that is the README's "Why not Redlock for money or inventory"."""

from __future__ import annotations

import time
import unittest
import uuid

import redis

from harness import Server
from redis_lock_client import LockError, LockNotAcquired, LockPolicyError, Redlock, RedlockNoFence


def fresh_key() -> str:
    return f"redlock:{uuid.uuid4().hex[:10]}"


class FiveServers(unittest.TestCase):
    def setUp(self) -> None:
        self.servers = [Server() for _ in range(5)]
        self.addCleanup(lambda: [s.stop() for s in self.servers])
        # No retries inside redis-py: a dead server fails fast, and the helper's per-server
        # timeout bounds the rest.
        self.clients = [
            redis.Redis(host="127.0.0.1", port=s.port, socket_timeout=1,
                        retry_on_error=[], retry=redis.retry.Retry(redis.backoff.NoBackoff(), 0))
            for s in self.servers
        ]
        self.addCleanup(lambda: [c.close() for c in self.clients])

    def redlock(self, key: str, ttl_ms: int = 2000) -> Redlock:
        lock = Redlock(self.clients, key, ttl_ms, server_timeout_ms=200, retries=1,
                       retry_delay_ms=20)
        self.addCleanup(lock.close)
        return lock

    def states(self, key: str) -> list:
        return [s.state(key) if s.process.poll() is None else "down" for s in self.servers]

    def test_a_majority_grants_and_a_second_client_is_refused(self) -> None:
        key = fresh_key()
        first = self.redlock(key)
        fences = first.acquire()
        self.assertEqual(sorted(fences), [0, 1, 2, 3, 4])
        self.assertTrue(first.held)
        self.assertGreater(first.validity_ms, 1500)
        with self.assertRaises(LockNotAcquired):
            self.redlock(key).acquire()
        self.assertTrue(first.renew())
        self.assertEqual(first.release(), 5)
        self.assertEqual(self.states(key), ["free"] * 5)
        # No global fence: refused, not pretended.
        with self.assertRaises(RedlockNoFence):
            first.fenced(lambda fence: fence)
        with self.assertRaises(RedlockNoFence):
            first.guarded("SET", "x", "1")

    def test_the_watchdog_keeps_a_majority_and_stops_before_release(self) -> None:
        key, ttl_ms = fresh_key(), 300
        lock = Redlock(self.clients, key, ttl_ms, server_timeout_ms=200, retries=1,
                       retry_delay_ms=20, watchdog=True)
        self.addCleanup(lock.close)
        lock.acquire()
        time.sleep(3 * ttl_ms / 1000)
        self.assertTrue(lock.held)
        self.assertEqual(self.states(key), ["held"] * 5)
        self.assertEqual(lock.release(), 5)
        renewals = sum(s.calls("lock.renew") for s in self.servers)
        time.sleep(2 * ttl_ms / 1000)
        self.assertEqual(sum(s.calls("lock.renew") for s in self.servers), renewals)
        self.assertGreaterEqual(renewals, 10)

    def test_two_servers_down_still_acquire_three_down_refuse(self) -> None:
        key = fresh_key()
        for server in self.servers[:2]:
            server.process.kill()
            server.process.wait(timeout=10)
        lock = self.redlock(key)
        self.assertEqual(sorted(lock.acquire()), [2, 3, 4])
        lock.release()
        self.servers[2].process.kill()
        self.servers[2].process.wait(timeout=10)
        with self.assertRaises(LockNotAcquired):
            self.redlock(key).acquire()
        # The minority's grants were given back.
        self.assertEqual(self.states(key)[3:], ["free", "free"])

    def test_a_policy_refusal_by_one_server_stops_and_gives_the_grants_back(self) -> None:
        """README: LockPolicyError at once when any server's lock namespaces refuse, after the
        round's grants are released; no more rounds, even with a majority granted."""
        key = fresh_key()
        self.clients[1].execute_command("CONFIG", "SET", "lock.namespaces",
                                        f"orders prefix={key} mode=enforce max-ttl=1000")
        lock = Redlock(self.clients, key, 2000, server_timeout_ms=500, retries=2,
                       retry_delay_ms=20)
        self.addCleanup(lock.close)
        with self.assertRaises(LockPolicyError) as refused:
            lock.acquire()
        self.assertEqual(refused.exception.namespace, "orders")
        self.assertEqual(refused.exception.detail, "ttl 2000 above the namespace's max-ttl 1000")
        self.assertEqual([s.calls("lock.acquire") for s in self.servers], [1] * 5)
        self.assertEqual(self.states(key), ["free", "none", "free", "free", "free"])
        self.assertFalse(lock.held)
        self.assertEqual(lock.fences, {})

    def test_no_majority_raises_lock_not_acquired_after_one_plus_retries_rounds(self) -> None:
        """README: 1 + retries rounds, a pause of 0 to retry_delay_ms between them, then
        LockNotAcquired "<key>: no majority (3 of 5) within the lease"."""
        key = fresh_key()
        holder = self.redlock(key)
        holder.acquire()
        before = [s.calls("lock.acquire") for s in self.servers]
        late = Redlock(self.clients, key, 2000, server_timeout_ms=200, retries=2,
                       retry_delay_ms=100)
        self.addCleanup(late.close)
        started = time.monotonic()
        with self.assertRaises(LockNotAcquired) as refused:
            late.acquire()
        elapsed = time.monotonic() - started
        self.assertEqual(str(refused.exception), f"{key}: no majority (3 of 5) within the lease")
        self.assertEqual(refused.exception.key, key)
        self.assertEqual([s.calls("lock.acquire") - b for s, b in zip(self.servers, before)],
                         [3] * 5)
        # Two pauses of at most 100 ms, and three rounds of at most 200 ms each.
        self.assertLess(elapsed, 2 * 0.1 + 3 * 0.2 + 0.5)
        self.assertFalse(late.held)
        self.assertEqual(late.validity_ms, 0.0)
        self.assertEqual(late.fences, {})
        with self.assertRaises(LockError):
            holder.acquire()  # already held by this Redlock
        holder.release()

    def test_fences_and_validity_ms_are_what_the_readme_says(self) -> None:
        key, ttl_ms = fresh_key(), 2000
        for server in self.servers[:2]:
            server.process.kill()
            server.process.wait(timeout=10)
        lock = self.redlock(key, ttl_ms)
        self.assertEqual(lock.fences, {})
        self.assertEqual(lock.validity_ms, 0.0)
        self.assertEqual(lock.release(), 0)
        fences = lock.acquire()
        self.assertEqual(lock.fences, fences)
        self.assertEqual(sorted(fences), [2, 3, 4])
        for index, fence in fences.items():
            self.assertIsInstance(fence, int)
            self.assertEqual(self.servers[index].lock_info(key)["fence"], fence)
        lock.fences.clear()  # a copy
        self.assertEqual(lock.fences, fences)
        validity = lock.validity_ms
        self.assertIsInstance(validity, float)
        self.assertLessEqual(validity, ttl_ms - (ttl_ms * 0.01 + 2))
        self.assertGreater(validity, 0)
        self.assertTrue(lock.held)
        self.assertEqual(lock.release(), 3)
        self.assertEqual(lock.fences, {})
        self.assertEqual(lock.validity_ms, 0.0)
        self.assertFalse(lock.held)
        self.assertEqual(lock.release(), 0)

    def test_a_paused_holder_and_a_new_one_both_hold_the_documented_unsafety(self) -> None:
        key, ttl_ms = fresh_key(), 400
        storage = self.clients[0]
        paused = self.redlock(key, ttl_ms)
        paused.acquire()
        self.assertTrue(paused.held)  # checked: it holds, and goes on to write...
        time.sleep(ttl_ms / 1000 + 0.1)  # ...but is paused (GC, SIGSTOP) past its validity
        other = self.redlock(key, ttl_ms)
        other.acquire()  # the majority is free again: a second holder
        storage.set(f"{key}:data", "written by the current holder")
        # Resumed, the first holder writes what it had checked for. Redlock has no fence a
        # storage could compare, so nothing refuses it: the stale write wins.
        storage.set(f"{key}:data", "written by the paused holder")
        self.assertEqual(storage.get(f"{key}:data"), b"written by the paused holder")
        other.release()

    def test_the_same_pause_against_one_fenced_lock_is_refused(self) -> None:
        from redis_lock_client import Lock, LockLost

        key, ttl_ms = fresh_key(), 400
        storage = self.clients[0]
        paused = Lock(storage, key, ttl_ms)
        paused.acquire()
        time.sleep(ttl_ms / 1000 + 0.1)
        current = Lock(storage, key, ttl_ms)
        current.acquire()
        current.guarded("SET", f"{key}:data", "written by the current holder")
        # The stale holder's write goes through LOCK.GUARD with its old fence: refused.
        with self.assertRaises(LockLost):
            paused.guarded("SET", f"{key}:data", "written by the paused holder")
        with self.assertRaises(redis.ResponseError) as refused:
            storage.execute_command(
                "LOCK.GUARD", key, paused.fence, "SET", f"{key}:data", "stale"
            )
        self.assertTrue(str(refused.exception).startswith("FENCED"), str(refused.exception))
        self.assertEqual(storage.get(f"{key}:data"), b"written by the current holder")
        current.release()

if __name__ == "__main__":
    unittest.main()
