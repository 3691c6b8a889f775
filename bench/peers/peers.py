#!/usr/bin/env python3
"""`make bench-peers`: the lock module against etcd and ZooKeeper, one contention loop for all.

N worker processes (default 16) take turns on one lock of each setup, all on 127.0.0.1:

- the module alone (redis-server with the release module, AOF with appendfsync everysec);
- the module on a primary with one replica, without and with `SYNC 1 1000` on every ACQUIRE, and
  with `SYNC 1 1000 FSYNC 1000` (also fsynced to the primary's AOF before the reply);
- a 3-member etcd cluster, through its Lock RPC;
- a 3-server ZooKeeper ensemble, through kazoo's Lock recipe.

Every setup is started first and runs for the whole bench; rounds interleave the rows (the order
turns around every round) so a change in the machine's load falls on all of them, and each row's
figures are the median over its rounds. Per row: critical sections per second, fairness (Jain's
index over the workers' grants and the fewest grants of a worker over the most), handoff p50 and
p99, the CPU time of each server process per critical section (/proc/<pid>/stat before and after
each round), the workers' CPU, and how busy the row kept the cores (and how busy the host was).

Run from the repository's root (the Makefile target does):

    make bench-peers                      # about 5 minutes; writes bench/results.md and prints the table
    make bench-peers BENCH_QUICK=1        # short rounds, results in target/bench/peers.md only

Settings (environment): BENCH_PEERS_WORKERS (16), BENCH_PEERS_ROUNDS (3), BENCH_PEERS_SECONDS
(10 per round and row), BENCH_PEERS_ROWS (a comma-separated subset of module, replica, sync,
durable, etcd, zookeeper; a subset writes to target/bench/peers.md), REDIS_SERVER (redis-server) and
LOCK_MODULE (default target/release/libredis_lock.so, built into .cache/peers-target when
missing).

Missing tools are installed: etcd-server, etcd-client and zookeeper with apt-get (as root on
Debian), the Python clients with pip into .cache/peers-py (bench/peers/requirements.txt).
"""

import multiprocessing
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
PY_CACHE = ROOT / ".cache" / "peers-py"
APT_PACKAGES = ["etcd-server", "etcd-client", "zookeeper"]
BEGIN = "<!-- bench-peers: begin. Written by `make bench-peers` (bench/peers/); do not edit by hand. -->"
END = "<!-- bench-peers: end -->"
README_BEGIN = "<!-- bench-peers table: written by `make bench-peers` -->"
README_END = "<!-- bench-peers table: end -->"


def say(message):
    print(f"bench-peers: {message}", flush=True)


# --- Setting up: packages, Python clients, the module ---------------------------------------


def installed(package):
    out = subprocess.run(
        ["dpkg-query", "-W", "-f", "${Status}|${Version}", package],
        capture_output=True, text=True,
    ).stdout
    status, _, version = out.partition("|")
    return version if status.endswith(" installed") else None


def running(program):
    return subprocess.run(["pgrep", "-x", program], capture_output=True).returncode == 0


def ensure_packages():
    missing = [p for p in APT_PACKAGES if not installed(p)]
    if missing:
        if not (Path("/etc/debian_version").exists() and shutil.which("apt-get") and os.getuid() == 0):
            sys.exit(f"bench-peers: install {' '.join(missing)} (Debian bookworm: etcd 3.4, "
                     "ZooKeeper 3.8), then run it again")
        etcd_was_running = running("etcd")
        say(f"apt-get install -y {' '.join(missing)}")
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "update", "-qq"], env=env, check=True)
        subprocess.run(["apt-get", "install", "-y", "-qq", *missing], env=env, check=True)
        # etcd-server's package enables and may start a system etcd on port 2379; the bench
        # runs its own, so one the install started is stopped again.
        if not etcd_was_running and running("etcd"):
            say("stopping the etcd service the install started")
            if Path("/run/systemd/system").is_dir():
                subprocess.run(["systemctl", "stop", "etcd"], check=False)
            else:
                subprocess.run(["service", "etcd", "stop"], check=False)
    return {p: installed(p) for p in APT_PACKAGES}


def ensure_python_clients():
    """pip-installs the pinned clients into .cache/peers-py once, then imports from there."""
    requirements = HERE / "requirements.txt"
    pins = [line.split("#")[0].strip() for line in requirements.read_text().splitlines()]
    pins = [p for p in pins if p]
    wanted = [p.replace("==", "-") for p in pins]
    have = {d.name.removesuffix(".dist-info").lower().replace("_", "-")
            for d in PY_CACHE.glob("*.dist-info")} if PY_CACHE.is_dir() else set()
    if not all(w.lower().replace("_", "-") in have for w in wanted):
        say(f"pip install {' '.join(pins)} into {PY_CACHE.relative_to(ROOT)}")
        shutil.rmtree(PY_CACHE, ignore_errors=True)
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
             "--no-warn-script-location", "--target", str(PY_CACHE), "-r", str(requirements)],
            check=True,
        )
    sys.path.insert(0, str(PY_CACHE))
    return pins


def lock_module():
    """The module to load: $LOCK_MODULE, else the release build in target/, else one built
    into .cache/peers-target (a target directory of its own, so a build here never touches
    target/ while someone else works there)."""
    if os.environ.get("LOCK_MODULE"):
        return Path(os.environ["LOCK_MODULE"])
    built = ROOT / "target" / "release" / "libredis_lock.so"
    if built.exists():
        return built
    target = ROOT / ".cache" / "peers-target"
    say(f"no {built.relative_to(ROOT)}: cargo build --release into {target.relative_to(ROOT)}")
    subprocess.run(["cargo", "build", "--release"], cwd=ROOT, check=True,
                   env={**os.environ, "CARGO_TARGET_DIR": str(target)})
    return target / "release" / "libredis_lock.so"


# --- Rows ------------------------------------------------------------------------------------


@dataclass
class Row:
    key: str
    label: str
    kind: str  # which client: module, etcd or zookeeper
    durable: str  # in a few words, for the README's table
    durability: str
    setup: object = None
    options: object = ()  # the client's extra: ACQUIRE options, or the etcd lease TTL
    rounds: list = field(default_factory=list)


ROWS = [
    Row("module", "module alone", "module",
        "the primary's memory (its AOF fsyncs within 1 s)",
        "The primary answers from memory. Its AOF (`appendfsync everysec`) reaches the disk "
        "within about a second; there is no other copy. A kill -9 or power loss can lose the "
        "last second of grants; losing the machine loses the lock service."),
    Row("replica", "module + 1 replica", "module",
        "the primary's memory (the replica's soon after)",
        "The primary answers from memory and replicates afterwards (both AOF everysec). A "
        "failover to the replica can lose the latest grants, those it had not yet received."),
    Row("sync", "module + 1 replica, `SYNC 1 1000`", "module",
        "the memory of both servers (the replica acknowledged it); not yet fsynced",
        "The reply waits until the replica acknowledged receiving the grant (into its memory: "
        "neither server fsyncs before the reply; a grant not acknowledged within 1000 ms is "
        "taken back). Survives losing one machine, if the replica is then promoted (Sentinel or "
        "an operator: the module elects nothing); not both losing power within the same second."),
    Row("durable", "module + 1 replica, `SYNC 1 1000 FSYNC 1000`", "module",
        "the primary's fsynced AOF, and the replica's memory",
        "The reply waits until the replica acknowledged the grant and the primary fsynced it to "
        "its AOF (the module fdatasyncs the AOF files itself, once for all the grants of an "
        "event-loop turn); either missing within 1000 ms takes the grant back. Survives a power "
        "loss of the primary's machine (restarted from its AOF), or losing it for good if the "
        "replica is promoted; not the replica's fsync, which the primary cannot see."),
    Row("etcd", "etcd, 3 members, Lock RPC", "etcd",
        "the fsynced WAL of 2 of the 3 members",
        "A grant is a write through Raft: the leader answers once a majority (2 of 3) has the "
        "entry in its WAL, fsynced. Survives losing any one member, and elects a new leader by "
        "itself."),
    Row("zookeeper", "ZooKeeper, 3 servers, kazoo Lock", "zookeeper",
        "the fsynced transaction log of 2 of the 3 servers",
        "A grant is a node created through Zab: the leader commits once a quorum (2 of 3) has "
        "logged the transaction and fsynced it (`forceSync=yes`). Survives losing any one "
        "server, and elects a new leader by itself."),
]

# How the loop runs, under the tables of bench/results.md.
METHOD = """\
How it runs: each worker is a process with one connection (a session) and its own token, lease
or client; it takes the lock, runs a tiny critical section (checks that no other worker is
inside, increments a counter in shared memory), notes the time and releases, then asks again at
once. All three services queue waiters in arrival order (the module's `WAIT` queue, etcd's key
revisions, ZooKeeper's sequential nodes), so every grant is a handoff to a waiting worker.
Handoff: from the releaser noting the time to the next holder reading its grant, both on the
host's monotonic clock. The module's workers send `LOCK.ACQUIRE key token 10000 WAIT 0` (plus
`SYNC 1 1000`, or `SYNC 1 1000 FSYNC 1000`, in those rows) and `LOCK.RELEASE` with redis-py to the primary; etcd's call the Lock
service's `Lock` RPC with a lease each worker granted once, then `Unlock` (grpcio); ZooKeeper's
use kazoo's `Lock`. etcd's and ZooKeeper's workers are spread round-robin over the three
members. CPU: user + system time of every process of the row (/proc/<pid>/stat) over each
round, divided by its critical sections: the servers', and the workers' (Python clients, on the
same two cores). Cores busy: the row's own processes' CPU time against both cores' time, then
the whole host's (the difference is anything else that ran). Redis runs with the AOF on
(`appendfsync everysec`), etcd with its defaults, ZooKeeper with the timing of Debian's example
configuration; all keep their data on the same local disk.
"""


@dataclass
class Round:
    per_sec: float
    jain: float
    min_max: float
    p50_ms: float
    p99_ms: float
    server_us: list  # CPU µs per critical section, per server process
    leader: object  # index into server_us of the leader, when the setup has one
    clients_us: float
    own: float  # the row's processes' CPU time, as a fraction of all cores' time
    busy: float  # fraction of the host's CPU time spent busy, by anything
    refused: int
    overlaps: int


def percentile(sorted_values, q):
    if not sorted_values:
        return float("nan")
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def run_round(row, workers, seconds, settle, name, context):
    """One run of `row`: start the workers, let them settle, count for `seconds`, stop."""
    from services import cpu_seconds, host_cpu
    import contend

    shared = contend.Shared(context, workers)
    endpoints = row.setup.endpoints
    procs, pipes = [], []
    for i in range(workers):
        receive, send = context.Pipe(duplex=False)
        # Workers are spread over the members round-robin, as a client with every member's
        # address does; the module's workers all use the primary.
        proc = context.Process(
            target=contend.worker,
            args=(row.kind, endpoints[i % len(endpoints)], name, row.options, i, shared, send),
            daemon=True,
        )
        proc.start()
        send.close()
        procs.append(proc)
        pipes.append(receive)
    try:
        deadline = time.monotonic() + 60
        while not all(shared.ready):
            for proc, pipe in zip(procs, pipes):
                if not proc.is_alive() and pipe.poll():
                    kind, detail = pipe.recv()
                    raise RuntimeError(f"{row.label}: a worker failed to start:\n{detail}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{row.label}: workers not connected after 60 s")
            time.sleep(0.01)
        shared.phase.value = contend.RUNNING
        time.sleep(settle)

        servers = row.setup.servers

        def snapshot():
            return (time.monotonic(), list(shared.grants),
                    [cpu_seconds(s.pid) for s in servers],
                    sum(cpu_seconds(p.pid) for p in procs), host_cpu())

        shared.phase.value = contend.COUNTING
        before = snapshot()
        time.sleep(seconds)
        after = snapshot()
        shared.phase.value = contend.STOPPING
        for server in servers:
            server.check_alive()

        samples = []
        for proc, pipe in zip(procs, pipes):
            if not pipe.poll(60):
                raise RuntimeError(f"{row.label}: a worker did not stop within 60 s")
            kind, detail = pipe.recv()
            if kind == "error":
                raise RuntimeError(f"{row.label}: a worker failed:\n{detail}")
            samples.extend(detail)
            proc.join(10)
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
                proc.join()

    elapsed = after[0] - before[0]
    grants = [b - a for a, b in zip(before[1], after[1])]
    sections = sum(grants)
    if sections == 0:
        raise RuntimeError(f"{row.label}: no critical section in {elapsed:.1f} s")
    jain = sections**2 / (len(grants) * sum(g * g for g in grants))
    server_us = [(b - a) * 1e6 / sections for a, b in zip(before[2], after[2])]
    busy = (after[4][0] - before[4][0]) / max(1, after[4][1] - before[4][1])
    own_cpu = sum(after[2]) - sum(before[2]) + after[3] - before[3]
    samples.sort()
    leader = getattr(row.setup, "leader", None)
    return Round(
        per_sec=sections / elapsed,
        jain=jain,
        min_max=min(grants) / max(grants),
        p50_ms=percentile(samples, 0.5) / 1e6,
        p99_ms=percentile(samples, 0.99) / 1e6,
        server_us=server_us,
        leader=leader() if leader else None,
        clients_us=(after[3] - before[3]) * 1e6 / sections,
        own=own_cpu / (elapsed * os.cpu_count()),
        busy=busy,
        refused=sum(shared.refused),
        overlaps=sum(shared.overlaps),
    )


# --- Report ----------------------------------------------------------------------------------


def cpu_breakdown(row):
    """Per-process CPU per critical section, as `primary 40 + replica 12` (medians)."""
    if row.kind == "module":
        names = ["primary", "replica"][: len(row.rounds[0].server_us)]
        values = [statistics.median(r.server_us[i] for r in row.rounds) for i in range(len(names))]
        return " + ".join(f"{n} {v:.0f}" for n, v in zip(names, values))
    # Members of a consensus group: the leader, then the two followers (a leader may change
    # between rounds; each round's own leader is taken).
    leaders, followers = [], []
    for r in row.rounds:
        at = r.leader if r.leader is not None else max(range(len(r.server_us)), key=r.server_us.__getitem__)
        leaders.append(r.server_us[at])
        followers.append(sorted(v for i, v in enumerate(r.server_us) if i != at))
    parts = [f"leader {statistics.median(leaders):.0f}"]
    parts += [f"follower {statistics.median(f[i] for f in followers):.0f}" for i in range(len(followers[0]))]
    return " + ".join(parts)


def medians(row):
    m = statistics.median
    rounds = row.rounds
    return {
        "per_sec": m(r.per_sec for r in rounds),
        "jain": m(r.jain for r in rounds),
        "min_max": m(r.min_max for r in rounds),
        "p50": m(r.p50_ms for r in rounds),
        "p99": m(r.p99_ms for r in rounds),
        "server_us": m(sum(r.server_us) for r in rounds),
        "clients_us": m(r.clients_us for r in rounds),
        "own": m(r.own for r in rounds),
        "busy": m(r.busy for r in rounds),
    }


def results_section(rows, header):
    """The section of bench/results.md: every figure, durability in words, how it runs."""
    lines = [
        "## Compared with etcd and ZooKeeper",
        "",
        header,
        "",
        "| setup | critical sections/s | fairness: Jain / fewest÷most | handoff p50 / p99 (ms) "
        "| servers' CPU per critical section (µs) | by process (µs) | workers' CPU per critical "
        "section (µs) | cores busy: this row / all |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        f = medians(row)
        lines.append(
            f"| {row.label} | {f['per_sec']:.0f} | {f['jain']:.3f} / {f['min_max']:.2f} "
            f"| {f['p50']:.2f} / {f['p99']:.2f} | {f['server_us']:.0f} | {cpu_breakdown(row)} "
            f"| {f['clients_us']:.0f} | {f['own'] * 100:.0f}% / {f['busy'] * 100:.0f}% |"
        )
    lines += ["", "| setup | what a grant has become when its reply arrives |", "|---|---|"]
    lines += [f"| {row.label} | {row.durability} |" for row in rows]
    lines.append("")
    for row in rows:
        refused = sum(r.refused for r in row.rounds)
        overlaps = sum(r.overlaps for r in row.rounds)
        if refused:
            lines.append(f"{row.label}: {refused} grants undone (NOREPLICAS) and asked again.")
        if overlaps:
            lines.append(f"{row.label}: {overlaps} critical sections overlapped another: "
                         "mutual exclusion broken.")
    if lines[-1]:
        lines.append("")
    lines.append(METHOD)
    return "\n".join(lines)


def workers_share(figures):
    """The workers' CPU time, in percentage points of all cores' time."""
    return figures["clients_us"] * figures["per_sec"] / (os.cpu_count() * 1e6) * 100


def readme_table(rows):
    """The README's table: the main figures, the durability in a few words, and the ratios."""
    lines = [
        "| setup | critical sections/s | handoff p50 / p99 (ms) | servers' CPU per critical "
        "section (µs) | when the reply arrives, the grant is in |",
        "|---|---|---|---|---|",
    ]
    figures = {row.key: medians(row) for row in rows}
    for row in rows:
        f = figures[row.key]
        lines.append(f"| {row.label} | {f['per_sec']:.0f} | {f['p50']:.2f} / {f['p99']:.2f} "
                     f"| {f['server_us']:.0f} | {row.durable} |")
    if {"sync", "etcd", "zookeeper"} <= figures.keys():
        sync, etcd, zk = figures["sync"], figures["etcd"], figures["zookeeper"]
        lines += [
            "",
            f"In this run the module with one replica and `SYNC 1 1000` served "
            f"{sync['per_sec'] / etcd['per_sec']:.1f}x etcd's and "
            f"{sync['per_sec'] / zk['per_sec']:.1f}x ZooKeeper's critical sections per second, "
            f"for {sync['server_us'] / etcd['server_us'] * 100:.0f}% and "
            f"{sync['server_us'] / zk['server_us'] * 100:.0f}% of their servers' CPU time per "
            f"critical section. The servers and workers of a row kept the {os.cpu_count()} cores "
            f"{sync['own'] * 100:.0f}% busy with the module and SYNC (the workers' Python "
            f"clients {workers_share(sync):.0f} points of it), {etcd['own'] * 100:.0f}% with "
            f"etcd ({workers_share(etcd):.0f}) and {zk['own'] * 100:.0f}% with ZooKeeper "
            f"({workers_share(zk):.0f}).",
        ]
        if "durable" in figures:
            durable = figures["durable"]
            lines[-1] += (
                f" With the grant also fsynced to the primary's AOF before the reply (`FSYNC`), "
                f"{durable['per_sec'] / etcd['per_sec']:.1f}x etcd's and "
                f"{durable['per_sec'] / zk['per_sec']:.1f}x ZooKeeper's."
            )
        lines[-1] = textwrap.fill(lines[-1], width=100)
    return "\n".join(lines) + "\n"


def replace_block(path, begin, end, text, append=False):
    """Replaces what lies between the lines `begin` and `end` of `path` with `text`. Without
    the markers: appends them with `text` when `append`, else leaves the file alone (False)."""
    old = path.read_text() if path.exists() else ""
    block = f"{begin}\n\n{text.strip()}\n\n{end}"
    if begin in old and end in old:
        new = old[: old.index(begin)] + block + old[old.index(end) + len(end):]
    elif append:
        new = old.rstrip("\n") + ("\n\n" if old else "") + block + "\n"
    else:
        return False
    path.write_text(new)
    return True


def versions(redis_server, pins, packages):
    redis_version = subprocess.run([redis_server, "--version"], capture_output=True,
                                   text=True).stdout.split()
    redis_version = next((w[2:] for w in redis_version if w.startswith("v=")), "?")
    clients = ", ".join(p.replace("==", " ") for p in pins if not p.startswith("typing"))
    return (f"Redis {redis_version}, etcd {packages['etcd-server']}, "
            f"ZooKeeper {packages['zookeeper']} (Debian packages; OpenJDK "
            f"{java_version()}); clients {clients}, Python {sys.version.split()[0]}")


def java_version():
    out = subprocess.run(["java", "-version"], capture_output=True, text=True).stderr
    first = out.splitlines()[0] if out else ""
    return first.split('"')[1] if '"' in first else "?"


def load_average():
    return Path("/proc/loadavg").read_text().split()[0]


# --- Main ------------------------------------------------------------------------------------


def main():
    started = time.monotonic()
    quick = bool(os.environ.get("BENCH_QUICK"))
    workers = int(os.environ.get("BENCH_PEERS_WORKERS", "16"))
    rounds = int(os.environ.get("BENCH_PEERS_ROUNDS", "1" if quick else "3"))
    seconds = float(os.environ.get("BENCH_PEERS_SECONDS", "3" if quick else "10"))
    settle = 0.5 if quick else 1.0
    warmup = 1.0 if quick else 5.0
    wanted = os.environ.get("BENCH_PEERS_ROWS", "")
    wanted = [w.strip() for w in wanted.split(",") if w.strip()]
    unknown = set(wanted) - {r.key for r in ROWS}
    if unknown:
        sys.exit(f"bench-peers: unknown rows {sorted(unknown)}; choose among "
                 f"{', '.join(r.key for r in ROWS)}")
    rows = [r for r in ROWS if not wanted or r.key in wanted]
    partial = quick or bool(wanted) or workers != 16
    redis_server = shutil.which(os.environ.get("REDIS_SERVER", "redis-server"))
    if not redis_server:
        sys.exit("bench-peers: no redis-server (set REDIS_SERVER)")

    packages = ensure_packages()
    pins = ensure_python_clients()
    module = lock_module()
    sys.path.insert(0, str(HERE))
    import services

    processes = services.Processes()

    def stop(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    workdir = Path(tempfile.mkdtemp(prefix="bench-peers-"))
    failed = True
    try:
        load_before = load_average()
        fsync_ms = services.fsync_probe(workdir)
        ports = services.free_ports(3 + 6 + 9)  # Redis 3; etcd 3 + 3; ZooKeeper 3 + 3 + 3

        def take(count):
            taken = ports[:count]
            del ports[:count]
            return taken

        say(f"starting the servers in {workdir}")
        setups = {}
        keys = {r.key for r in rows}
        if "module" in keys:
            setups["module"] = services.start_redis(processes, workdir, "alone", take(1),
                                                    redis_server, module)
        if keys & {"replica", "sync", "durable"}:
            setups["replica"] = setups["sync"] = setups["durable"] = services.start_redis(
                processes, workdir, "pair", take(2), redis_server, module)
        if "etcd" in keys:
            setups["etcd"] = services.start_etcd(processes, workdir, take(3), take(3))
        if "zookeeper" in keys:
            setups["zookeeper"] = services.start_zookeeper(processes, workdir, take(3), take(3),
                                                           take(3))
        for row in rows:
            row.setup = setups[row.key]
        rows_by_key = {r.key: r for r in rows}
        if "sync" in rows_by_key:
            rows_by_key["sync"].options = ["SYNC", "1", "1000"]
        if "durable" in rows_by_key:
            rows_by_key["durable"].options = ["SYNC", "1", "1000", "FSYNC", "1000"]
        if "etcd" in rows_by_key:
            rows_by_key["etcd"].options = 3600  # the TTL of each worker's lease, in seconds
        context = multiprocessing.get_context("fork")
        # Each run uses a lock of its own, so nothing of one run can hold up the next.
        say(f"warm-up: {warmup:.0f} s per row")
        for row in rows:
            run_round(row, workers, warmup, settle, f"/bench-peers/warmup-{row.key}", context)
        for n in range(rounds):
            order = rows if n % 2 == 0 else rows[::-1]
            for row in order:
                result = run_round(row, workers, seconds, settle,
                                   f"/bench-peers/round-{n}-{row.key}", context)
                row.rounds.append(result)
                say(f"round {n + 1}/{rounds}, {row.label}: {result.per_sec:.0f} critical "
                    f"sections/s, handoff p50 {result.p50_ms:.2f} ms "
                    f"({time.monotonic() - started:.0f} s)")
        elapsed = time.monotonic() - started
        header = (
            f"{len(rows)} setups on 127.0.0.1, one host with {os.cpu_count()} cores shared by "
            f"servers and workers (no pinning); {workers} worker processes on one lock, "
            f"{seconds:.0f} s per row and round, {rounds} round(s) interleaved, medians; "
            f"{elapsed:.0f} s in all; load average {load_before} before, {load_average()} "
            f"after. {versions(redis_server, pins, packages)}. A 4 KiB append + fsync in the "
            f"data directory took {fsync_ms:.2f} ms (median of 50)."
            + (" Quick or partial run: not for quoting." if partial else "")
        )
        text = results_section(rows, header)
        print()
        print(text)
        if partial:
            out = ROOT / "target" / "bench" / "peers.md"
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(text)
        else:
            out = ROOT / "bench" / "results.md"
            replace_block(out, BEGIN, END, text, append=True)
            if replace_block(ROOT / "README.md", README_BEGIN, README_END, readme_table(rows)):
                say("README.md: the table of \"Compared with etcd and ZooKeeper\" updated")
        say(f"written to {out.relative_to(ROOT)} ({elapsed:.0f} s)")
        failed = False
    except KeyboardInterrupt:
        say("interrupted; stopping the servers")
    finally:
        # A second Ctrl-C must not cut the cleanup short.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if failed:
            for server in processes.servers:
                if server.process.poll() is not None:
                    say(f"{server.name} had exited; the end of its log:\n{services.tail(server.log)}")
        processes.stop_all()
        shutil.rmtree(workdir, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
