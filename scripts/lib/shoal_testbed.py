"""Shaped links for local clusters: network namespaces behind tbf-limited veth pairs.

A "hub" network namespace holds a Linux bridge; each node gets a namespace of its own, joined
to the bridge by a veth pair and addressed in 10.213.0.0/24. Nothing is added to the host's own
namespace. A node's link is shaped with a tbf qdisc in both directions: the egress of the
node's end is its upload, the egress of the hub's end its download (None: not shaped). The
kernel has tbf but no netem here, so links have bandwidth but no added delay (round trips stay
those of veth, tens of microseconds). Namespaces are named PREFIX-hub and PREFIX-NODE;
destroy() kills every process still in them and deletes them. Needs root and iproute2's `ip`
and `tc`.

Used by scripts/bench-wan (every node behind a profile's link) and scripts/soak --links (peers
and aggregators behind links the fault injector throttles).
"""

import ctypes
import os
import shutil
import signal
import subprocess

MBIT = 1e6 / 8  # bytes per second of 1 Mbit/s
CLONE_NEWNET = 0x40000000


def sh(*cmd):
    done = subprocess.run(list(cmd), capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {done.stderr.strip() or done.returncode}")
    return done.stdout


def missing():
    """Why a testbed cannot be made here ("" when it can)."""
    if os.geteuid() != 0:
        return "needs root (ip netns, tc)"
    if shutil.which("ip") is None or shutil.which("tc") is None:
        return "needs `ip` and `tc` (iproute2: scripts/bootstrap test)"
    return ""


def tbf(rate):
    """tc tbf arguments for `rate` bytes per second.

    burst: the bytes that may leave at once after the link idled. At least 64 KiB, so that one
    GSO/TSO packet (up to 64 KiB on veth) passes whole instead of being segmented by tbf, and at
    least 4 ms of the rate, one timer tick at HZ=250, so that the token bucket refills between
    ticks at the highest rates; at 5-100 Mbit/s 64 KiB is under 0.1 s of the link, so nearly
    every byte goes at the shaped rate (a 4 MiB upload probe is 1.5 % off at most).
    latency: the queue in front of the bucket, 100 ms of the rate: a home router's buffer is
    of that order, and a shorter one drops TCP's bursts and runs the link below its rate.
    """
    burst = max(64 << 10, int(rate * 0.004))
    return ["rate", f"{int(rate * 8)}bit", "burst", str(burst), "latency", "100ms"]


class Testbed:
    """The hub namespace with its bridge and one namespace per node behind a shaped veth."""

    def __init__(self, prefix):
        self.prefix = prefix
        self.hub = f"{prefix}-hub"
        self.namespaces = []  # created, in order
        self.nodes = {}  # node -> (namespace, address, upload, download)
        self.hub_ends = {}  # node -> its veth end in the hub

    def create(self):
        self.add_namespace(self.hub)
        sh("ip", "-n", self.hub, "link", "add", "br0", "type", "bridge")
        sh("ip", "-n", self.hub, "link", "set", "br0", "up")

    def add_namespace(self, ns):
        sh("ip", "netns", "add", ns)
        self.namespaces.append(ns)
        sh("ip", "-n", ns, "link", "set", "lo", "up")

    def add_node(self, node, host_index, upload, download):
        """NODE's namespace at 10.213.0.HOST_INDEX behind a link of `upload` and `download`
        bytes per second (None: that direction is not shaped)."""
        ns = f"{self.prefix}-{node}"
        address = f"10.213.0.{host_index}"
        self.add_namespace(ns)
        hub_end = f"v{host_index}"
        sh("ip", "-n", self.hub, "link", "add", hub_end, "type", "veth", "peer", "name", "eth0",
           "netns", ns)
        sh("ip", "-n", self.hub, "link", "set", hub_end, "master", "br0", "up")
        sh("ip", "-n", ns, "addr", "add", f"{address}/24", "dev", "eth0")
        sh("ip", "-n", ns, "link", "set", "eth0", "up")
        self.nodes[node] = (ns, address, upload, download)
        self.hub_ends[node] = hub_end
        self.set_rate(node, upload, download)

    def set_rate(self, node, upload, download):
        """Shapes NODE's link anew (None: that direction not shaped); the queued bytes go at the
        new rate."""
        ns, address, _, _ = self.nodes[node]
        for where, dev, rate in ((ns, "eth0", upload), (self.hub, self.hub_ends[node], download)):
            if rate is None:
                subprocess.run(["tc", "-n", where, "qdisc", "del", "dev", dev, "root"],
                               capture_output=True)
            else:
                sh("tc", "-n", where, "qdisc", "replace", "dev", dev, "root", "tbf", *tbf(rate))
        self.nodes[node] = (ns, address, upload, download)

    def enter(self, node):
        """Moves the calling thread into NODE's namespace: the sockets it opens and the processes
        it starts from then on are there (Python 3.11 has no os.setns)."""
        libc = ctypes.CDLL(None, use_errno=True)
        fd = os.open(f"/run/netns/{self.nodes[node][0]}", os.O_RDONLY)
        try:
            if libc.setns(fd, CLONE_NEWNET) != 0:
                err = ctypes.get_errno()
                raise OSError(err, f"setns into {self.nodes[node][0]}: {os.strerror(err)}")
        finally:
            os.close(fd)

    def destroy(self):
        """Kills what still runs in the namespaces (only this testbed's processes live there)
        and deletes them. Idempotent."""
        for ns in reversed(self.namespaces):
            pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True,
                                  text=True).stdout.split()
            for pid in pids:
                if int(pid) == os.getpid():
                    continue  # a caller that entered a node
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        self.namespaces = []
