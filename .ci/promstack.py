"""What tests/prometheus/run, .ci/ops (make ops-up, make ops-down) and tests/ops/run share: the
apt-get install of Debian's Prometheus packages with no service started, free loopback ports,
bounded polling, and Prometheus' HTTP API.

Import it with .ci on sys.path. Nothing here starts a long-running process.
"""

import json
import os
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
CONTRIB = os.path.join(ROOT, "contrib", "prometheus")

REDIS_SERVER = os.environ.get("REDIS_SERVER") or "redis-server"
REDIS_CLI = os.environ.get("REDIS_CLI") or "redis-cli"
PROMETHEUS = os.environ.get("PROMETHEUS") or "prometheus"
PROMTOOL = os.environ.get("PROMTOOL") or "promtool"
REDIS_EXPORTER = os.environ.get("REDIS_EXPORTER") or "prometheus-redis-exporter"
ALERTMANAGER = os.environ.get("ALERTMANAGER") or "prometheus-alertmanager"

# Program -> the Debian package that has it, and the service each package enables.
PACKAGES = {
    PROMETHEUS: "prometheus",
    PROMTOOL: "prometheus",
    REDIS_EXPORTER: "prometheus-redis-exporter",
    ALERTMANAGER: "prometheus-alertmanager",
}
SERVICES = {
    "prometheus": "prometheus.service",
    "prometheus-redis-exporter": "prometheus-redis-exporter.service",
    "prometheus-alertmanager": "prometheus-alertmanager.service",
}


class Failure(Exception):
    pass


class Died(Failure):
    """A process we started exited: no use waiting any longer."""


def run(args, **kwargs):
    """Runs a short command, bounded; returns its CompletedProcess."""
    kwargs.setdefault("timeout", 120)
    return subprocess.run(args, text=True, capture_output=True, **kwargs)


def poll(what, check, timeout, interval=0.2):
    """Calls check() until it returns a true value and returns that; fails after timeout s."""
    deadline = time.monotonic() + timeout
    last = None
    while True:
        try:
            result = check()
            if result:
                return result
        except Died:
            raise
        except (OSError, ValueError, Failure) as error:  # not up yet, or a half answer
            last = error
        if time.monotonic() > deadline:
            because = f" (last error: {last})" if last else ""
            raise Failure(f"timed out after {timeout}s waiting for {what}{because}")
        time.sleep(interval)


def install(programs, log):
    """apt-get installs the packages of `programs` (keys of PACKAGES) that are missing, as root
    on Debian, with no service started and the services disabled afterwards."""
    missing = sorted({PACKAGES[prog] for prog in programs if shutil.which(prog) is None})
    if not missing:
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise Failure(
            f"missing {', '.join(missing)}: on Debian, as root: "
            f"apt-get install --no-install-recommends {' '.join(missing)}"
            " (or set PROMETHEUS, PROMTOOL, REDIS_EXPORTER, ALERTMANAGER)"
        )
    # invoke-rc.d and deb-systemd-invoke ask /usr/sbin/policy-rc.d before starting a service;
    # 101 means "forbidden". For the length of the install, one that answers 101 is in place:
    # the machine's own when it already does (container images often ship one), else ours,
    # with the machine's own (if any) put back afterwards. (Seen here: with a policy that allows
    # starts and no systemd, the packages' init scripts start the daemons and then fail the
    # install.)
    policy = "/usr/sbin/policy-rc.d"
    denies = os.access(policy, os.X_OK) and run([policy, "prometheus", "start"]).returncode == 101
    saved = policy + ".lock-promstack"
    if not denies:
        if os.path.exists(policy):
            os.rename(policy, saved)
        with open(policy, "w") as f:
            f.write("#!/bin/sh\n# .ci/promstack.py's, for the length of an apt-get install.\n")
            f.write("exit 101\n")
        os.chmod(policy, 0o755)
    try:
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        log(f"apt-get install {' '.join(missing)} (services kept from starting)")
        result = run(["apt-get", "update", "-qq"], env=env, timeout=300)
        if result.returncode != 0:
            raise Failure(f"apt-get update failed:\n{result.stdout}{result.stderr}")
        install = ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing]
        result = run(install, env=env, timeout=600)
        if result.returncode != 0:
            raise Failure(f"apt-get install failed:\n{result.stdout}{result.stderr}")
    finally:
        if not denies:
            os.remove(policy)
            if os.path.exists(saved):
                os.rename(saved, policy)
    # The packages enable their services for the next boot: disable them (systemctl does it
    # offline too, SysV links included; without it, update-rc.d does the SysV links).
    for service in (SERVICES[pkg] for pkg in missing):
        if shutil.which("systemctl"):
            run(["systemctl", "disable", service])
        elif shutil.which("update-rc.d"):
            run(["update-rc.d", service.removesuffix(".service"), "disable"])


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_free(port):
    """True when nothing listens on 127.0.0.1:port (a bind as a server would do it succeeds)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def http_get(url, timeout=2):
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.read().decode()


def tail(path, lines=25):
    try:
        with open(path) as f:
            return "".join(f.readlines()[-lines:])
    except OSError:
        return ""


def redis_cli(port, *args):
    result = run([REDIS_CLI, "-h", "127.0.0.1", "-p", str(port), *args], timeout=10)
    if result.returncode != 0:
        raise Failure(f"redis-cli {' '.join(args)}: {result.stderr.strip()}")
    return result.stdout.strip()


def query(prom_port, expr):
    """An instant query through Prometheus' HTTP API: its result list."""
    url = f"http://127.0.0.1:{prom_port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    answer = json.loads(http_get(url))
    if answer.get("status") != "success":
        raise Failure(f"query {expr}: {answer}")
    return answer["data"]["result"]


def alert_list(prom_port):
    """Prometheus' alerts (pending and firing), as its /api/v1/alerts lists them."""
    answer = json.loads(http_get(f"http://127.0.0.1:{prom_port}/api/v1/alerts"))
    return answer["data"]["alerts"]


def alerts(prom_port):
    """{(alertname, state)} of Prometheus' alerts."""
    return {(a["labels"]["alertname"], a["state"]) for a in alert_list(prom_port)}


def start_time(pid):
    """The process' start time (field 22 of /proc/<pid>/stat, clock ticks since boot), or None
    when there is no such process or it is a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces: split after it.
    fields = stat[stat.rindex(")") + 2:].split()
    if fields[0] == "Z":
        return None
    return int(fields[19])


def exe(pid):
    """The program the process runs (/proc/<pid>/exe), or None."""
    try:
        return os.readlink(f"/proc/{pid}/exe").removesuffix(" (deleted)")
    except OSError:
        return None


def ours(entry):
    """True while the process .ci/ops up recorded in `entry` still runs: a process with that
    pid, start time and program. A reused pid has another start time. (Not its command line:
    redis-server rewrites that to its own title.)"""
    pid = entry["pid"]
    return start_time(pid) == entry["start"] and exe(pid) == entry["exe"]
