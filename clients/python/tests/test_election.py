"""Leader election against a real server: terms, proclaim, observers that see each change once
and in order, a leader killed (SIGKILL) and a leader paused (SIGSTOP) past its lease."""

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

from harness import Server, wait_for
from redis_lock_client import Election, Leader, LockLost

HERE = Path(__file__).resolve().parent


def fresh_name() -> str:
    return f"leader:{uuid.uuid4().hex[:10]}"


class Observer:
    """Collects what ``Election.observe`` yields, in a thread of its own."""

    def __init__(self, election: Election):
        self.stop = threading.Event()
        self.seen: "queue.Queue[object]" = queue.Queue()
        self.thread = threading.Thread(target=self._run, args=(election,), daemon=True)
        self.thread.start()

    def _run(self, election: Election) -> None:
        for leader in election.observe(self.stop, idle_s=0.05):
            self.seen.put(leader)

    def next(self, timeout: float = 10.0) -> object:
        return self.seen.get(timeout=timeout)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=10)
        assert not self.thread.is_alive(), "the observer did not stop"


class Candidate:
    """tests/election_candidate.py in its own process; stopped by the test."""

    def __init__(self, port: int, name: str, ttl_ms: int, value: str):
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in [str(HERE.parent), env.get("PYTHONPATH", "")] if p
        )
        self.process = subprocess.Popen(
            [sys.executable, str(HERE / "election_candidate.py"), str(port), name,
             str(ttl_ms), value],
            stdout=subprocess.PIPE, text=True, env=env,
        )
        self.lines: "queue.Queue[str]" = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.process.stdout:  # type: ignore[union-attr]
            self.lines.put(line.strip())

    def line(self, timeout: float = 10.0) -> str:
        return self.lines.get(timeout=timeout)

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)
            self.process.kill()
        self.process.wait(timeout=10)
        self.process.stdout.close()  # type: ignore[union-attr]


class Elections(unittest.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        cls.server = Server("--notify-keyspace-events", "KA")

    @classmethod
    def tearDownClass(cls) -> None:
        cls.server.stop()

    def blocked(self) -> int:
        return int(self.server.admin.info("clients")["blocked_clients"])

    def election(self, name: str, ttl_ms: int = 2000) -> Election:
        client = self.server.client()
        self.addCleanup(client.close)
        return Election(client, name, ttl_ms)

    def test_three_candidates_take_turns_and_observers_see_each_change_once_in_order(self):
        name = fresh_name()
        watcher = Observer(self.election(name))
        self.addCleanup(watcher.close)
        self.assertIsNone(watcher.next())
        a, b, c = (self.election(name) for _ in range(3))
        term_a = a.campaign("node-a")
        a_id = a.leader().client_id
        self.assertEqual(watcher.next(), Leader("node-a", term_a, a_id))
        # B and C queue behind A, on the server, in that order.
        terms: "queue.Queue[int]" = queue.Queue()
        for queued, (candidate, value) in enumerate(((b, "node-b"), (c, "node-c")), start=1):
            threading.Thread(
                target=lambda e=candidate, v=value: terms.put(e.campaign(v)), daemon=True
            ).start()
            wait_for("the candidate to queue", lambda n=queued: self.blocked() >= n or None)
        # Proclaim: a new value, the same term.
        a.proclaim("node-a-v2")
        self.assertEqual(watcher.next(), Leader("node-a-v2", term_a, a_id))
        self.assertEqual(a.leader(), Leader("node-a-v2", term_a, a_id))
        self.assertTrue(a.resign())
        term_b = terms.get(timeout=10)
        seen_b = watcher.next()
        self.assertEqual((seen_b.value, seen_b.term), ("node-b", term_b))
        self.assertGreater(term_b, term_a)
        self.assertTrue(b.resign())
        term_c = terms.get(timeout=10)
        seen_c = watcher.next()
        self.assertEqual((seen_c.value, seen_c.term), ("node-c", term_c))
        self.assertGreater(term_c, term_b)
        self.assertTrue(c.resign())
        self.assertIsNone(watcher.next())
        # Nothing else was reported: each change once.
        time.sleep(0.3)
        self.assertTrue(watcher.seen.empty(), list(watcher.seen.queue))
        # A resigned leader's guarded writes do not run.
        with self.assertRaises(LockLost):
            a.guarded("SET", f"{name}:x", "1")

    def test_a_killed_leader_is_replaced_within_its_lease(self):
        name, ttl_ms = fresh_name(), 1000
        watcher = Observer(self.election(name, ttl_ms))
        self.addCleanup(watcher.close)
        self.assertIsNone(watcher.next())
        first = Candidate(self.server.port, name, ttl_ms, "doomed")
        self.addCleanup(first.close)
        term_1 = int(first.line().split()[1])
        self.assertEqual(watcher.next().term, term_1)
        successor = self.election(name, ttl_ms)
        got: "queue.Queue[int]" = queue.Queue()
        threading.Thread(target=lambda: got.put(successor.campaign("heir")), daemon=True).start()
        wait_for("the successor to queue", lambda: self.blocked() >= 1 or None)
        first.process.kill()
        killed_at = time.monotonic()
        term_2 = got.get(timeout=10)
        took = time.monotonic() - killed_at
        self.assertGreater(term_2, term_1)
        self.assertLess(took, ttl_ms / 1000 + 0.5, f"{took:.2f}s")
        self.assertEqual(watcher.next(), Leader("heir", term_2, successor.leader().client_id))
        successor.resign()

    def test_the_lock_key_is_the_name_and_a_refused_guarded_raises_lock_lost(self):
        """README: the lock key is the election's name; guarded() raises LockLost, and the
        command does not run, when not leading and when a newer term exists."""
        name = fresh_name()
        election = self.election(name)
        written = f"{name}:written"
        with self.assertRaises(LockLost):
            election.guarded("SET", written, "before campaigning")
        term = election.campaign("host-a")
        def as_map(reply):
            return reply if isinstance(reply, dict) else dict(zip(reply[::2], reply[1::2]))

        holder = as_map(as_map(self.server.admin.execute_command("LOCK.WHO", name))[b"holders"][0])
        self.assertEqual(holder[b"label"], b"host-a")
        self.assertEqual(holder[b"fence"], term)
        self.assertEqual(self.server.state(name), "held")
        self.assertEqual(election.guarded("SET", written, "term-1"), b"OK")
        # An operator ends the term and another candidate leads: the old leader is refused.
        self.assertEqual(self.server.admin.execute_command("LOCK.FORCERELEASE", name), 1)
        successor = self.election(name)
        self.assertGreater(successor.campaign("host-b"), term)
        with self.assertRaises(LockLost):
            election.guarded("SET", written, "stale")
        self.assertEqual(self.server.admin.get(written), b"term-1")
        self.assertTrue(successor.resign())
        with self.assertRaises(LockLost):
            successor.guarded("SET", written, "after resigning")
        self.assertEqual(self.server.admin.get(written), b"term-1")

    def test_a_paused_leader_is_deposed_and_its_writes_are_refused(self):
        name, ttl_ms = fresh_name(), 500
        first = Candidate(self.server.port, name, ttl_ms, "sleepy")
        self.addCleanup(first.close)
        term_1 = int(first.line().split()[1])
        wait_for("a first write", lambda: self.server.admin.get(f"{name}:written"))
        first.process.send_signal(signal.SIGSTOP)
        successor = self.election(name, ttl_ms)
        term_2 = successor.campaign("awake", wait_ms=5000)
        self.assertGreater(term_2, term_1)
        successor.guarded("SET", f"{name}:written", term_2)
        first.process.send_signal(signal.SIGCONT)
        refused = first.line()
        self.assertIn(refused, ("refused-locally", "refused-by-server"))
        self.assertTrue(first.line().startswith("server-says FENCED"))
        self.assertEqual(int(self.server.admin.get(f"{name}:written")), term_2)
        successor.resign()


if __name__ == "__main__":
    unittest.main()
