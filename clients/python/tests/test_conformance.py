"""The shared table of cases (clients/conformance/cases.json) run on the Python helper.

Every helper in clients/ runs the same table; clients/conformance/README.md describes the
format. One server for all cases, a fresh key per case, one subTest per case.
"""

from __future__ import annotations

import json
import time
import unittest
import uuid
from pathlib import Path

import redis
from redis import exceptions as rx
from redis.backoff import NoBackoff
from redis.retry import Retry

from harness import Server, free_port, wait_for
from redis_lock_client import (Lock, LockArgumentError, LockConnectionError, LockNotAcquired,
                               LockUnknown, RetryPolicy)

CASES = Path(__file__).resolve().parents[2] / "conformance" / "cases.json"
HELPER = "python"
CASE_FIELDS = {"name", "lock", "server", "setup", "steps", "unrepresentable", "expect"}
LOCK_FIELDS = {"ttl_ms", "wait_ms", "shared", "limit", "watchdog", "retry_attempts"}
EXPECT_FIELDS = {"acquire", "reason", "message", "within_ms", "on_lost_calls"}


def load_cases() -> list:
    table = json.loads(CASES.read_text())
    if table.get("format") != 1:
        raise AssertionError(f"{CASES}: unknown format {table.get('format')}")
    return table["cases"]


class Conformance(unittest.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        cls.server = Server()
        cls.admin = cls.server.client()

    @classmethod
    def tearDownClass(cls) -> None:
        cls.admin.close()
        cls.server.stop()

    def test_the_table_is_well_formed(self) -> None:
        cases = load_cases()
        names = [case["name"] for case in cases]
        self.assertEqual(len(names), len(set(names)), "case names are unique")
        for case in cases:
            self.assertLessEqual(set(case), CASE_FIELDS, case["name"])
            self.assertLessEqual(set(case["lock"]), LOCK_FIELDS, case["name"])
            self.assertLessEqual(set(case["expect"]), EXPECT_FIELDS, case["name"])

    def test_every_case(self) -> None:
        cases = load_cases()
        self.assertGreater(len(cases), 0)
        for case in cases:
            with self.subTest(case=case["name"]):
                self.run_case(case)

    def run_case(self, case: dict) -> None:
        self.assertNotIn(HELPER, case.get("unrepresentable", []),
                         "Python takes any integer: every input is representable")
        key = f"conformance:{case['name']}:{uuid.uuid4().hex[:8]}"

        def with_key(words: list) -> list:
            return [key if word == "$KEY" else word for word in words]

        for command in case.get("setup", []):
            self.admin.execute_command(*with_key(command))
        server = case.get("server", "running")
        if server == "running":
            client = self.server.client()
        elif server == "closed-port":
            # redis-py's own retries off: within_ms measures the helper.
            client = redis.Redis(host="127.0.0.1", port=free_port(), retry=Retry(NoBackoff(), 0))
        else:
            raise AssertionError(f"unknown server {server!r}")
        expect = case["expect"]
        calls = []
        acquires_before = self.server.calls("lock.acquire")
        try:
            outcome, detail, lock = self.acquire(client, key, case["lock"], calls)
            self.assertEqual(outcome, expect["acquire"], detail)
            if outcome == "refused":
                self.assertEqual(detail, expect["reason"])
                self.assertEqual(self.server.calls("lock.acquire"), acquires_before,
                                 "refused before any command")
            if outcome == "server-error":
                self.assertIn(expect["message"], detail)
            if "within_ms" in expect:
                self.assertLess(self.elapsed_ms, expect["within_ms"])
            if lock is None:
                self.assertNotIn("steps", case, "steps need a grant")
                return
            for step in case.get("steps", []):
                self.run_step(step, lock, with_key)
            if lock.fence is not None and lock._token is not None:
                lock.release()
            self.assertEqual(len(calls), expect.get("on_lost_calls", 0), "on_lost calls")
        finally:
            client.close()

    def acquire(self, client, key: str, settings: dict, calls: list):
        """(outcome, detail, lock or None) in the table's words."""
        start = time.monotonic()
        lock = None
        try:
            kwargs = {}
            for name in ("wait_ms", "shared", "limit", "watchdog"):
                if name in settings:
                    kwargs[name] = settings[name]
            if "retry_attempts" in settings:
                kwargs["retry"] = RetryPolicy(attempts=settings["retry_attempts"])
            lock = Lock(client, key, settings["ttl_ms"], on_lost=calls.append, **kwargs)
            fence = lock.acquire()
            return "granted", fence, lock
        except LockArgumentError as error:
            return "refused", error.reason, None
        except LockNotAcquired as error:
            return "not-acquired", str(error), None
        except LockConnectionError as error:
            return "connection-error", str(error), None
        except LockUnknown as error:
            return "unknown", str(error), None
        except rx.ResponseError as error:
            return "server-error", str(error), None
        finally:
            self.elapsed_ms = (time.monotonic() - start) * 1000

    def run_step(self, step: dict, lock: Lock, with_key) -> None:
        action = step["do"]
        if action == "server":
            self.admin.execute_command(*with_key(step["command"]))
        elif action == "wait-server-expiry":
            wait_for("the lease to end on the server",
                     lambda: True if self.server.state(lock.key) != "held" else None)
        elif action == "check-lost":
            self.assertEqual(lock.lost, step["expect"], "lost")
        elif action == "release":
            self.assertEqual(lock.release(), step["expect"], "release")
        else:
            raise AssertionError(f"unknown step {action!r}")


if __name__ == "__main__":
    unittest.main()
