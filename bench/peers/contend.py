"""The contention loop of `make bench-peers`, the same for every lock service.

Each worker is a process of its own with one connection (one session) to the service: it takes
the shared lock, runs a tiny critical section (checks that nobody else is inside, increments a
counter in shared memory), notes the time, releases, and starts over at once. Every service
queues waiters in arrival order, so a worker that has just released queues behind the others.

Handoff is the time from one worker noting the release (just before sending it) to the next
worker reading its grant, both on CLOCK_MONOTONIC of this one host.

The three clients, each the service's own way to wait for a lock:

- the module: `LOCK.ACQUIRE key token ttl WAIT 0 [SYNC 1 1000]`, then `LOCK.RELEASE key token`
  (redis-py);
- etcd: the Lock service's `Lock` RPC with the worker's lease, then `Unlock` with the key it
  returned (grpcio; the few protobuf fields are encoded here, see `Proto`);
- ZooKeeper: kazoo's `Lock` recipe (an ephemeral sequential node, a watch on the one before).
"""

import os
import signal
import time
import traceback

# Phases the controller sets in shared memory.
WAITING, RUNNING, COUNTING, STOPPING = 0, 1, 2, 3

LEASE_MS = 10000


class Shared:
    """What the controller and the workers of one run share (multiprocessing shared memory)."""

    def __init__(self, context, workers):
        self.phase = context.RawValue("i", WAITING)
        self.ready = context.RawArray("i", workers)
        self.grants = context.RawArray("q", workers)
        self.refused = context.RawArray("q", workers)
        self.overlaps = context.RawArray("q", workers)
        self.inside = context.RawValue("i", 0)
        self.counter = context.RawValue("q", 0)
        # When the last release was noted, ns of CLOCK_MONOTONIC (0: none yet).
        self.released_at = context.RawValue("q", 0)


# --- Clients ---------------------------------------------------------------------------------


class ModuleClient:
    def __init__(self, endpoint, name, worker, acquire_options):
        import redis

        self.conn = redis.Redis(host=endpoint[0], port=endpoint[1], socket_timeout=None)
        self.key = name
        self.token = f"bench-peers-{worker:02d}-{os.getpid()}"
        self.acquire_command = [
            "LOCK.ACQUIRE", self.key, self.token, str(LEASE_MS), "WAIT", "0", *acquire_options
        ]

    def acquire(self):
        """True when granted; False when the grant was undone (SYNC not acknowledged in time)."""
        import redis

        try:
            reply = self.conn.execute_command(*self.acquire_command)
        except redis.ResponseError as error:
            if "NOREPLICAS" in str(error):
                return False
            raise
        if not isinstance(reply, int):
            raise RuntimeError(f"LOCK.ACQUIRE answered {reply!r}")
        return True

    def release(self):
        reply = self.conn.execute_command("LOCK.RELEASE", self.key, self.token)
        if reply != 1:
            raise RuntimeError(f"LOCK.RELEASE answered {reply!r}")

    def close(self):
        self.conn.close()


class Proto:
    """The protobuf wire format, for the handful of etcd messages used here: varints (wire type
    0) and length-delimited fields (wire type 2)."""

    @staticmethod
    def varint(value):
        value &= (1 << 64) - 1  # negative int64 values are sent as 10-byte varints
        out = bytearray()
        while True:
            low = value & 0x7F
            value >>= 7
            if value:
                out.append(low | 0x80)
            else:
                out.append(low)
                return bytes(out)

    @classmethod
    def integer(cls, number, value):
        return cls.varint(number << 3) + cls.varint(value)

    @classmethod
    def data(cls, number, value):
        return cls.varint(number << 3 | 2) + cls.varint(len(value)) + value

    @staticmethod
    def fields(message):
        """{field number: value} of a message's varint and length-delimited fields."""
        out, at = {}, 0

        def read_varint():
            nonlocal at
            value, shift = 0, 0
            while True:
                byte = message[at]
                at += 1
                value |= (byte & 0x7F) << shift
                shift += 7
                if not byte & 0x80:
                    return value

        while at < len(message):
            tag = read_varint()
            number, wire = tag >> 3, tag & 7
            if wire == 0:
                out[number] = read_varint()
            elif wire == 2:
                length = read_varint()
                out[number] = message[at : at + length]
                at += length
            elif wire == 1:
                at += 8
            elif wire == 5:
                at += 4
            else:
                raise ValueError(f"protobuf wire type {wire} not expected")
        return out


class EtcdClient:
    """etcd's v3 Lock service over gRPC. The lock is tied to a lease the worker grants once (its
    session, as etcd's own concurrency package does) and revokes when it stops."""

    def __init__(self, endpoint, name, worker, lease_seconds):
        import grpc

        self.channel = grpc.insecure_channel(f"{endpoint[0]}:{endpoint[1]}")
        grpc.channel_ready_future(self.channel).result(timeout=30)

        def method(path):
            # No serializers: requests and responses pass as bytes, encoded by Proto.
            return self.channel.unary_unary(path)

        self.lock_rpc = method("/v3lockpb.Lock/Lock")
        self.unlock_rpc = method("/v3lockpb.Lock/Unlock")
        lease_grant = method("/etcdserverpb.Lease/LeaseGrant")
        self.lease_revoke = method("/etcdserverpb.Lease/LeaseRevoke")
        # LeaseGrantRequest {TTL = 1}; LeaseGrantResponse {ID = 2}
        granted = Proto.fields(lease_grant(Proto.integer(1, lease_seconds), timeout=30))
        self.lease = granted[2]
        self.name = name.encode()
        self.key = None

    def acquire(self):
        # LockRequest {name = 1, lease = 2}; LockResponse {key = 2}
        reply = self.lock_rpc(Proto.data(1, self.name) + Proto.integer(2, self.lease))
        self.key = Proto.fields(reply)[2]
        return True

    def release(self):
        # UnlockRequest {key = 1}
        self.unlock_rpc(Proto.data(1, self.key))

    def close(self):
        try:
            # LeaseRevokeRequest {ID = 1}
            self.lease_revoke(Proto.integer(1, self.lease), timeout=10)
        finally:
            self.channel.close()


class ZooKeeperClient:
    """kazoo's Lock recipe on one server of the ensemble."""

    def __init__(self, endpoint, name, worker):
        from kazoo.client import KazooClient

        self.client = KazooClient(hosts=f"{endpoint[0]}:{endpoint[1]}", timeout=15)
        self.client.start(timeout=30)
        self.lock = self.client.Lock(name, identifier=f"worker-{worker}")

    def acquire(self):
        return self.lock.acquire()

    def release(self):
        self.lock.release()

    def close(self):
        self.client.stop()
        self.client.close()


def connect(kind, endpoint, name, worker, options):
    if kind == "module":
        return ModuleClient(endpoint, name, worker, options)
    if kind == "etcd":
        return EtcdClient(endpoint, name, worker, options)
    if kind == "zookeeper":
        return ZooKeeperClient(endpoint, name, worker)
    raise ValueError(kind)


# --- The loop --------------------------------------------------------------------------------


def worker(kind, endpoint, name, options, index, shared, results):
    """One worker process: connect, report ready, loop until the controller says stop, then
    send the handoff samples (ns) it saw while counting, or the error that ended it."""
    # The driver stops the workers itself; a Ctrl-C in the terminal is for the driver.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    samples = []
    client = None
    try:
        client = connect(kind, endpoint, name, index, options)
        shared.ready[index] = 1
        while shared.phase.value == WAITING:
            time.sleep(0.001)
        while True:
            if not client.acquire():
                shared.refused[index] += 1
                if shared.phase.value == STOPPING:
                    break
                continue
            granted = time.monotonic_ns()
            if shared.phase.value == COUNTING:
                released = shared.released_at.value
                if released:
                    samples.append(granted - released)
            # The critical section.
            if shared.inside.value:
                shared.overlaps[index] += 1
            shared.inside.value = 1
            shared.counter.value += 1
            shared.grants[index] += 1
            shared.inside.value = 0
            shared.released_at.value = time.monotonic_ns()
            client.release()
            if shared.phase.value == STOPPING:
                break
        client.close()
        results.send(("samples", samples))
    except BaseException:
        results.send(("error", traceback.format_exc()))
        os._exit(1)
    finally:
        results.close()
