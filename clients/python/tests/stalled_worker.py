"""The child process of test_lock's whole-process stall test (not a test module itself).

It takes ``argv[1:] = port key ttl_ms``, holds the lock with the watchdog on and works in a busy
loop that checks it with ``fenced()`` between steps, as a worker does between writes. The test
stops the whole process (SIGSTOP) past the lease and resumes it (SIGCONT). Every event is one
flushed line on stdout:

    acquired <fence>        the grant
    on_lost-called <thread> each call of on_lost, from whichever thread noticed
    lost-seen               fenced() raised LockLost in the worker's own thread
    released <True|False>   what release() returned
    on_lost calls <n>       after release(): the watchdog is stopped, no call can follow

It gives up on its own after 30 s, so a test that failed to stop it cannot leave it behind
for long.
"""

from __future__ import annotations

import sys
import threading
import time

import redis

from redis_lock_client import Lock, LockLost


_out = threading.Lock()


def say(line: str) -> None:
    with _out:  # whole lines, whichever thread writes
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def main() -> int:
    port, key, ttl_ms = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    calls = []

    def on_lost(_lock: Lock) -> None:
        calls.append(threading.current_thread().name)
        say(f"on_lost-called {threading.current_thread().name}")

    client = redis.Redis(host="127.0.0.1", port=port, socket_timeout=10)
    lock = Lock(client, key, ttl_ms, watchdog=True, on_lost=on_lost)
    say(f"acquired {lock.acquire()}")
    give_up = time.monotonic() + 30
    try:
        while time.monotonic() < give_up:
            lock.fenced(lambda fence: sum(range(1000)))  # a step of work, on the CPU
        say("gave up: the lock was never lost")
        return 1
    except LockLost:
        say("lost-seen")
    say(f"released {lock.release()}")
    say(f"on_lost calls {len(calls)}")
    client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
