"""Local Shoal clusters of real processes for the benchmarks (scripts/bench-*), Python 3's
standard library only.

    import sys, os
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))
    import shoal_cluster

    shoal_cluster.build("bench-x", ["shoal-coordinator", "shoal-aggregator", "shoal-peer",
                                    "shoalctl"])
    cluster = shoal_cluster.Cluster("bench-x", work_dir)
    try:
        cluster.start_coordinator()
        cluster.start_aggregator()
        for i in range(4):
            cluster.start_peer(i, 4)
        cluster.shoalctl("task", "create", task_file)
        ...
    finally:
        cluster.stop()

Every service listens on 127.0.0.1 port 0, plaintext (--insecure) or, with Cluster(...,
tls_dir=DIR), mutual TLS with certificates scripts/gen-certs makes in DIR (DIR/NAME for each
service, DIR/shoalctl for shoalctl and other clients), writes its addresses to
WORK/NAME.addr and logs to WORK/NAME.log; the cluster waits for each address file, and a service
that exits first ends the bench (SystemExit naming it and its log); start(..., wait=False) and
wait_started() start several at once. stop() sends SIGTERM to the services in the reverse order
of their start (peers before aggregators before the coordinator) and SIGKILLs what is left after
15 s. A static gossip worker (shoal-peer --dpwa-config, no
coordinator) starts with spawn(). restart(NAME) starts a service that was killed again with the
same flags on the same gRPC address, its log appended to (scripts/soak, bench-failover), and
poll_started(NAME) says whether it is up without waiting. start_etcd(members=N) starts an etcd
cluster of N members; restart_etcd(NAME) starts a killed member again on its ports and data, and
etcd_healthy(NAME) asks a member's /health.

With Cluster(..., netns={NAME: (NAMESPACE, HOST)}) the service NAME (and shoalctl, under the name
"shoalctl") runs under `ip netns exec NAMESPACE` and listens on HOST port 0 instead of 127.0.0.1
(scripts/bench-wan: every node in a network namespace of its own, behind a shaped link), and
Cluster(..., host=HOST) has the other services listen on HOST (scripts/soak --links: the
coordinators on the address of the namespace the soak itself entered; etcd stays on that
namespace's 127.0.0.1). Cluster.affinity[NAME] = {CPU, ...} before its start runs NAME on
those CPUs only (scripts/bench-wan --elections: a peer with half the others' compute).

Environment: BUILD_DIR (default: build), SHOAL_DATA_DIR (default:
/usr/share/datasets/fashion-mnist).
"""

import base64
import datetime
import glob
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.environ.get("BUILD_DIR", os.path.join(ROOT, "build"))
BIN = os.path.join(BUILD, "bin")
DATA = os.environ.get("SHOAL_DATA_DIR", "/usr/share/datasets/fashion-mnist")


# The schedule the benches that train the default task's CNN measured their figures with (SGD at
# 0.05, momentum 0.9). The default task itself trains with Adam (fewer rounds to the same
# accuracy, for the demo); the benches keep SGD so that their figures stay comparable.
BENCH_OPTIMIZER = "optimizer:\n  kind: sgd\n  learning_rate: 0.05\n  momentum: 0.9\n"


def with_bench_optimizer(task_text):
    """`task_text` (a task file's YAML) with its optimizer section replaced by BENCH_OPTIMIZER."""
    out, n = re.subn(r"^optimizer:\n(?:[ ]{2}.*\n)+", BENCH_OPTIMIZER, task_text, flags=re.M)
    if n != 1:
        sys.exit("shoal_cluster: the task file has no optimizer section to replace")
    return out


def decentralized_log_times(work):
    """What the peers of a decentralized task logged in WORK/peer-*.log: (train, exchange,
    ready_at, holding_at), each a dict by round: the peers' training times (s), the peers'
    exchanges (StartSharing -> holding the average at that peer, s), the time of the last
    peer's RoundReady and that of the last peer holding the average (Unix seconds, from the log
    lines' timestamps). holding_at[r] - ready_at[r] is the round's protocol time: its exchange
    without the wait for the slowest trainer."""
    train, exchange = {}, {}
    ready_at, holding_at = {}, {}

    def ts(s):
        return datetime.datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp()

    for log in glob.glob(os.path.join(work, "peer-*.log")):
        for line in open(log):
            # Plain rounds end the line with the time; secure ones add what happens next.
            m = re.search(r"round (\d+): trained \d+ batches, .* ([0-9.]+) s(?:;.*)?$", line)
            if m:
                r, t = int(m.group(1)), ts(line.split()[0])
                train.setdefault(r, []).append(float(m.group(2)))
                ready_at[r] = max(ready_at.get(r, t), t)
            m = re.search(r"round (\d+) attempt \d+: aggregated \d+ (?:masked )?updates .* in "
                          r"([0-9.]+) s, digest", line)
            if m:
                r, t = int(m.group(1)), ts(line.split()[0])
                exchange.setdefault(r, []).append(float(m.group(2)))
                holding_at[r] = max(holding_at.get(r, t), t)
    return train, exchange, ready_at, holding_at


def use_build_dir(path):
    """Takes the binaries from `path` (and builds into it) instead of BUILD_DIR's."""
    global BUILD, BIN
    BUILD = path
    BIN = os.path.join(BUILD, "bin")


def build(prog, targets):
    """Builds `targets` with scripts/build into BUILD_DIR (its output hidden unless it fails)."""
    env = dict(os.environ, SHOAL_BUILD_DIR=BUILD)
    done = subprocess.run([os.path.join(ROOT, "scripts", "build"), "--target"] + list(targets),
                          env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if done.returncode != 0:
        sys.stderr.write(done.stdout[-4000:])
        sys.exit(f"{prog}: scripts/build --target {' '.join(targets)} failed")


def free_port():
    """A TCP port of 127.0.0.1 free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def read_address_file(path):
    """{"grpc": HOST:PORT, "metrics": HOST:PORT, ...} of an --address-file ({} while absent)."""
    try:
        with open(path) as f:
            return dict(line.strip().split("=", 1) for line in f if "=" in line)
    except FileNotFoundError:
        return {}


class Cluster:
    """The processes of one local cluster, started in order; see the module's doc."""

    def __init__(self, prog, work, tls_dir=None, netns=None, host="127.0.0.1"):
        self.prog = prog  # the bench's name, the prefix of its errors
        self.work = work
        self.tls_dir = tls_dir  # None: plaintext
        self.netns = dict(netns or {})  # name -> (network namespace, listen host)
        self.host = host  # where the services outside `netns` listen
        self.procs = []  # (name, Popen), in start order
        self.addresses = {}  # name -> the entries of its address file
        self.starting = {}  # name -> (Popen, address file) until its address file is there
        self.coordinator = None  # the coordinator's gRPC HOST:PORT
        self.commands = {}  # name -> (binary, args after the listen flags) for restart()
        self.etcd = {}  # etcd member name -> (its command, its client URL)
        self.affinity = {}  # name -> the CPUs its processes may run on (absent: every CPU)
        os.makedirs(work, exist_ok=True)

    def log_path(self, name):
        return os.path.join(self.work, name + ".log")

    def spawn(self, name, binary, args, append=False):
        """Starts BIN/binary with `args` (nothing added), logging to WORK/NAME.log (appended to
        with `append`)."""
        cpus = self.affinity.get(name)
        with open(self.log_path(name), "a" if append else "w") as log:
            proc = subprocess.Popen(self.in_netns(name) + [os.path.join(BIN, binary)] + list(args),
                                    stdout=log, stderr=subprocess.STDOUT,
                                    preexec_fn=(lambda: os.sched_setaffinity(0, cpus))
                                    if cpus else None)
        self.procs.append((name, proc))
        return proc

    def proc(self, name):
        """The Popen of NAME's newest start (None when it never started)."""
        started = [p for n, p in self.procs if n == name]
        return started[-1] if started else None

    def in_netns(self, name):
        """The command prefix that runs NAME in its network namespace ([] when it has none)."""
        return ["ip", "netns", "exec", self.netns[name][0]] if name in self.netns else []

    def start(self, name, binary, args, wait=True):
        """Starts a service on HOST:0 (its netns host with netns; plaintext, or mutual TLS
        with tls_dir) and, with `wait`, waits for its address file (else wait_started() does, so
        that several start at once); returns its Popen."""
        host = self.netns[name][1] if name in self.netns else self.host
        self.commands[name] = (binary, list(args))
        return self.launch(name, f"{host}:0", wait, append=False)

    def restart(self, name, wait=True):
        """Starts NAME again as start() last started it, on the gRPC address it had (so that the
        coordinator and its peers find it where it was; its metrics port is a new one), its log
        appended to; with `wait`, waits for its address file. The old process must be gone
        (killed and reaped). Returns the new Popen."""
        return self.launch(name, self.addresses[name]["grpc"], wait, append=True)

    def launch(self, name, listen, wait, append):
        binary, args = self.commands[name]
        addr = os.path.join(self.work, name + ".addr")
        if os.path.exists(addr):
            os.remove(addr)
        host = listen.rsplit(":", 1)[0]
        proc = self.spawn(name, binary, self.security_flags(name) + ["--listen", listen,
                                         "--metrics-listen", f"{host}:0", "--address-file",
                                         addr] + args, append)
        self.starting[name] = (proc, addr)
        if wait:
            self.wait_started()
        return proc

    def security_flags(self, name):
        """["--insecure"], or ["--tls-dir", TLS_DIR/NAME] with NAME's certificate made first."""
        if self.tls_dir is None:
            return ["--insecure"]
        if not os.path.isfile(os.path.join(self.tls_dir, name, "tls.key")):
            done = subprocess.run([os.path.join(ROOT, "scripts", "gen-certs"), self.tls_dir, name],
                                  capture_output=True, text=True)
            if done.returncode != 0:
                sys.exit(f"{self.prog}: scripts/gen-certs {self.tls_dir} {name} failed: "
                         f"{done.stderr.strip()}")
        return ["--tls-dir", os.path.join(self.tls_dir, name)]

    def wait_started(self, timeout=60):
        """Waits until every service started has written its address file (into addresses)."""
        deadline = time.time() + timeout
        while self.starting:
            for name, (proc, addr) in list(self.starting.items()):
                if proc.poll() is not None:
                    sys.exit(f"{self.prog}: {name} exited with {proc.returncode} "
                             f"(see {self.log_path(name)})")
                fields = read_address_file(addr)
                if "grpc" in fields:
                    self.addresses[name] = fields
                    del self.starting[name]
            if self.starting and time.time() > deadline:
                sys.exit(f"{self.prog}: {', '.join(self.starting)} wrote no address file within "
                         f"{timeout} s (see {self.work})")
            time.sleep(0.05)

    def poll_started(self, name):
        """Whether NAME has written its address file since its last (re)start, without waiting
        (for a restart(..., wait=False) watched among other work)."""
        if name in self.starting:
            fields = read_address_file(self.starting[name][1])
            if "grpc" not in fields:
                return False
            self.addresses[name] = fields
            del self.starting[name]
        return True

    def start_etcd(self, name="etcd", members=1):
        """`members` etcd members forming one cluster (Debian's etcd-server, or $SHOAL_ETCD),
        each on two free 127.0.0.1 ports, with its data in WORK/NAME-I and its log in
        WORK/NAME-I.log (WORK/NAME and WORK/NAME.log for one member); returns their client
        HOST:PORTs as a comma list (for a coordinator's --store etcd://A,B,C/PREFIX). Each keeps a
        minute of history (periodic auto-compaction), snapshots every thousand Raft entries and runs
        Raft's pre-vote, so that a member that restarts does not force an election on a cluster
        that has a leader."""
        etcd = os.environ.get("SHOAL_ETCD") or shutil.which("etcd")
        if not etcd:
            sys.exit(f"{self.prog}: no etcd on PATH (Debian's etcd-server)")
        names = [name] if members == 1 else [f"{name}-{i}" for i in range(members)]
        clients = {n: free_port() for n in names}
        peers = {n: free_port() for n in names}
        initial = ",".join(f"{n}=http://127.0.0.1:{peers[n]}" for n in names)
        for n in names:
            client_url = f"http://127.0.0.1:{clients[n]}"
            peer_url = f"http://127.0.0.1:{peers[n]}"
            command = [etcd, "--name", n, "--data-dir", os.path.join(self.work, n),
                       "--listen-client-urls", client_url, "--advertise-client-urls", client_url,
                       "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
                       "--initial-cluster", initial, "--log-level", "warn",
                       # A minute of history: what a coordinator needs is the newest revision.
                       "--auto-compaction-mode", "periodic", "--auto-compaction-retention", "1m",
                       # Raft entries stay in memory until a snapshot: every 100,000 by default,
                       # hours of a soak's writes. Every thousand (and the 5,000 etcd keeps for
                       # followers to catch up) keeps a member's memory flat within minutes.
                       "--snapshot-count", "1000",
                       # A member that comes back does not depose a working leader.
                       "--pre-vote"]
            self.etcd[n] = (command, client_url)
            self.spawn_etcd(n, append=False)
        return ",".join(f"127.0.0.1:{clients[n]}" for n in names)

    def spawn_etcd(self, name, append):
        with open(self.log_path(name), "a" if append else "w") as log:
            proc = subprocess.Popen(self.etcd[name][0], stdout=log, stderr=subprocess.STDOUT)
        self.procs.append((name, proc))
        return proc

    def restart_etcd(self, name):
        """Starts the etcd member NAME (killed and reaped) again with its flags, ports and data
        directory, its log appended to; it rejoins its cluster. Returns the new Popen."""
        return self.spawn_etcd(name, append=True)

    def etcd_healthy(self, name, timeout=1.0):
        """Whether the etcd member NAME answers /health with "true" (it serves, with a leader)."""
        try:
            with urllib.request.urlopen(self.etcd[name][1] + "/health", timeout=timeout) as r:
                return json.loads(r.read()).get("health") == "true"
        except (OSError, ValueError):
            return False

    def etcd_keys(self, name, prefix, timeout=2.0):
        """The keys under `prefix` the etcd member NAME holds (None when it does not answer),
        through etcd's JSON gateway."""
        end = bytearray(prefix.encode())
        end[-1] += 1
        body = json.dumps({"key": base64.b64encode(prefix.encode()).decode(),
                           "range_end": base64.b64encode(bytes(end)).decode(),
                           "keys_only": True}).encode()
        try:
            with urllib.request.urlopen(self.etcd[name][1] + "/v3/kv/range", data=body,
                                        timeout=timeout) as r:
                kvs = json.loads(r.read()).get("kvs") or []
                return [base64.b64decode(kv["key"]).decode(errors="replace") for kv in kvs]
        except (OSError, ValueError, KeyError):
            return None

    def start_coordinator(self, args=()):
        self.start("coordinator", "shoal-coordinator",
                   ["--state-dir", os.path.join(self.work, "state")] + list(args))
        self.coordinator = self.addresses["coordinator"]["grpc"]

    def start_aggregator(self, name="aggregator"):
        self.start(name, "shoal-aggregator", ["--coordinator", self.coordinator])

    def start_peer(self, index, count, binary="shoal-peer", args=(), wait=True):
        """Peer `index` of `count` (id peer-INDEX, shard INDEX/COUNT of DATA); `binary` may be
        the peer's test build, shoal-peer-testing, for its --test-* flags. Returns its Popen."""
        return self.start(f"peer-{index}", binary,
                          ["--coordinator", self.coordinator, "--data-dir", DATA,
                           "--shard", f"{index}/{count}", "--name", f"peer-{index}"] + list(args),
                          wait)

    def shoalctl(self, *args, coordinator=None):
        """shoalctl's stdout, asking `coordinator` (default: the cluster's coordinator list);
        RuntimeError with its stderr when it fails."""
        out = subprocess.run(self.in_netns("shoalctl") + [os.path.join(BIN, "shoalctl")] +
                             self.security_flags("shoalctl") +
                             ["--coordinator", coordinator or self.coordinator] + list(args),
                             capture_output=True, text=True)
        if out.returncode != 0:
            raise RuntimeError(out.stderr.strip())
        return out.stdout

    def stop(self):
        """SIGTERM in reverse start order, then waits (SIGKILL after 15 s). Idempotent."""
        for _, p in reversed(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for _, p in reversed(self.procs):
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
