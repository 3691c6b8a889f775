"""The servers of `make bench-peers`, each on loopback with its data in a temporary directory.

Every process started here is registered with one `Processes` and stopped by its `stop_all`
(SIGTERM, then SIGKILL after a grace period), which the driver calls on every way out. Each
server runs in a session of its own, so a Ctrl-C in the terminal reaches the driver only, and the
driver stops them in order.
"""

import json
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

TICKS_PER_SECOND = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid):
    """User plus system CPU time of a process, all its threads, from /proc/<pid>/stat."""
    with open(f"/proc/{pid}/stat") as stat:
        text = stat.read()
    # The command name is in parentheses and may hold spaces: fields are counted after it.
    fields = text[text.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / TICKS_PER_SECOND


def host_cpu():
    """(busy, total) jiffies of the whole host, from /proc/stat."""
    with open("/proc/stat") as stat:
        values = [int(v) for v in stat.readline().split()[1:]]
    idle = values[3] + values[4]
    total = sum(values[:8])
    return total - idle, total


def free_ports(count):
    """`count` distinct loopback ports nothing listens on right now."""
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def wait_for(what, check, timeout, log=None):
    """Calls `check` until it returns a true value, which is returned; fails after `timeout` s."""
    deadline = time.monotonic() + timeout
    last_error = None
    while time.monotonic() < deadline:
        try:
            value = check()
            if value:
                return value
        except Exception as error:  # the server may not be up yet
            last_error = error
        time.sleep(0.1)
    detail = f" (last error: {last_error})" if last_error else ""
    where = f"; its log: {log}" if log else ""
    raise RuntimeError(f"{what} not ready after {timeout} s{detail}{where}")


@dataclass
class Server:
    """One server process: its role in its setup, its pid and where its output goes."""

    name: str
    process: subprocess.Popen
    log: Path

    @property
    def pid(self):
        return self.process.pid

    def check_alive(self):
        if self.process.poll() is not None:
            raise RuntimeError(
                f"{self.name} exited with status {self.process.returncode}; "
                f"the end of its log ({self.log}):\n{tail(self.log)}"
            )


def tail(path, lines=15):
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


class Processes:
    """Every process the bench started, to be stopped together."""

    def __init__(self):
        self.servers = []

    def start(self, name, argv, log, cwd=None):
        with open(log, "ab") as out:
            process = subprocess.Popen(
                argv,
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        server = Server(name, process, Path(log))
        self.servers.append(server)
        return server

    def stop_all(self, grace=10.0):
        """Stops the servers one at a time, the last started first, each with SIGTERM and,
        after `grace` seconds, SIGKILL. One at a time, because an etcd leader told to stop
        hands its leadership over first, which takes seconds when the others are stopping too."""
        for server in reversed(self.servers):
            if server.process.poll() is not None:
                continue
            try:
                server.process.send_signal(signal.SIGTERM)
                server.process.wait(timeout=grace)
            except ProcessLookupError:
                pass
            except subprocess.TimeoutExpired:
                server.process.kill()
                server.process.wait()
        self.servers = []


# --- The module: a primary alone, or a primary with one replica ------------------------------


@dataclass
class Redis:
    """redis-server with the lock module: `servers[0]` the primary, then its replicas."""

    servers: list
    ports: list
    acquire_options: list = field(default_factory=list)

    @property
    def endpoints(self):
        # Only the primary grants: every worker talks to it.
        return [("127.0.0.1", self.ports[0])]


def start_redis(processes, root, name, ports, redis_server, module):
    """A primary on ports[0] and a replica of it on each further port, AOF everysec on each."""
    import redis  # from .cache/peers-py

    servers = []
    for i, port in enumerate(ports):
        role = "primary" if i == 0 else "replica"
        data = Path(root) / f"{name}-{role}-{port}"
        data.mkdir()
        argv = [
            redis_server,
            "--port", str(port),
            "--bind", "127.0.0.1",
            "--dir", str(data),
            "--appendonly", "yes",
            "--appendfsync", "everysec",
            "--save", "",
            "--repl-diskless-sync-delay", "0",
            "--loadmodule", str(module),
        ]
        if i > 0:
            argv += ["--replicaof", "127.0.0.1", str(ports[0])]
        server = processes.start(f"{name} {role}", argv, data / "server.log")
        servers.append(server)
        conn = redis.Redis(host="127.0.0.1", port=port, socket_timeout=2)
        wait_for(f"{name} {role}", conn.ping, 20, server.log)
    if len(ports) > 1:
        primary = redis.Redis(host="127.0.0.1", port=ports[0], socket_timeout=2)

        def replicas_online():
            info = primary.info("replication")
            online = [v for k, v in info.items() if k.startswith("slave")
                      and isinstance(v, dict) and v.get("state") == "online"]
            return len(online) == len(ports) - 1

        wait_for(f"{name}: replicas online", replicas_online, 30, servers[0].log)
    return Redis(servers, ports)


# --- etcd: three members -------------------------------------------------------------------


@dataclass
class Etcd:
    servers: list
    client_ports: list

    @property
    def endpoints(self):
        return [("127.0.0.1", port) for port in self.client_ports]

    def endpoint_list(self):
        return ",".join(f"http://127.0.0.1:{p}" for p in self.client_ports)

    def leader(self):
        """The index of the member that leads now (from `etcdctl endpoint status`)."""
        out = subprocess.run(
            ["etcdctl", f"--endpoints={self.endpoint_list()}", "endpoint", "status", "-w", "json"],
            capture_output=True, text=True, timeout=10, check=True,
            env={**os.environ, "ETCDCTL_API": "3"},
        ).stdout
        for i, member in enumerate(json.loads(out)):
            status = member["Status"]
            if status["header"]["member_id"] == status["leader"]:
                return i
        return None


def start_etcd(processes, root, client_ports, peer_ports):
    names = [f"member{i + 1}" for i in range(len(client_ports))]
    cluster = ",".join(f"{n}=http://127.0.0.1:{p}" for n, p in zip(names, peer_ports))
    servers = []
    for name, client, peer in zip(names, client_ports, peer_ports):
        data = Path(root) / f"etcd-{name}"
        data.mkdir()
        argv = [
            "etcd",
            "--name", name,
            "--data-dir", str(data / "data"),
            "--listen-client-urls", f"http://127.0.0.1:{client}",
            "--advertise-client-urls", f"http://127.0.0.1:{client}",
            "--listen-peer-urls", f"http://127.0.0.1:{peer}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
            "--initial-cluster", cluster,
            "--initial-cluster-token", "bench-peers",
            "--initial-cluster-state", "new",
            "--logger", "zap",
            "--log-outputs", "stderr",
        ]
        servers.append(processes.start(f"etcd {name}", argv, data / "server.log"))
    etcd = Etcd(servers, client_ports)

    def healthy():
        for server in servers:
            server.check_alive()
        subprocess.run(
            ["etcdctl", f"--endpoints={etcd.endpoint_list()}", "endpoint", "health"],
            capture_output=True, timeout=10, check=True, env={**os.environ, "ETCDCTL_API": "3"},
        )
        return etcd.leader() is not None

    wait_for("etcd cluster", healthy, 60, servers[0].log)
    return etcd


# --- ZooKeeper: three servers ----------------------------------------------------------------

ZOOKEEPER_JAR = "/usr/share/java/zookeeper.jar"


@dataclass
class ZooKeeper:
    servers: list
    client_ports: list

    @property
    def endpoints(self):
        return [("127.0.0.1", port) for port in self.client_ports]

    def modes(self):
        return [four_letter(port, "srvr").get("Mode") for port in self.client_ports]

    def leader(self):
        modes = self.modes()
        return modes.index("leader") if "leader" in modes else None


def four_letter(port, word):
    """A ZooKeeper four-letter command's `Key: value` lines as a dict."""
    with socket.create_connection(("127.0.0.1", port), timeout=2) as conn:
        conn.sendall(word.encode())
        data = b""
        while chunk := conn.recv(4096):
            data += chunk
    lines = data.decode(errors="replace").splitlines()
    return dict(line.split(": ", 1) for line in lines if ": " in line)


def start_zookeeper(processes, root, client_ports, quorum_ports, election_ports):
    members = "\n".join(
        f"server.{i + 1}=127.0.0.1:{q}:{e}"
        for i, (q, e) in enumerate(zip(quorum_ports, election_ports))
    )
    servers = []
    for i, client in enumerate(client_ports):
        data = Path(root) / f"zookeeper-{i + 1}"
        data.mkdir()
        (data / "myid").write_text(f"{i + 1}\n")
        # The packaged example's timing (tickTime 2000, initLimit 10, syncLimit 5); transaction
        # log fsync on (forceSync, ZooKeeper's default); no admin HTTP server.
        (data / "zoo.cfg").write_text(
            f"tickTime=2000\ninitLimit=10\nsyncLimit=5\n"
            f"dataDir={data}\nclientPort={client}\nclientPortAddress=127.0.0.1\n"
            f"forceSync=yes\nadmin.enableServer=false\n"
            f"4lw.commands.whitelist=srvr,ruok\n{members}\n"
        )
        argv = [
            "java",
            # The heap zkServer.sh gives a server by default.
            "-Xmx1000m",
            "-cp", ZOOKEEPER_JAR,
            "org.apache.zookeeper.server.quorum.QuorumPeerMain",
            str(data / "zoo.cfg"),
        ]
        servers.append(processes.start(f"zookeeper {i + 1}", argv, data / "server.log", cwd=data))
    zk = ZooKeeper(servers, client_ports)

    def serving():
        for server in servers:
            server.check_alive()
        modes = zk.modes()
        return sorted(modes) == ["follower"] * (len(modes) - 1) + ["leader"]

    wait_for("ZooKeeper ensemble", serving, 90, servers[0].log)
    return zk


def fsync_probe(directory, count=50):
    """Median time of a 4 KiB append plus fsync in `directory`, in ms: what a WAL write costs."""
    path = Path(directory) / "fsync-probe"
    times = []
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        block = b"x" * 4096
        for _ in range(count):
            started = time.perf_counter()
            os.write(fd, block)
            os.fsync(fd)
            times.append(time.perf_counter() - started)
    finally:
        os.close(fd)
        path.unlink()
    times.sort()
    return times[len(times) // 2] * 1000
