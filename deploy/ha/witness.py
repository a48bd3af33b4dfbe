"""The death witness: a leader the container runtime reports dead gives up Patroni's lock at once.

Patroni replaces a leader when its lock expires, ttl seconds after the last
renewal, and accepts no ttl below 20 s: a leader whose machine died holds
writes up for 20 s before anyone may be promoted, though nothing of it runs.
Fencing is what lets a cluster manager act sooner (Pacemaker promotes once
STONITH confirms; CloudNativePG once Kubernetes reports the pod gone). Here
the confirmation is Docker's: a member's container that is not running has
no process left (Patroni is its PID 1, PostgreSQL its child, and the
container's death ends its PID namespace), so it can acknowledge nothing, and
its lock only keeps the others waiting. The witness then deletes the leader
key, on the condition that it still holds the member's name at the revision
that was read (an etcd v3 transaction): a lock renewed or taken by anyone
since is left alone. Patroni's members watch that key and elect at once.

What it never does: act on a member that is running. A frozen (SIGSTOP,
`docker pause`) or cut-off leader is alive and may still hold sessions; only
its lock's expiry, as Patroni decides, replaces it. So the witness can only
make a failover sooner, never make one that Patroni would not have made, and
when it is down the cluster fails over as without it, after ttl.

Standard library only (it runs on the deployment's Python base image): the
Docker Engine API over its Unix socket, etcd's v3 JSON gateway over HTTP.
Settings from the environment: WITNESS_ETCD_HOSTS (host:port,...),
WITNESS_LEADER_KEY (Patroni's namespace + scope + /leader), WITNESS_MEMBERS
(the member names, which are also the compose services' names),
WITNESS_INTERVAL (seconds between looks, default 0.5), DOCKER_SOCKET.
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import socket
import sys
import time
import urllib.parse
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Leader:
    """Who holds the leader key, and at which etcd revision it was last written."""

    member: str
    mod_revision: int


@dataclass(frozen=True)
class Container:
    """What Docker says of a member's container."""

    status: str  # created, running, paused, restarting, removing, exited, dead
    running: bool
    pid: int


def dead_reason(container: Container | None) -> str | None:
    """Why this member can no longer write, or None while it may.

    Only a container with no process counts: running and paused ones may
    still hold sessions (a paused one resumes where it stopped). A member
    with no container at all was removed, its processes with it.
    """
    if container is None:
        return "its container is gone"
    if container.running or container.status == "paused" or container.pid != 0:
        return None
    return f"its container is {container.status}"


class UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("docker", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self._path)


class Docker:
    def __init__(self, socket_path: str) -> None:
        self._socket = socket_path

    def get(self, path: str) -> tuple[int, Any]:
        connection = UnixHTTPConnection(self._socket, timeout=5)
        try:
            connection.request("GET", path)
            response = connection.getresponse()
            body = response.read()
        finally:
            connection.close()
        return response.status, json.loads(body) if body else None

    def project(self) -> str:
        """The compose project this witness belongs to (its own container's label)."""
        status, me = self.get(f"/containers/{socket.gethostname()}/json")
        if status != 200:
            raise RuntimeError(
                f"cannot inspect this container ({status}): is {self._socket} mounted?"
            )
        return str(me["Config"]["Labels"]["com.docker.compose.project"])

    def member(self, project: str, service: str) -> Container | None:
        labels = [f"com.docker.compose.project={project}", f"com.docker.compose.service={service}"]
        query = urllib.parse.urlencode({"all": "1", "filters": json.dumps({"label": labels})})
        status, found = self.get(f"/containers/json?{query}")
        if status != 200:
            raise RuntimeError(f"Docker answered {status} listing {service}'s containers")
        if not found:
            return None
        status, state = self.get(f"/containers/{found[0]['Id']}/json")
        if status == 404:
            return None
        if status != 200:
            raise RuntimeError(f"Docker answered {status} inspecting {service}")
        s = state["State"]
        return Container(status=s["Status"], running=bool(s["Running"]), pid=int(s["Pid"]))


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


class Etcd:
    """etcd's v3 API through its JSON gateway (/v3/kv/...), trying each host in turn."""

    def __init__(self, hosts: list[str]) -> None:
        self._hosts = hosts

    def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        errors = []
        for host in self._hosts:
            name, _, port = host.partition(":")
            connection = http.client.HTTPConnection(name, int(port or 2379), timeout=2)
            try:
                connection.request(
                    "POST", path, json.dumps(body), {"Content-Type": "application/json"}
                )
                response = connection.getresponse()
                data = response.read()
                if response.status == 200:
                    answer: dict[str, Any] = json.loads(data)
                    return answer
                errors.append(f"{host}: HTTP {response.status} {data[:200]!r}")
            except OSError as error:
                errors.append(f"{host}: {error}")
            finally:
                connection.close()
        raise RuntimeError("no etcd member answered: " + "; ".join(errors))

    def leader(self, key: str) -> Leader | None:
        found = self.post("/v3/kv/range", {"key": _b64(key)})
        kvs = found.get("kvs") or []
        if not kvs:
            return None
        kv = kvs[0]
        return Leader(base64.b64decode(kv["value"]).decode(), int(kv["mod_revision"]))

    def release(self, key: str, leader: Leader) -> bool:
        """Delete the key if it still names this member at this revision; True if it did."""
        answer = self.post(
            "/v3/kv/txn",
            {
                "compare": [
                    {"key": _b64(key), "target": "MOD", "result": "EQUAL",
                     "mod_revision": str(leader.mod_revision)},
                    {"key": _b64(key), "target": "VALUE", "result": "EQUAL",
                     "value": _b64(leader.member)},
                ],
                "success": [{"request_delete_range": {"key": _b64(key)}}],
            },
        )  # fmt: skip
        return bool(answer.get("succeeded"))


def log(message: str) -> None:
    print(time.strftime("%Y-%m-%dT%H:%M:%S"), message, flush=True)


def watch(
    etcd: Etcd, docker: Docker, project: str, key: str, members: set[str], every: float
) -> None:
    released = 0
    trouble: str | None = None
    while True:
        try:
            leader = etcd.leader(key)
            if leader is not None and leader.member in members:
                reason = dead_reason(docker.member(project, leader.member))
                if reason is not None and etcd.release(key, leader):
                    released += 1
                    log(f"released the leader lock of {leader.member}: {reason} "
                        f"(revision {leader.mod_revision}; {released} released so far)")  # fmt: skip
            if trouble is not None:
                log("etcd and Docker answer again")
                trouble = None
        except (OSError, RuntimeError, ValueError, KeyError) as error:
            # Said once per outage, not every half second: while it lasts the
            # cluster fails over as it would without a witness, after ttl.
            if str(error) != trouble:
                log(f"cannot look (failover falls back to Patroni's ttl): {error}")
                trouble = str(error)
        time.sleep(every)


def main() -> int:
    hosts = [h.strip() for h in os.environ.get("WITNESS_ETCD_HOSTS", "").split(",") if h.strip()]
    key = os.environ.get("WITNESS_LEADER_KEY", "")
    members = {m.strip() for m in os.environ.get("WITNESS_MEMBERS", "").split(",") if m.strip()}
    if not hosts or not key or not members:
        print("set WITNESS_ETCD_HOSTS, WITNESS_LEADER_KEY and WITNESS_MEMBERS", file=sys.stderr)
        return 2
    every = float(os.environ.get("WITNESS_INTERVAL", "0.5"))
    docker = Docker(os.environ.get("DOCKER_SOCKET", "/var/run/docker.sock"))
    project = docker.project()
    log(f"watching {key} for {', '.join(sorted(members))} of compose project {project}")
    watch(Etcd(hosts), docker, project, key, members, every)
    return 0


if __name__ == "__main__":
    sys.exit(main())
