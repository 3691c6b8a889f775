"""A candidate in its own process, for test_election's kill and pause tests (not a test module).

``argv[1:] = port name ttl_ms value``: it campaigns, says ``leading <term>``, then every 20 ms
writes its term to the key ``<name>:written`` through ``guarded()``. When a write is refused it
says ``refused-locally`` (the helper knew the lease was over) or ``refused-by-server`` (LOCK.GUARD
answered FENCED), then sends LOCK.GUARD with its old term itself and says what the server
answered (``server-says FENCED...``), and exits. Every line is flushed. It gives up after 30 s.
"""

from __future__ import annotations

import sys
import time

import redis

from redis_lock_client import Election, LockLost


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def main() -> int:
    port, name, ttl_ms, value = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]
    client = redis.Redis(host="127.0.0.1", port=port, socket_timeout=60)
    election = Election(client, name, ttl_ms)
    term = election.campaign(value)
    say(f"leading {term}")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            election.guarded("SET", f"{name}:written", term)
        except LockLost as lost:
            say("refused-locally" if "GUARD" not in str(lost) else "refused-by-server")
            try:
                client.execute_command("LOCK.GUARD", name, term, "SET", f"{name}:written", term)
                say("server-says ran")
            except redis.ResponseError as error:
                say(f"server-says {error}")
            return 0
        time.sleep(0.02)
    return 1


if __name__ == "__main__":
    sys.exit(main())
