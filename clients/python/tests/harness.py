"""Test servers for the helper's tests: a real redis-server with the lock module on a free
loopback port in a temporary directory, stopped by the test that started it.

The server is ``$REDIS_SERVER`` (default ``redis-server`` from PATH), the module ``$LOCK_MODULE``
(default: the repository's debug build, which ``make test`` builds first).
"""

from __future__ import annotations

import os
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Optional, TypeVar

import redis
from redis import exceptions as rx
from redis._parsers import BaseParser

T = TypeVar("T")

ROOT = Path(__file__).resolve().parents[3]
PATIENCE = 10.0


def module_path() -> str:
    path = os.environ.get("LOCK_MODULE") or str(ROOT / "target/debug/libredis_lock.so")
    if not Path(path).exists():
        raise RuntimeError(f"{path} is missing: run `cargo build` in {ROOT} (make test does)")
    return path


def wait_for(what: str, check: Callable[[], Optional[T]], patience: float = PATIENCE) -> T:
    """Polls ``check`` until it returns something other than None; fails after ``patience``."""
    deadline = time.monotonic() + patience
    while True:
        value = check()
        if value is not None:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)


class Pause:
    """A watchdog pause hook (``Lock._watchdog_paused``, called between the watchdog's timer and
    its renewal): the ``nth`` call (from 1) signals ``reached`` and blocks until ``go()``."""

    def __init__(self, nth: int = 1) -> None:
        self.reached = threading.Event()
        self._go = threading.Event()
        self._nth = nth
        self._calls = 0

    def __call__(self) -> None:
        self._calls += 1
        if self._calls != self._nth:
            return
        self.reached.set()
        if not self._go.wait(PATIENCE * 3):
            raise AssertionError("the test never let the watchdog go")

    def go(self) -> None:
        self._go.set()


class Faults:
    """A client proxy between a helper and its redis-py client, the faults of
    clients/conformance/README.md: it records every command the helper sends (``sent``) and,
    on the nth command of a name, ``drop-reply`` (the server runs it, the helper gets the
    ConnectionError redis-py raises for a connection reset while reading the reply) or
    ``reply-error`` (not sent; the helper gets the exception redis-py makes of that error
    reply). ``faults`` are dicts ``{"at": name, "nth": n | [n, ...] | "every", "fault": ...,
    "error": text}``; commands are counted per name, from 1, over all threads."""

    def __init__(self, client: Any, faults: Iterable[dict] = ()) -> None:
        self.client = client
        self.faults = [f for f in faults if f["at"] != "watchdog"]
        self.sent: list[tuple] = []
        self._counts: dict[str, int] = {}
        self._mutex = threading.Lock()

    def count(self, name: str) -> int:
        with self._mutex:
            return self._counts.get(name.upper(), 0)

    def _fault(self, name: str, n: int) -> Optional[dict]:
        for fault in self.faults:
            nth = fault["nth"]
            if fault["at"].upper() == name and (
                    nth == "every" or nth == n or (isinstance(nth, list) and n in nth)):
                return fault
        return None

    def execute_command(self, *args: Any) -> Any:
        name = _text(args[0]).upper()
        with self._mutex:
            n = self._counts[name] = self._counts.get(name, 0) + 1
            self.sent.append(args)
        fault = self._fault(name, n)
        if fault is None:
            return self.client.execute_command(*args)
        if fault["fault"] == "reply-error":
            raise BaseParser.parse_error(fault["error"])
        if fault["fault"] == "drop-reply":
            self.client.execute_command(*args)
            raise rx.ConnectionError("Error while reading from 127.0.0.1 : (104, 'Connection "
                                     "reset by peer') (dropped by the test)")
        raise AssertionError(f"unknown fault {fault['fault']!r}")


def _text(word: Any) -> str:
    return word.decode() if isinstance(word, bytes) else str(word)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """One redis-server with the module; ``stop()`` (or the context manager) ends it."""

    def __init__(self, *extra: str):
        self.dir = tempfile.TemporaryDirectory(prefix="lock-client-")
        self.port = free_port()
        binary = os.environ.get("REDIS_SERVER", "redis-server")
        args = [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                "--appendonly", "no", "--dir", self.dir.name, "--loadmodule", module_path(),
                *extra]
        self.log = open(Path(self.dir.name) / "server.log", "wb")
        self.process = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT)
        self.admin = self.client()
        wait_for(f"redis-server on port {self.port}", self._ready)

    def _ready(self) -> Optional[bool]:
        if self.process.poll() is not None:
            raise AssertionError(f"redis-server exited: {self.log_text()}")
        try:
            return True if self.admin.ping() else None
        except redis.ConnectionError:
            return None

    def client(self, **kw) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=30, **kw)

    def log_text(self) -> str:
        return (Path(self.dir.name) / "server.log").read_text(errors="replace")

    def calls(self, command: str) -> int:
        """How many times the server ran ``command`` (INFO commandstats)."""
        stats = self.admin.info("commandstats").get(f"cmdstat_{command.lower()}")
        return int(stats["calls"]) if stats else 0

    def lock_info(self, key: str) -> Optional[dict]:
        reply = self.admin.execute_command("LOCK.INFO", key)
        if reply is None:
            return None
        if isinstance(reply, dict):
            return {k.decode(): v for k, v in reply.items()}
        pairs = iter(reply)
        return {k.decode(): v for k, v in zip(pairs, pairs)}

    def state(self, key: str) -> str:
        info = self.lock_info(key)
        return "none" if info is None else info["state"].decode()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=PATIENCE)
        self.admin.close()
        self.log.close()
        self.dir.cleanup()

    def __enter__(self) -> "Server":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


class Cluster:
    """Three cluster-enabled primaries with the module, slots split among them."""

    def __init__(self, nodes: int = 3):
        self.nodes: list[Server] = []
        try:
            for _ in range(nodes):
                # The bus port is picked too: port + 10000 may be taken.
                bus = free_port()
                node = Server("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                              "--cluster-node-timeout", "1000", "--cluster-port", str(bus))
                node.bus_port = bus
                self.nodes.append(node)
            share = 16384 // nodes
            for i, node in enumerate(self.nodes):
                last = 16383 if i == nodes - 1 else (i + 1) * share - 1
                node.admin.execute_command("CLUSTER", "ADDSLOTSRANGE", i * share, last)
            for node in self.nodes[1:]:
                self.nodes[0].admin.execute_command("CLUSTER", "MEET", "127.0.0.1", node.port,
                                                    node.bus_port)
            wait_for("cluster_state:ok on every node", self._all_ok)
        except BaseException:
            self.stop()
            raise

    def _all_ok(self) -> Optional[bool]:
        """Every node says ok, knows every other, and all agree on every slot's owner."""
        views = []
        for node in self.nodes:
            info = node.admin.execute_command("CLUSTER", "INFO").decode()
            if "cluster_state:ok" not in info or f"cluster_known_nodes:{len(self.nodes)}" not in info:
                return None
            views.append(sorted((s[0], s[1], s[2][1])
                                for s in node.admin.execute_command("CLUSTER", "SLOTS")))
        return True if all(view == views[0] for view in views) else None

    def node_id(self, index: int) -> str:
        return self.nodes[index].admin.execute_command("CLUSTER", "MYID").decode()

    def owner_of(self, key: str) -> int:
        slot = self.nodes[0].admin.execute_command("CLUSTER", "KEYSLOT", key)
        port = self._owner_seen(self.nodes[0], slot)
        return next(i for i, n in enumerate(self.nodes) if n.port == port)

    def migrate_key_slot(self, key: str, source: int, target: int) -> None:
        """Moves ``key``'s slot as redis-cli --cluster does: IMPORTING, MIGRATING, MIGRATE,
        then SETSLOT NODE everywhere."""
        src, dst = self.nodes[source], self.nodes[target]
        slot = src.admin.execute_command("CLUSTER", "KEYSLOT", key)
        dst.admin.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", self.node_id(source))
        src.admin.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", self.node_id(target))
        while True:
            keys = src.admin.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 100)
            if not keys:
                break
            src.admin.execute_command("MIGRATE", "127.0.0.1", dst.port, "", 0, 5000, "KEYS", *keys)
        # The new owner first (it takes a new config epoch), then the others.
        for node in [dst] + [n for n in self.nodes if n is not dst]:
            node.admin.execute_command("CLUSTER", "SETSLOT", slot, "NODE", self.node_id(target))
        wait_for("every node to agree on the slot's owner",
                 lambda: True if all(self._owner_seen(n, slot) == dst.port for n in self.nodes)
                 and self._all_ok() else None)

    @staticmethod
    def _owner_seen(node: Server, slot: int) -> Optional[int]:
        for start, end, master, *_ in node.admin.execute_command("CLUSTER", "SLOTS"):
            if start <= slot <= end:
                return master[1]
        return None

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    def __enter__(self) -> "Cluster":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
