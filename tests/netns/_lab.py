"""Hosts on one machine as Linux network namespaces (root and iproute2 needed).

Layout of one lab (every name carries this process's pid, so labs never collide):

    root namespace (pytest, the driver)  10.213.X.1  veth af<pid>d
          |
    af<pid>-sw   bridge br0, no address (the "switch")
          |-- af<pid>-n0  eth0 10.213.X.10
          |-- af<pid>-n1  eth0 10.213.X.11   ...

Only test-made addresses in 10.213.X.0/24 are used, with X chosen so that no
route or address of this machine already covers the subnet. Every interface
lives in (or is paired with one in) a lab namespace, so deleting the namespaces
removes the whole lab. ``cut(i)`` downs node i's port on the switch: its cable
is pulled, its processes keep running.
"""

from __future__ import annotations

import ipaddress
import os
import re
import shutil
import subprocess

PREFIX = "afnt"


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=20)
    if check and done.returncode != 0:
        raise RuntimeError(f"`ip {' '.join(args)}` failed: {done.stderr.strip()}")
    return done


def unavailable() -> str | None:
    """Why a lab cannot be built here, or None."""
    if os.geteuid() != 0:
        return "network namespaces need root (run the tests as root)"
    if shutil.which("ip") is None:
        return "`ip` is missing: apt-get install iproute2"
    probe = f"{PREFIX}{os.getpid()}-probe"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"`ip netns add` failed: {made.stderr.strip()}"
    veth = _ip("-n", probe, "link", "add", "probe0", "type", "veth", "peer", "name", "probe1", check=False)
    _ip("netns", "del", probe, check=False)
    if veth.returncode != 0:
        return f"veth pairs are unavailable (`ip link add ... type veth`): {veth.stderr.strip()}"
    return None


def remove_stale_labs() -> None:
    """Delete lab namespaces left by a test process that no longer exists."""
    listed = _ip("netns", "list", check=False).stdout
    for line in listed.splitlines():
        match = re.match(rf"^({PREFIX}(\d+)-\S+)", line)
        if match and not os.path.exists(f"/proc/{match.group(2)}"):
            _ip("netns", "del", match.group(1), check=False)


def _free_subnet() -> ipaddress.IPv4Network:
    taken = [
        ipaddress.ip_network(r.split()[0], strict=False)
        for r in _ip("-4", "route", "show", "table", "all").stdout.splitlines()
        if r and r.split()[0][0].isdigit()
    ]
    start = os.getpid() % 200
    for k in range(200):
        net = ipaddress.ip_network(f"10.213.{20 + (start + k) % 200}.0/24")
        if not any(net.overlaps(t) for t in taken if t.prefixlen > 0):
            return net
    raise RuntimeError("no free 10.213.x.0/24 subnet for the namespace lab")


class Lab:
    def __init__(self, num_nodes: int):
        tag = str(os.getpid())
        self.switch = f"{PREFIX}{tag}-sw"
        self.nodes = [f"{PREFIX}{tag}-n{i}" for i in range(num_nodes)]
        self.root_link = f"af{tag}d"[:15]
        net = _free_subnet()
        hosts = list(net.hosts())
        self.driver_address = str(hosts[0])
        self.addresses = [str(hosts[9 + i]) for i in range(num_nodes)]
        self._made: list[str] = []
        try:
            self._build(net.prefixlen)
        except BaseException:
            self.destroy()
            raise

    def _build(self, prefixlen: int) -> None:
        sw = self.switch
        _ip("netns", "add", sw)
        self._made.append(sw)
        _ip("-n", sw, "link", "add", "br0", "type", "bridge")
        _ip("-n", sw, "link", "set", "br0", "up")
        for i, (ns, address) in enumerate(zip(self.nodes, self.addresses)):
            _ip("netns", "add", ns)
            self._made.append(ns)
            _ip("-n", sw, "link", "add", f"p{i}", "type", "veth", "peer", "name", "eth0", "netns", ns)
            _ip("-n", sw, "link", "set", f"p{i}", "master", "br0", "up")
            _ip("-n", ns, "addr", "add", f"{address}/{prefixlen}", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")
        _ip("link", "add", self.root_link, "type", "veth", "peer", "name", "uplink", "netns", sw)
        _ip("-n", sw, "link", "set", "uplink", "master", "br0", "up")
        _ip("addr", "add", f"{self.driver_address}/{prefixlen}", "dev", self.root_link)
        _ip("link", "set", self.root_link, "up")

    def command(self, node: int, argv: list[str]) -> list[str]:
        """``argv`` run inside node ``node``'s namespace (same pid: ``ip netns exec`` execs)."""
        return ["ip", "netns", "exec", self.nodes[node], *argv]

    def cut(self, node: int) -> None:
        _ip("-n", self.switch, "link", "set", f"p{node}", "down")

    def restore(self, node: int) -> None:
        _ip("-n", self.switch, "link", "set", f"p{node}", "up")

    def destroy(self) -> None:
        """Delete the namespaces (the root veth goes with its peer in the switch)."""
        for ns in reversed(self._made):
            _ip("netns", "del", ns, check=False)
        self._made.clear()
        if _ip("link", "show", self.root_link, check=False).returncode == 0:
            _ip("link", "del", self.root_link, check=False)
