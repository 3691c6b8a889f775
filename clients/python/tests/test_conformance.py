"""The shared table of cases (clients/conformance/cases.json) run on the Python helper.

Every helper in clients/ runs the same table; clients/conformance/README.md describes the
format. One server for all cases, a fresh key per case, one subTest per case. Faults are
injected by harness.Faults (a proxy for the client) and harness.Pause (the watchdog's pause
hook). With CONFORMANCE_RESULTS set, each case's result is appended to that file.
"""

from __future__ import annotations

import json
import os
import time
import unittest
import uuid
from pathlib import Path

import redis
from redis import exceptions as rx
from redis.backoff import NoBackoff
from redis.retry import Retry

from harness import Faults, Pause, Server, free_port, wait_for
from redis_lock_client import (Lock, LockArgumentError, LockConnectionError, LockNotAcquired,
                               LockPolicyError, LockUnknown, RetryPolicy)

CASES = Path(__file__).resolve().parents[2] / "conformance" / "cases.json"
HELPER = "python"
CASE_FIELDS = {"name", "lock", "server", "namespaces", "setup", "faults", "steps",
               "unrepresentable", "expect"}
LOCK_FIELDS = {"ttl_ms", "wait_ms", "shared", "limit", "watchdog", "retry_attempts", "sync",
               "fsync_ms"}
EXPECT_FIELDS = {"acquire", "reason", "message", "namespace", "detail", "within_ms",
                 "on_lost_calls", "sent", "one_token"}
FAULT_FIELDS = {"at", "nth", "fault", "error"}
STEP_FIELDS = {"server": {"command"}, "wait-server-expiry": set(), "check-lost": {"expect"},
               "release": {"expect"}, "check-server": {"expect"}, "wait-sent": {"command", "count"},
               "wait-paused": set(), "resume": set(), "wait-lost-reported": set()}
# Steps that use the helper's grant; the others may follow an acquire that granted nothing.
GRANT_STEPS = {"check-lost", "release", "wait-sent", "wait-paused", "resume",
               "wait-lost-reported"}
# The commands whose third word is the helper's token.
TOKEN_COMMANDS = {"LOCK.ACQUIRE", "LOCK.RENEW", "LOCK.RELEASE"}


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
            for fault in case.get("faults", []):
                self.assertLessEqual(set(fault), FAULT_FIELDS, case["name"])
                self.assertIn(fault["fault"], ("drop-reply", "reply-error", "pause"), case["name"])
                self.assertEqual(fault["fault"] == "pause", fault["at"] == "watchdog", case["name"])
                self.assertEqual("error" in fault, fault["fault"] == "reply-error", case["name"])
            for step in case.get("steps", []):
                self.assertIn(step["do"], STEP_FIELDS, case["name"])
                self.assertEqual(set(step) - {"do"}, STEP_FIELDS[step["do"]], case["name"])

    def test_every_case(self) -> None:
        cases = load_cases()
        self.assertGreater(len(cases), 0)
        results = os.environ.get("CONFORMANCE_RESULTS")
        for case in cases:
            with self.subTest(case=case["name"]):
                outcome = "fail"
                try:
                    self.run_case(case)
                    outcome = "pass"
                finally:
                    if results:
                        with open(results, "a") as out:
                            out.write(f"{HELPER}\t{case['name']}\t{outcome}\n")

    def run_case(self, case: dict) -> None:
        self.assertNotIn(HELPER, case.get("unrepresentable", []),
                         "Python takes any integer: every input is representable")
        key = f"conformance:{case['name']}:{uuid.uuid4().hex[:8]}"

        def with_key(words: list) -> list:
            return [word.replace("$KEY", key) for word in words]

        if "namespaces" not in case:
            self.run_case_with_key(case, key, with_key)
            return
        # The server is shared by every case: its policy is cleared whatever the case did.
        try:
            self.admin.execute_command(*with_key(["CONFIG", "SET", "lock.namespaces",
                                                  case["namespaces"]]))
            self.run_case_with_key(case, key, with_key)
        finally:
            self.admin.execute_command("CONFIG", "SET", "lock.namespaces", "")

    def run_case_with_key(self, case: dict, key: str, with_key) -> None:
        for command in case.get("setup", []):
            self.admin.execute_command(*with_key(command))
        server = case.get("server", "running")
        if server == "running":
            real = self.server.client()
        elif server == "closed-port":
            # redis-py's own retries off: within_ms measures the helper.
            real = redis.Redis(host="127.0.0.1", port=free_port(), retry=Retry(NoBackoff(), 0))
        else:
            raise AssertionError(f"unknown server {server!r}")
        faults = case.get("faults", [])
        client = Faults(real, faults)
        pauses = [Pause(f["nth"]) for f in faults if f["at"] == "watchdog"]
        expect = case["expect"]
        calls = []
        acquires_before = self.server.calls("lock.acquire")
        lock = None
        try:
            outcome, detail, lock = self.acquire(client, key, case["lock"], calls, pauses)
            self.assertEqual(outcome, expect["acquire"], detail)
            if outcome == "refused":
                self.assertEqual(detail, expect["reason"])
                self.assertEqual(self.server.calls("lock.acquire"), acquires_before,
                                 "refused before any command")
            if outcome == "server-error":
                self.assertIn(expect["message"], detail)
            if outcome == "policy":
                namespace, rule = detail
                self.assertEqual(namespace, expect["namespace"], "the namespace")
                self.assertIn(expect.get("detail", ""), rule, "the rule")
            if "within_ms" in expect:
                self.assertLess(self.elapsed_ms, expect["within_ms"])
            for step in case.get("steps", []):
                if lock is None:
                    self.assertNotIn(step["do"], GRANT_STEPS, "this step needs a grant")
                self.run_step(step, lock, with_key, client, pauses, calls)
            if lock is not None and lock._token is not None:
                lock.release()
            self.assertEqual(len(calls), expect.get("on_lost_calls", 0), "on_lost calls")
            for name, count in expect.get("sent", {}).items():
                self.assertEqual(client.count(name), count, f"{name} sent")
            if expect.get("one_token"):
                tokens = {args[2] for args in client.sent if str(args[0]).upper() in TOKEN_COMMANDS}
                self.assertEqual(len(tokens), 1, "one token throughout")
        finally:
            for pause in pauses:
                pause.go()  # never leave a watchdog hanging on a failed case
            if lock is not None and lock._token is not None:
                try:
                    lock.release()  # a failed case's lock; this also stops its watchdog
                except Exception:  # noqa: BLE001 - the case's own failure is the news
                    pass
            real.close()

    def acquire(self, client, key: str, settings: dict, calls: list, pauses: list):
        """(outcome, detail, lock or None) in the table's words."""
        start = time.monotonic()
        lock = None
        try:
            kwargs = {}
            for name in ("wait_ms", "shared", "limit", "watchdog"):
                if name in settings:
                    kwargs[name] = settings[name]
            if "sync" in settings:
                kwargs["sync"] = tuple(settings["sync"])
            if "fsync_ms" in settings:
                kwargs["fsync_ms"] = settings["fsync_ms"]
            if "retry_attempts" in settings:
                kwargs["retry"] = RetryPolicy(attempts=settings["retry_attempts"])
            lock = Lock(client, key, settings["ttl_ms"], on_lost=calls.append, **kwargs)
            if pauses:
                lock._watchdog_paused = lambda: [pause() for pause in pauses]
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
        except LockPolicyError as error:
            return "policy", (error.namespace, error.detail), None
        except rx.ResponseError as error:
            # redis-py keeps a known error code (MOVED, READONLY, ...) apart from the text.
            code = getattr(error, "status_code", None)
            return "server-error", f"{code} {error}" if code else str(error), None
        finally:
            self.elapsed_ms = (time.monotonic() - start) * 1000

    def run_step(self, step: dict, lock, with_key, client: Faults, pauses: list,
                 calls: list) -> None:
        action = step["do"]
        if action == "server":
            self.admin.execute_command(*with_key(step["command"]))
        elif action == "wait-server-expiry":
            key = with_key(["$KEY"])[0]
            wait_for("the lease to end on the server",
                     lambda: True if self.server.state(key) != "held" else None)
        elif action == "check-server":
            info = self.server.lock_info(with_key(["$KEY"])[0])
            for field, wanted in step["expect"].items():
                if wanted == "$FENCE":
                    wanted = lock.fence
                if field == "state":
                    got = "none" if info is None else info["state"].decode()
                else:
                    self.assertIsNotNone(info, "LOCK.INFO")
                    got = info[field]
                    got = got.decode() if isinstance(got, bytes) else got
                self.assertEqual(got, wanted, f"LOCK.INFO {field}")
        elif action == "check-lost":
            self.assertEqual(lock.lost, step["expect"], "lost")
        elif action == "release":
            self.assertEqual(lock.release(), step["expect"], "release")
        elif action == "wait-sent":
            wait_for(f"{step['count']} {step['command']} sent",
                     lambda: True if client.count(step["command"]) >= step["count"] else None)
        elif action == "wait-paused":
            self.assertTrue(all(pause.reached.wait(10) for pause in pauses),
                            "the watchdog never reached its pause")
        elif action == "resume":
            for pause in pauses:
                pause.go()
        elif action == "wait-lost-reported":
            wait_for("on_lost to be called", lambda: True if calls else None)
        else:
            raise AssertionError(f"unknown step {action!r}")


if __name__ == "__main__":
    unittest.main()
