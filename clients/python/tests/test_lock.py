"""The helper against a real redis-server with the lock module.

FailureCases reproduces bugs reported against client-side locks; each case runs on the helper
(no problem allowed) and on tests/naive.py's NaiveLock (a problem must be found), so every case
is shown able to fail. The other classes cover the guard, fenced calls, retries and a cluster.
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
import unittest
import uuid
from pathlib import Path

import redis
from redis import exceptions as rx

from redis.backoff import NoBackoff
from redis.retry import Retry
from redis._parsers import BaseParser

from harness import Cluster, Faults, Pause, Server, free_port, wait_for
from naive import NaiveLock
from redis_lock_client import (Lock, LockArgumentError, LockConnectionError, LockError, LockLost,
                               LockNotAcquired, LockPolicyError, LockUnknown, RetryPolicy)
from redis_lock_client import Redlock
from redis_lock_client._lock import is_retriable

FAST_RETRY = RetryPolicy(attempts=4, base=0.001, cap=0.01)


def fresh_key() -> str:
    return f"lock:{uuid.uuid4().hex[:12]}"


# A failover or a cut connection after the first LOCK.ACQUIRE was sent: it runs on the server,
# its reply is lost.
LOSE_FIRST_ACQUIRE_REPLY = [{"at": "LOCK.ACQUIRE", "nth": 1, "fault": "drop-reply"}]


class OneServer(unittest.TestCase):
    """Tests sharing one server (each uses keys of its own)."""

    @classmethod
    def setUpClass(cls) -> None:
        cls.server = Server()
        cls.r = cls.server.client()

    @classmethod
    def tearDownClass(cls) -> None:
        cls.r.close()
        cls.server.stop()


class FailureCases(OneServer):

    def both(self, case) -> None:
        self.assertEqual(case(Lock), [], "the helper")
        self.assertNotEqual(case(NaiveLock), [], "NaiveLock passed too: the case cannot fail")

    def test_body_never_runs_without_the_lock(self) -> None:
        """redis-py #621: a context manager ran its body although acquire had failed."""

        def case(kind):
            key, ran = fresh_key(), []
            holder = Lock(self.r, key, 10000)
            holder.acquire()
            try:
                with kind(self.r, key, 10000):
                    ran.append("body")
            except LockNotAcquired:
                pass
            holder.release()
            return ["the body ran without the lock"] if ran else []

        self.both(case)

    def test_no_renewal_after_release(self) -> None:
        """Redisson #7272 / #1626: the watchdog outlived unlock() and renewed after it."""

        def case(kind):
            key = fresh_key()
            lock = kind(self.r, key, 300, watchdog=True)
            pause = Pause()
            lock._watchdog_paused = pause
            lock.acquire()
            # The timer fired and the watchdog is about to renew when release() is called.
            self.assertTrue(pause.reached.wait(10), "the watchdog never woke")
            done = threading.Event()
            renewals_at_return = []

            def release():
                lock.release()
                renewals_at_return.append(self.server.calls("lock.renew"))
                done.set()

            releaser = threading.Thread(target=release)
            releaser.start()
            # The helper's release waits for the paused watchdog; the naive one returns.
            releaser.join(0.5)
            pause.go()
            self.assertTrue(done.wait(10), "release() did not return")
            thread = lock._thread
            if thread is not None:
                thread.join(10)
            # The naive watchdog sends its renewal after release() returned.
            wait_for("the watchdog thread to end", lambda: True if not (
                thread and thread.is_alive()) else None)
            after = self.server.calls("lock.renew")
            problems = []
            if after != renewals_at_return[0]:
                problems.append(f"{after - renewals_at_return[0]} renewal(s) after release")
            if self.server.state(key) == "held":
                problems.append("the lock is held after release")
            return problems

        self.both(case)

    def test_stalled_watchdog_reports_the_loss_and_never_renews_late(self) -> None:
        """Redisson #5698: a renewal came too late, so two holders worked at once."""

        def case(kind):
            key = fresh_key()
            lost = threading.Event()
            lock = kind(self.r, key, 300, watchdog=True, on_lost=lambda _: lost.set())
            pause = Pause()
            lock._watchdog_paused = pause
            lock.acquire()
            self.assertTrue(pause.reached.wait(10), "the watchdog never woke")
            # The watchdog stalls (GC pause, starved thread) while the lease runs out and a
            # waiter takes the lock.
            other = Lock(self.r, key, 10000, wait_ms=5000)
            other_fence = other.acquire()
            renewals = self.server.calls("lock.renew")
            pause.go()
            if kind is Lock:
                self.assertTrue(lost.wait(10), "the loss was never reported")
            else:
                wait_for("the naive watchdog's late renewal",
                         lambda: True if self.server.calls("lock.renew") > renewals else None)
            problems = []
            if self.server.calls("lock.renew") != renewals:
                problems.append("a renewal was sent after the lease had ended")
            ran = []
            try:
                lock.fenced(ran.append)
            except LockLost:
                pass
            if ran:
                problems.append("fenced work ran while another client held the lock")
            if lock.held:
                problems.append("it still believes it holds the lock")
            if self.r.execute_command("LOCK.FENCE", key, other_fence) != 1:
                problems.append("the new holder lost the lock")
            lock.release()
            other.release()
            return problems

        self.both(case)

    def test_renewal_sets_the_lease(self) -> None:
        """redis-py #629: extend() added to what was left instead of setting the lease."""

        def case(kind):
            key = fresh_key()
            lock = kind(self.r, key, 3000)
            lock.acquire()
            if kind is Lock:
                lock.renew()
            else:
                lock.extend(3000)
            ttl = self.server.lock_info(key)["ttl"]
            lock.release()
            return [f"the lease is {ttl} ms after renewing to 3000 ms"] if ttl > 3000 else []

        self.both(case)

    def test_loss_is_signalled(self) -> None:
        """RedLock.net #92, Redisson PR #7254: no signal when a lock was lost."""

        def case(kind):
            key = fresh_key()
            lost = threading.Event()
            lock = kind(self.r, key, 300, watchdog=True, on_lost=lambda _: lost.set())
            lock.acquire()
            self.assertEqual(self.r.execute_command("LOCK.FORCERELEASE", key), 1)
            renewals = self.server.calls("lock.renew")
            # The next renewal learns it; the naive one ignores the 0.
            wait_for("the next renewal",
                     lambda: True if self.server.calls("lock.renew") > renewals else None)
            problems = []
            if not lost.wait(2):
                problems.append("on_lost was not called")
            if lock.held:
                problems.append("it still believes it holds the lock")
            lock.release()
            return problems

        self.both(case)

    def test_lost_reply_gets_the_same_grant_back(self) -> None:
        """A failover or a cut connection hides an ACQUIRE's reply: retried with a new token,
        the grant is orphaned and the lock stays busy for a whole lease."""

        def case(kind):
            key = fresh_key()
            lock = kind(Faults(self.r, LOSE_FIRST_ACQUIRE_REPLY), key, 10000)
            granted = lock.acquire()
            info = self.server.lock_info(key)
            problems = []
            if not granted:
                problems.append(f"reported not acquired while the lock is {info['state']!r}")
            elif info["holds"] != 1 or lock.fence != info["fence"]:
                problems.append(f"fence {lock.fence}, server {info}")
            if self.r.execute_command("LOCK.FORCERELEASE", key) != 1:
                problems.append("nothing held")
            return problems

        self.both(case)


class LossReports(OneServer):
    """A loss is reported through on_lost exactly once, by whichever thread sees it first."""

    def test_caller_noticing_first_reports_the_loss_once(self) -> None:
        # The watchdog is stalled past the lease; the caller's fenced() sees the loss first,
        # then release() stops the watchdog before it could renew or report.
        key = fresh_key()
        calls = []
        # The server is shared: other tests' renewals (a stalled worker's watchdog wakes and
        # renews once, in the test before this one) count too.
        renewals_before = self.server.calls("lock.renew")
        lock = Lock(self.r, key, 300, watchdog=True,
                    on_lost=lambda _: calls.append(threading.current_thread()))
        pause = Pause()
        lock._watchdog_paused = pause
        lock.acquire()
        self.assertTrue(pause.reached.wait(10), "the watchdog never woke")
        wait_for("the lease to end on the server",
                 lambda: True if self.server.state(key) != "held" else None)
        ran = []
        with self.assertRaises(LockLost):
            lock.fenced(ran.append)
        self.assertEqual(ran, [])
        self.assertEqual(calls, [threading.current_thread()], "on_lost from the caller's check")
        releaser = threading.Thread(target=lock.release)
        releaser.start()
        try:
            wait_for("release() to stop the watchdog",
                     lambda: True if lock._stopping.is_set() else None)
        finally:
            pause.go()
            releaser.join(10)
        self.assertFalse(releaser.is_alive(), "release() did not return")
        self.assertEqual(calls, [threading.current_thread()], "reported once")
        self.assertEqual(self.server.calls("lock.renew"), renewals_before)

    def test_every_path_reports_the_loss_once(self) -> None:
        def counting(**kw):
            key = fresh_key()
            calls = []
            lock = Lock(self.r, key, kw.pop("ttl_ms", 10000),
                        on_lost=lambda l: calls.append(l), **kw)
            lock.acquire()
            return key, lock, calls

        # The watchdog notices (a force-release); the caller's checks and release add nothing.
        key, lock, calls = counting(ttl_ms=300, watchdog=True)
        self.r.execute_command("LOCK.FORCERELEASE", key)
        wait_for("the watchdog's report", lambda: True if calls else None)
        with self.assertRaises(LockLost):
            lock.check()
        self.assertFalse(lock.release())
        self.assertEqual(calls, [lock], "watchdog first")

        # release() finds the token gone.
        key, lock, calls = counting()
        self.r.execute_command("LOCK.FORCERELEASE", key)
        self.assertFalse(lock.lost, "nothing can know it before a call")
        self.assertFalse(lock.release())
        self.assertTrue(lock.lost)
        self.assertEqual(calls, [lock], "release after the loss")

        # renew() is refused, then release.
        key, lock, calls = counting()
        self.r.execute_command("LOCK.FORCERELEASE", key)
        with self.assertRaises(LockLost):
            lock.renew()
        with self.assertRaises(LockLost):
            lock.fenced(lambda fence: fence)
        self.assertFalse(lock.release())
        self.assertEqual(calls, [lock], "renew")

        # guarded() is refused by the server's fence check.
        key, lock, calls = counting()
        self.r.execute_command("LOCK.FORCERELEASE", key)
        Lock(self.r, key, 10000).acquire()
        with self.assertRaises(LockLost):
            lock.guarded("SET", fresh_key(), "x")
        self.assertFalse(lock.release())
        self.assertEqual(calls, [lock], "guarded")

        # The local lease ran out: reading `lost` is enough.
        key, lock, calls = counting(ttl_ms=50)
        wait_for("the lease to end on the server",
                 lambda: True if self.server.state(key) != "held" else None)
        self.assertEqual(calls, [], "no call yet")
        self.assertTrue(lock.lost)
        self.assertFalse(lock.held)
        self.assertEqual(calls, [lock], "lost")
        self.assertFalse(lock.release())
        self.assertEqual(calls, [lock], "lost, then release")

        # A grant released while held is never reported.
        key, lock, calls = counting(ttl_ms=300, watchdog=True)
        self.assertTrue(lock.release())
        self.assertEqual(calls, [])

    def test_a_whole_process_stall_reports_the_loss_once(self) -> None:
        # A real worker process (tests/stalled_worker.py) with the watchdog on is stopped with
        # SIGSTOP until its lease has ended on the server and another client holds the lock,
        # then resumed: both of its threads wake at once, and exactly one reports.
        key = fresh_key()
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        worker = subprocess.Popen(
            [sys.executable, str(Path(__file__).with_name("stalled_worker.py")),
             str(self.server.port), key, "300"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
        lines: "queue.Queue[str]" = queue.Queue()
        reader = threading.Thread(target=lambda: [lines.put(line.rstrip("\n"))
                                                  for line in worker.stdout], daemon=True)
        reader.start()
        seen: list[str] = []

        def until(prefix: str) -> str:
            end = time.monotonic() + 10
            while True:
                try:
                    line = lines.get(timeout=max(0.0, end - time.monotonic()))
                except queue.Empty:
                    raise AssertionError(f"no {prefix!r} line from the worker; saw {seen}")
                seen.append(line)
                if line.startswith(prefix):
                    return line

        try:
            fence = int(until("acquired ").split()[1])
            worker.send_signal(signal.SIGSTOP)
            wait_for("the stopped worker's lease to end on the server",
                     lambda: True if self.server.state(key) != "held" else None)
            other = Lock(self.r, key, 10000)
            self.assertGreater(other.acquire(), fence)
            worker.send_signal(signal.SIGCONT)
            calls = int(until("on_lost calls ").split()[-1])
            self.assertEqual(worker.wait(10), 0, seen)
        finally:
            if worker.poll() is None:
                worker.kill()
                worker.wait(10)
            worker.stdout.close()
            errors = worker.stderr.read()
            worker.stderr.close()
            seen.append(f"stderr: {errors}")
        self.assertIn("lost-seen", seen)
        self.assertIn("released False", seen)
        self.assertEqual(len([line for line in seen if line.startswith("on_lost-called ")]), 1,
                         seen)
        self.assertEqual(calls, 1, seen)
        self.assertTrue(other.held)
        self.assertTrue(other.release())


class Guard(OneServer):
    def test_with_block_holds_the_lock_and_releases_it(self) -> None:
        key = fresh_key()
        with Lock(self.r, key, 10000) as lock:
            info = self.server.lock_info(key)
            self.assertEqual(info["state"], b"held")
            self.assertEqual(lock.fence, info["fence"])
            self.assertEqual(lock.check(), lock.fence)
            self.assertEqual(lock.fenced(lambda fence: fence * 2), 2 * lock.fence)
            self.assertNotIn(repr(lock._token), repr(lock))
        self.assertEqual(self.server.state(key), "free")
        self.assertFalse(lock.held)
        with self.assertRaises(Exception):
            lock.check()

    def test_a_label_shows_in_lock_who_and_a_bad_one_is_refused(self) -> None:
        key = fresh_key()
        with Lock(self.r, key, 10000, label="host-7:pid-42"):
            def as_map(reply):  # a map (RESP3) or a flat field/value list (RESP2)
                return reply if isinstance(reply, dict) else dict(zip(reply[::2], reply[1::2]))

            holder = as_map(as_map(self.r.execute_command("LOCK.WHO", key))[b"holders"][0])
            self.assertEqual(holder[b"label"], b"host-7:pid-42")
        for bad in ["", "two words", "x" * 129, "caf\u00e9", 7]:
            with self.assertRaises(LockArgumentError) as refused:
                Lock(self.r, key, 10000, label=bad)
            self.assertEqual(refused.exception.reason, "label")
        self.assertEqual(self.server.state(key), "free")

    def test_shared_holders_go_together_and_a_semaphore_counts_permits(self) -> None:
        key = fresh_key()
        readers = [Lock(self.r, key, 10000, shared=True) for _ in range(3)]
        fences = [reader.acquire() for reader in readers]
        self.assertEqual(sorted(fences), fences)
        self.assertEqual(self.server.lock_info(key)["holders"], 3)
        with self.assertRaises(LockNotAcquired):
            Lock(self.r, key, 10000).acquire()
        for reader in readers:
            self.assertTrue(reader.release())
        with Lock(self.r, key, 10000) as writer:
            self.assertGreater(writer.fence, fences[-1])
        pool = fresh_key()
        permits = [Lock(self.r, pool, 10000, limit=2) for _ in range(2)]
        for permit in permits:
            permit.acquire()
        with self.assertRaises(LockNotAcquired):
            Lock(self.r, pool, 10000, limit=2).acquire()
        with self.assertRaises(rx.ResponseError):
            Lock(self.r, pool, 10000, limit=3).acquire()
        for bad in ({"limit": 0}, {"limit": True}, {"shared": True, "limit": 2}):
            with self.assertRaises(LockArgumentError):
                Lock(self.r, pool, 10000, **bad)
        self.assertTrue(permits[0].release())
        Lock(self.r, pool, 10000, limit=2).acquire()

    def test_a_second_holder_is_refused_and_a_waiter_served(self) -> None:
        key = fresh_key()
        first = Lock(self.r, key, 10000)
        fence = first.acquire()
        with self.assertRaises(LockNotAcquired):
            Lock(self.r, key, 10000).acquire()
        with self.assertRaises(LockNotAcquired):
            Lock(self.r, key, 10000, wait_ms=50).acquire()
        got = []
        waiter = threading.Thread(
            target=lambda: got.append(Lock(self.server.client(), key, 10000, wait_ms=10000)
                                      .acquire()))
        waiter.start()
        wait_for("the waiter to queue",
                 lambda: True if self.server.lock_info(key)["waiters"] == 1 else None)
        self.assertTrue(first.release())
        waiter.join(10)
        self.assertEqual(len(got), 1)
        self.assertGreater(got[0], fence)
        self.assertEqual(self.server.lock_info(key)["fence"], got[0])
        self.r.execute_command("LOCK.FORCERELEASE", key)

    def test_a_grant_after_a_wait_longer_than_the_lease_is_held(self) -> None:
        # Granted at an unknown moment of a 0.5 s wait with a 300 ms lease: the helper renews
        # once to know when its lease ends, instead of calling the fresh grant lost.
        key = fresh_key()
        holder = Lock(self.r, key, 10000)
        holder.acquire()
        result = []
        lock = Lock(self.server.client(), key, 300, wait_ms=10000, watchdog=True)
        waiter = threading.Thread(target=lambda: result.append(lock.acquire()))
        waiter.start()
        wait_for("the waiter to queue",
                 lambda: True if self.server.lock_info(key)["waiters"] == 1 else None)
        time.sleep(0.5)  # the wait must outlast the lease length; nothing to poll for
        holder.release()
        waiter.join(10)
        self.assertEqual(len(result), 1)
        self.assertTrue(lock.held)
        self.assertEqual(lock.check(), result[0])
        self.assertTrue(lock.release())

    def test_release_after_expiry_reports_false(self) -> None:
        key = fresh_key()
        lock = Lock(self.r, key, 50)
        lock.acquire()
        wait_for("the lease to end", lambda: True if self.server.state(key) != "held" else None)
        self.assertTrue(lock.lost)
        with self.assertRaises(LockLost):
            lock.check()
        self.assertFalse(lock.release())

    def test_transaction_writes_only_while_the_fence_is_current(self) -> None:
        key, data = fresh_key(), fresh_key()
        lock = Lock(self.r, key, 10000, watchdog=True)
        lock.acquire()
        self.assertEqual(lock.transaction(lambda pipe: pipe.set(data, "first"), data), [True])
        self.assertEqual(self.r.get(data), b"first")
        self.r.execute_command("LOCK.FORCERELEASE", key)
        other = Lock(self.r, key, 10000)
        other.acquire()
        with self.assertRaises(LockLost):
            lock.transaction(lambda pipe: pipe.set(data, "stale"), data)
        self.assertEqual(self.r.get(data), b"first")
        self.assertFalse(lock.release())
        other.release()

    def test_guarded_runs_one_command_only_under_the_current_fence(self) -> None:
        key, data = fresh_key(), fresh_key()
        lock = Lock(self.r, key, 10000)
        lock.acquire()
        self.assertEqual(lock.guarded("HSET", data, "status", "shipped"), 1)
        self.assertEqual(lock.guarded("HGET", data, "status"), b"shipped")
        with self.assertRaises(rx.ResponseError):  # the command's own error comes through
            lock.guarded("LPUSH", data, "x")
        self.assertTrue(lock.held)
        self.r.execute_command("LOCK.FORCERELEASE", key)
        other = Lock(self.r, key, 10000)
        other.acquire()
        with self.assertRaises(LockLost):
            lock.guarded("HSET", data, "status", "stale")
        self.assertTrue(lock.lost)
        self.assertEqual(self.r.hget(data, "status"), b"shipped")
        other.release()

    def test_bad_arguments_are_refused_before_any_command(self) -> None:
        # The shared cases are in clients/conformance/cases.json; these are Python's own types.
        for kwargs, reason in (({"ttl_ms": 1.5}, "ttl"), ({"ttl_ms": True}, "ttl"),
                               ({"ttl_ms": 10**12}, "ttl"),
                               ({"ttl_ms": 100, "wait_ms": 0.5}, "wait"),
                               ({"ttl_ms": 100, "limit": True}, "limit"),
                               ({"ttl_ms": 100, "retry": 3}, "retry")):
            with self.assertRaises(LockArgumentError) as refused:
                Lock(self.r, "k", **kwargs)
            self.assertEqual(refused.exception.reason, reason, kwargs)
            self.assertIsInstance(refused.exception, ValueError)
        for kwargs in ({"base": -1}, {"cap": -1}, {"deadline": 0}, {"attempts": 1.5}):
            with self.assertRaises(LockArgumentError) as refused:
                RetryPolicy(**kwargs)
            self.assertEqual(refused.exception.reason, "retry", kwargs)
        # Within a year but above this server's lock.max-ttl: the server's own error.
        with self.assertRaises(rx.ResponseError) as refused:
            Lock(self.r, fresh_key(), 10**10).acquire()
        self.assertIn("invalid ttl-ms", str(refused.exception))


class Policies(OneServer):
    """A server's lock namespaces (``lock.namespaces``): a refusal is ``LockPolicyError``, on
    the first reply; SYNC and FSYNC reach the server."""

    def tearDown(self) -> None:
        self.r.execute_command("CONFIG", "SET", "lock.namespaces", "")

    def test_a_refusal_is_its_own_error_raised_at_once(self) -> None:
        key = fresh_key()
        self.r.execute_command("CONFIG", "SET", "lock.namespaces",
                               f"orders prefix={key} mode=enforce max-ttl=30000 label=required")
        client = Faults(self.r)
        with self.assertRaises(LockPolicyError) as refused:
            Lock(client, key, 600000, label="host-7").acquire()
        self.assertIsInstance(refused.exception, LockError)
        self.assertEqual(refused.exception.namespace, "orders")
        self.assertEqual(refused.exception.detail, "ttl 600000 above the namespace's max-ttl 30000")
        self.assertIsInstance(refused.exception.__cause__, rx.ResponseError)
        with self.assertRaises(LockPolicyError) as refused:
            Lock(client, key, 10000).acquire()
        self.assertEqual(refused.exception.detail, "a LABEL is required")
        self.assertEqual(client.count("LOCK.ACQUIRE"), 2, "one try each")
        self.assertEqual(self.server.state(key), "none", "nothing changed")

    def test_a_refused_renewal_counts_as_lost(self) -> None:
        key = fresh_key()
        lost = []
        lock = Lock(self.r, key, 10000, on_lost=lost.append)
        lock.acquire()
        self.r.execute_command("CONFIG", "SET", "lock.namespaces",
                               f"orders prefix={key} mode=enforce min-ttl=20000")
        with self.assertRaises(LockPolicyError) as refused:
            lock.renew()
        self.assertEqual(refused.exception.detail, "ttl 10000 below the namespace's min-ttl 20000")
        self.assertTrue(lock.lost)
        self.assertEqual(lost, [lock], "reported once")
        with self.assertRaises(LockLost):
            lock.check()
        self.assertTrue(lock.release(), "the grant was still there: released")

    def test_sync_and_fsync_reach_the_server(self) -> None:
        key = fresh_key()
        lock = Lock(self.r, key, 10000, sync=(0, 100))  # SYNC 0 answers at once
        lock.acquire()
        lock.renew()
        self.assertTrue(lock.release())
        # The test server runs without an AOF.
        with self.assertRaises(rx.ResponseError) as refused:
            Lock(self.r, key, 10000, fsync_ms=100).acquire()
        self.assertIn("FSYNC needs appendonly yes", str(refused.exception))
        client = Scripted(42, 1)
        lock = Lock(client, "k", 1000, sync=(1, 100), fsync_ms=50, label="x")
        lock.acquire()
        lock.renew()
        self.assertEqual(client.calls[0][3:], (1000, "LABEL", "x", "SYNC", 1, 100, "FSYNC", 50))
        self.assertEqual(client.calls[1][3:], (1000, "SYNC", 1, 100, "FSYNC", 50))

    def test_a_renewal_renewed_but_unconfirmed_keeps_the_lock_on_its_old_lease(self) -> None:
        # NOREPLICAS (SYNC) and the FSYNC change error on LOCK.RENEW: the server renewed the
        # lease and could not confirm it. renew() raises the server's error; the lock is not
        # lost, and the local lease is not extended.
        for text in ("NOREPLICAS the change was not acknowledged by 1 replica(s) within 100 ms:"
                     " a failover may lose it",
                     "ERR the change was not fsynced to the AOF within 100 ms: a crash of this"
                     " machine may lose it"):
            with self.subTest(text=text):
                lost = []
                client = Scripted(42, BaseParser.parse_error(text), 1)
                lock = Lock(client, "k", 10000, sync=(1, 100), on_lost=lost.append)
                lock.acquire()
                lease_end = lock._lease_end
                with self.assertRaises(rx.ResponseError) as raised:
                    lock.renew()
                self.assertNotIsInstance(raised.exception, LockError)
                self.assertIn("the change was not", str(raised.exception))
                self.assertFalse(lock.lost)
                self.assertEqual(lock._lease_end, lease_end, "the old lease only")
                self.assertEqual(lost, [])
                self.assertTrue(lock.release())

    def test_a_long_wait_grant_whose_anchoring_renewal_fails_is_given_back(self) -> None:
        # A grant that took longer than ttl/10 is anchored by a LOCK.RENEW. Refused by policy:
        # released, LockPolicyError. Renewed unconfirmed or failed otherwise: released,
        # LockUnknown. Answered 0: nothing to give back, LockNotAcquired. (As the Rust helper.)
        policy = BaseParser.parse_error("POLICY orders: ttl 100 below the namespace's min-ttl 500")
        unconfirmed = BaseParser.parse_error(
            "NOREPLICAS the change was not acknowledged by 1 replica(s) within 100 ms: a failover"
            " may lose it")
        wrongtype = BaseParser.parse_error("WRONGTYPE Operation against a key holding the wrong"
                                           " kind of value")
        for renewal, raised, released in ((policy, LockPolicyError, True),
                                          (unconfirmed, LockUnknown, True),
                                          (wrongtype, LockUnknown, True),
                                          (0, LockNotAcquired, False)):
            with self.subTest(renewal=renewal):
                client = Slow(0.03, 42, renewal, 1)
                with self.assertRaises(LockError) as error:
                    Lock(client, "k", 100, wait_ms=5000).acquire()
                self.assertIs(type(error.exception), raised)
                names = [call[0] for call in client.calls]
                expected = ["LOCK.ACQUIRE", "LOCK.RENEW"] + (["LOCK.RELEASE"] if released else [])
                self.assertEqual(names, expected)


class Scripted:
    """A fake client answering from a script: an exception to raise, or a reply."""

    def __init__(self, *script):
        self.script = list(script)
        self.calls = []

    def execute_command(self, *args):
        self.calls.append(args)
        step = self.script.pop(0)
        if isinstance(step, BaseException):
            raise step
        return step


class Retries(unittest.TestCase):
    def test_which_errors_are_retried(self) -> None:
        retried = [rx.ConnectionError("x"), rx.TimeoutError("x"), rx.TryAgainError("x"),
                   rx.ClusterDownError("x"), rx.MasterDownError("x"), rx.BusyLoadingError("x"),
                   rx.ResponseError("UNBLOCKED force unblock from blocking operation")]
        for error in retried:
            self.assertTrue(is_retriable(error), error)
        for error in (rx.ResponseError("ERR invalid ttl-ms: must be positive"),
                      rx.ResponseError("WRONGTYPE Operation against a key"),
                      rx.ResponseError("POLICY orders: a LABEL is required"),
                      rx.MovedError("3999 127.0.0.1:6381"), rx.ReadOnlyError("x"),
                      ValueError("x")):
            self.assertFalse(is_retriable(error), error)

    def test_acquire_retries_with_the_same_token(self) -> None:
        client = Scripted(rx.ResponseError("UNBLOCKED no longer a primary"),
                          rx.TryAgainError("key moved"), rx.ClusterDownError("failing over"), 42)
        lock = Lock(client, "k", 1000, wait_ms=0, retry=FAST_RETRY)
        self.assertEqual(lock.acquire(), 42)
        self.assertEqual(len(client.calls), 4)
        self.assertEqual(len({call[2] for call in client.calls}), 1, "one token for every try")
        self.assertTrue(all(call[-2:] == ("WAIT", 0) for call in client.calls))

    def test_a_spent_wait_budget_ends_with_a_plain_attempt(self) -> None:
        client = Scripted(rx.ConnectionError("cut"), None)
        lock = Lock(client, "k", 1000, wait_ms=1, retry=RetryPolicy(attempts=3, base=0.05,
                                                                    cap=0.05))
        with self.assertRaises(LockNotAcquired):
            lock.acquire()
        self.assertEqual(client.calls[0][-2:], ("WAIT", 1))
        self.assertEqual(len(client.calls[1]), 4, "no WAIT once the budget is spent")

    def test_retries_are_bounded_and_the_unknown_grant_released(self) -> None:
        client = Scripted(*[rx.ConnectionError("down")] * 4, rx.ConnectionError("down"))
        lock = Lock(client, "k", 1000, retry=FAST_RETRY)
        with self.assertRaises(LockUnknown):
            lock.acquire()
        self.assertEqual([call[0] for call in client.calls], ["LOCK.ACQUIRE"] * 4 + ["LOCK.RELEASE"])
        self.assertEqual(client.calls[-1][2], client.calls[0][2])

    def test_other_errors_are_not_retried(self) -> None:
        client = Scripted(rx.ResponseError("WRONGTYPE Operation against a key"))
        with self.assertRaises(rx.ResponseError):
            Lock(client, "k", 1000, retry=FAST_RETRY).acquire()
        self.assertEqual(len(client.calls), 1)


class Slow(Scripted):
    """A scripted client whose every call takes ``seconds`` before it answers."""

    def __init__(self, seconds: float, *script) -> None:
        super().__init__(*script)
        self.seconds = seconds

    def execute_command(self, *args):
        time.sleep(self.seconds)  # the call's own duration, not a synchronization
        return super().execute_command(*args)


REFUSED = "Error 111 connecting to 127.0.0.1:9. Connection refused."
READ_LOST = "Error while reading from 127.0.0.1:6379 : (104, 'Connection reset by peer')"


class Connections(unittest.TestCase):
    """A connection never made cannot have been granted: LockConnectionError, fast, one try.
    A request sent whose reply was lost stays unknown and is retried with the same token, for
    at most ``RetryPolicy.deadline`` whatever the client's own retries."""

    def test_a_refused_connection_fails_fast_with_a_connection_error(self) -> None:
        port = free_port()  # bound, then closed: nothing listens on it
        # redis-py's own retries off: the time is the helper's alone.
        plain = Faults(redis.Redis(host="127.0.0.1", port=port, retry=Retry(NoBackoff(), 0)))
        start = time.monotonic()
        with self.assertRaises(LockConnectionError) as refused:
            Lock(plain, "k", 10000, wait_ms=1000).acquire()
        self.assertLess(time.monotonic() - start, 3.0)
        self.assertEqual([c[0] for c in plain.sent], ["LOCK.ACQUIRE"],
                         "one try, no release of a non-grant")
        self.assertNotIsInstance(refused.exception, LockUnknown)
        self.assertIn("could not connect", str(refused.exception))
        self.assertIsInstance(refused.exception.__cause__, rx.ConnectionError)

    def test_a_refused_connection_with_redis_pys_own_retries_is_one_try(self) -> None:
        # The default client of redis-py >= 6 retries a refused connect itself (8.1: 10 times,
        # at most about 5.3 s of pauses in all): the helper adds no try of its own.
        port = free_port()
        client = Faults(redis.Redis(host="127.0.0.1", port=port))
        start = time.monotonic()
        with self.assertRaises(LockConnectionError):
            Lock(client, "k", 10000).acquire()
        self.assertLess(time.monotonic() - start, 8.0)
        self.assertEqual([c[0] for c in client.sent], ["LOCK.ACQUIRE"])

    def test_connect_failures_classified(self) -> None:
        client = Scripted(rx.ConnectionError(REFUSED))
        with self.assertRaises(LockConnectionError):
            Lock(client, "k", 1000, retry=FAST_RETRY).acquire()
        self.assertEqual(len(client.calls), 1)
        client = Scripted(rx.TimeoutError("Timeout connecting to server"))
        with self.assertRaises(LockConnectionError):
            Lock(client, "k", 1000, retry=FAST_RETRY).acquire()
        # The server answered "retry" first: still nothing granted, still a connection error.
        client = Scripted(rx.TryAgainError("key moved"), rx.ConnectionError(REFUSED))
        with self.assertRaises(LockConnectionError):
            Lock(client, "k", 1000, retry=FAST_RETRY).acquire()
        self.assertEqual(len(client.calls), 2)

    def test_a_lost_reply_then_refused_connections_is_unknown(self) -> None:
        # The first try was sent and its reply lost: it may have been granted, so the refused
        # reconnects that follow do not make it a connection error.
        client = Scripted(rx.ConnectionError(READ_LOST), *[rx.ConnectionError(REFUSED)] * 4)
        lock = Lock(client, "k", 1000, retry=FAST_RETRY)
        with self.assertRaises(LockUnknown):
            lock.acquire()
        self.assertEqual([c[0] for c in client.calls], ["LOCK.ACQUIRE"] * 4 + ["LOCK.RELEASE"])
        self.assertEqual(len({c[2] for c in client.calls}), 1, "one token throughout")
        # A lost reply, then a grant: the same token's fence.
        client = Scripted(rx.ConnectionError(READ_LOST), rx.TimeoutError("Timeout reading"), 7)
        self.assertEqual(Lock(client, "k", 1000, retry=FAST_RETRY).acquire(), 7)

    def test_the_retry_deadline_bounds_the_whole_acquire(self) -> None:
        # Each call takes 0.2 s (as a client retrying on its own does) and loses its reply: with
        # 1000 attempts allowed, the deadline still ends it.
        client = Slow(0.2, *[rx.ConnectionError(READ_LOST)] * 50)
        policy = RetryPolicy(attempts=1000, base=0.001, cap=0.001, deadline=0.5)
        start = time.monotonic()
        with self.assertRaises(LockUnknown):
            Lock(client, "k", 1000, retry=policy).acquire()
        elapsed = time.monotonic() - start
        self.assertLess(elapsed, 2.0)
        acquires = [c for c in client.calls if c[0] == "LOCK.ACQUIRE"]
        self.assertLessEqual(len(acquires), 5, elapsed)
        self.assertGreaterEqual(len(acquires), 2)
        with self.assertRaises(ValueError):
            RetryPolicy(deadline=0)


class InCluster(unittest.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        cls.cluster = Cluster(3)
        cls.rc = redis.cluster.RedisCluster(host="127.0.0.1", port=cls.cluster.nodes[0].port,
                                            socket_timeout=30)

    @classmethod
    def tearDownClass(cls) -> None:
        cls.rc.close()
        cls.cluster.stop()

    def test_the_watchdog_follows_the_lock_to_its_new_node(self) -> None:
        key = "{order:1}:lock"
        lost = threading.Event()
        lock = Lock(self.rc, key, 300, watchdog=True, on_lost=lambda _: lost.set())
        fence = lock.acquire()
        source = self.cluster.owner_of(key)
        target = (source + 1) % 3
        self.cluster.migrate_key_slot(key, source, target)
        new_owner = self.cluster.nodes[target]
        renewals = new_owner.calls("lock.renew")
        wait_for("two renewals on the new node",
                 lambda: True if new_owner.calls("lock.renew") >= renewals + 2 else None)
        self.assertFalse(lost.is_set())
        self.assertEqual(new_owner.admin.execute_command("LOCK.FENCE", key, fence), 1)
        self.assertTrue(lock.release())
        self.assertEqual(new_owner.state(key), "free")

    def test_guarded_writes_route_to_the_locks_slot(self) -> None:
        key, data = "{order:3}:lock", "{order:3}:data"
        with Lock(self.rc, key, 10000) as lock:
            self.assertEqual(lock.guarded("SET", data, "v"), b"OK")
            # Refused before anything runs (by redis-py from COMMAND GETKEYS, or the server).
            with self.assertRaises(Exception) as crossslot:
                lock.guarded("SET", "{order:4}:data", "v")
            self.assertIn("slot", str(crossslot.exception).lower())
        self.assertEqual(self.rc.get(data), b"v")

    def test_a_waiter_whose_key_moves_is_retried_and_served(self) -> None:
        key = "{order:2}:lock"
        holder = Lock(self.rc, key, 10000)
        holder.acquire()
        source = self.cluster.owner_of(key)
        target = (source + 1) % 3
        waiter_client = redis.cluster.RedisCluster(
            host="127.0.0.1", port=self.cluster.nodes[0].port, socket_timeout=30)
        result = []
        lock = Lock(waiter_client, key, 10000, wait_ms=20000)
        waiter = threading.Thread(target=lambda: result.append(lock.acquire()))
        waiter.start()
        try:
            src = self.cluster.nodes[source]
            wait_for("the waiter to queue",
                     lambda: True if src.lock_info(key)["waiters"] == 1 else None)
            # MIGRATE takes the key: the waiter gets -TRYAGAIN and is sent again, same token,
            # to the new node, where it queues until the holder lets go.
            self.cluster.migrate_key_slot(key, source, target)
            dst = self.cluster.nodes[target]
            wait_for("the waiter to queue on the new node",
                     lambda: True if (dst.lock_info(key) or {}).get("waiters") == 1 else None)
            self.assertTrue(holder.release())
            waiter.join(15)
            self.assertEqual(len(result), 1)
            self.assertEqual(dst.lock_info(key)["fence"], result[0])
            self.assertTrue(lock.release())
        finally:
            waiter.join(15)
            waiter_client.close()


class Review8Policy(OneServer):
    """Review of the -POLICY / SYNC / FSYNC change (branch review8)."""

    def tearDown(self) -> None:
        self.r.execute_command("CONFIG", "SET", "lock.namespaces", "")

    def test_long_wait_grant_refused_at_its_first_renewal_is_given_back(self) -> None:
        # FAILS: a grant that came after a long WAIT is anchored by a renewal; when a namespace
        # set during the wait (a queued request is served as admitted) refuses that renewal,
        # acquire() raises LockPolicyError ("nothing changed") and drops the token, but leaves
        # the grant held on the server until its lease ends (Rust's start_guard releases it).
        key = fresh_key()
        self.r.execute_command("LOCK.ACQUIRE", key, "someone-else", 600)
        policy = threading.Timer(0.2, lambda: self.r.execute_command(
            "CONFIG", "SET", "lock.namespaces", f"orders prefix={key} mode=enforce min-ttl=5000"))
        policy.start()
        try:
            with self.assertRaises(LockPolicyError) as refused:
                Lock(self.r, key, 2000, wait_ms=5000).acquire()
        finally:
            policy.join()
        self.assertIn("min-ttl 5000", refused.exception.detail)
        self.assertNotEqual(self.server.state(key), "held",
                            "the grant the helper dropped is still held on the server")

    def test_acquire_retried_after_a_lost_reply_then_refused_is_unknown(self) -> None:
        # FAILS: the first LOCK.ACQUIRE ran (granted) but its reply was lost; before the retry
        # (same token) the policy changed (or the retry reached a node with another policy), and
        # the retry is refused. acquire() raises LockPolicyError, whose contract is "nothing
        # changed", without the one LOCK.RELEASE it sends after any other unanswered try: the
        # grant stays held. The outcome is unknown (LockUnknown), not "not granted".
        key = fresh_key()
        admin = self.r

        class LostThenPolicy:
            def __init__(self) -> None:
                self.calls = []

            def execute_command(self, *args):
                self.calls.append(args)
                if args[0] == "LOCK.ACQUIRE" and len(self.calls) == 1:
                    admin.execute_command(*args)  # runs: granted
                    admin.execute_command("CONFIG", "SET", "lock.namespaces",
                                          f"orders prefix={key} mode=enforce max-ttl=5000")
                    raise rx.ConnectionError("Connection reset by peer (dropped by the test)")
                return admin.execute_command(*args)

        client = LostThenPolicy()
        try:
            Lock(client, key, 10000, retry=FAST_RETRY).acquire()
            raised = None
        except LockError as error:
            raised = error
        state = self.server.state(key)
        self.assertIsInstance(raised, LockUnknown, f"raised {raised!r}, server state {state}")
        self.assertNotEqual(state, "held", "the maybe-grant was given back")

    def test_redlock_does_not_retry_a_policy_refusal(self) -> None:
        # FAILS: Redlock counts a -POLICY reply as "not granting" and retries the whole round
        # `retries` times (with its delay), then raises LockNotAcquired ("held by another
        # token"): the refusal is retried and reported as the wrong error; Lock raises
        # LockPolicyError after one try.
        key = fresh_key()
        self.r.execute_command("CONFIG", "SET", "lock.namespaces",
                               f"orders prefix={key} mode=enforce max-ttl=5000")
        client = Faults(self.r)
        redlock = Redlock([client], key, 10000, server_timeout_ms=500, retries=2,
                          retry_delay_ms=10)
        try:
            redlock.acquire()
            raised = None
        except LockError as error:
            raised = error
        rounds = client.count("LOCK.ACQUIRE")
        self.assertIsInstance(raised, LockPolicyError, f"raised {raised!r} after {rounds} rounds")
        self.assertEqual(rounds, 1, "one round")

    def test_nonsense_sync_and_fsync_settings_are_refused_before_sending(self) -> None:
        # FAILS: the Lock(...) row of the README says settings that make no sense raise
        # LockArgumentError there, before any command; sync/fsync_ms are not checked at all, so
        # sync=(1,) goes out as a malformed "SYNC 1" and fsync_ms=0 as "FSYNC 0" (refused by the
        # server as a ResponseError only when acquire() runs).
        for settings in ({"sync": (1,)}, {"sync": (1, 0)}, {"sync": (-1, 100)},
                         {"fsync_ms": 0}, {"fsync_ms": -5}, {"fsync_ms": "100"}):
            with self.subTest(settings=settings):
                client = Scripted(1)
                with self.assertRaises(LockArgumentError):
                    Lock(client, "k", 1000, **settings).acquire()
                self.assertEqual(client.calls, [])

    def test_renew_after_the_watchdogs_refusal_is_lock_lost(self) -> None:
        # FAILS: the watchdog's refused renewal leaves its LockPolicyError in _refused, and the
        # next renew() raises it although that call sent nothing (the lock was already lost) and
        # nothing refused it; only the call after that raises LockLost. Rust's renew() answers
        # Error::Lost here; Node.js throws the stale LockPolicyError on every later call. The
        # same sequence gets three different answers.
        key = fresh_key()
        lost = []
        client = Faults(self.r)
        lock = Lock(client, key, 1500, watchdog=True, on_lost=lost.append)
        lock.acquire()
        self.r.execute_command("CONFIG", "SET", "lock.namespaces",
                               f"orders prefix={key} mode=enforce min-ttl=5000")
        wait_for("the loss reported", lambda: lost or None)
        renewals = client.count("LOCK.RENEW")
        with self.assertRaises(LockError) as raised:
            lock.renew()
        self.assertEqual(client.count("LOCK.RENEW"), renewals, "renew() sent nothing")
        self.assertIsInstance(raised.exception, LockLost, repr(raised.exception))
        self.assertTrue(lock.release())

    def test_watchdog_and_renew_refused_together_report_the_loss_once(self) -> None:
        # PASSES (pins: on_lost exactly once when an explicit renew() and the watchdog are both
        # refused by -POLICY, in either order). The renew_first=False order asserts only the
        # count: what that renew() raises is test_renew_after_the_watchdogs_refusal_is_lock_lost.
        for renew_first in (True, False):
            with self.subTest(renew_first=renew_first):
                key = fresh_key()
                lost = []
                lock = Lock(self.r, key, 1500, watchdog=True, on_lost=lost.append)
                pause = Pause()
                lock._watchdog_paused = pause
                lock.acquire()
                self.assertTrue(pause.reached.wait(5))
                self.r.execute_command("CONFIG", "SET", "lock.namespaces",
                                       f"orders prefix={key} mode=enforce min-ttl=5000")
                if renew_first:
                    with self.assertRaises(LockPolicyError):
                        lock.renew()
                    pause.go()
                else:
                    pause.go()
                    wait_for("the loss reported", lambda: lost or None)
                    with self.assertRaises(LockError):
                        lock.renew()
                thread = lock._thread
                if thread is not None:
                    thread.join(5)
                self.assertEqual(lost, [lock])
                self.assertTrue(lock.release())
                self.r.execute_command("CONFIG", "SET", "lock.namespaces", "")


if __name__ == "__main__":
    unittest.main()
