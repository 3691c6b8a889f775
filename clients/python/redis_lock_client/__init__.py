"""A guard, a watchdog and fenced calls over the lock module's LOCK.* commands, for redis-py.

    import redis
    from redis_lock_client import Lock, LockNotAcquired

    r = redis.Redis(socket_timeout=15)
    try:
        with Lock(r, "orders:42", ttl_ms=30000, wait_ms=10000, watchdog=True) as lock:
            lock.fenced(lambda fence: write_order(fence=fence))
    except LockNotAcquired:
        ...  # busy for 10 s: the body did not run

See clients/python/README.md and the repository's README for the commands underneath.
"""

from ._election import Election, Leader
from ._redlock import Redlock, RedlockNoFence
from ._lock import (
    Lock,
    LockArgumentError,
    LockConnectionError,
    LockError,
    LockLost,
    LockNotAcquired,
    LockPolicyError,
    LockUnknown,
    RetryPolicy,
)

__all__ = [
    "Election",
    "Leader",
    "Lock",
    "LockArgumentError",
    "LockConnectionError",
    "LockError",
    "LockLost",
    "LockNotAcquired",
    "LockPolicyError",
    "LockUnknown",
    "Redlock",
    "RedlockNoFence",
    "RetryPolicy",
]
__version__ = "0.1.0"
