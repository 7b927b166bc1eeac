#!/usr/bin/env python3
"""The image and the compose cluster, for real, in a Docker engine of the test's own.

Usage: tests/docker/docker_test.py --source DIR --base DIR [--prebuilt DIR] [--reduced] [--keep]

  --source DIR    the repository (Dockerfile, docker-compose.yml)
  --base DIR      what scripts/docker-base made: bookworm-slim.tar and apt/
  --prebuilt DIR  a folder with the four binaries (and shoal-gen-certs) already built from this
                  tree (build/bin): the image's build stage takes them instead of installing
                  the -dev packages and compiling them again (the Dockerfile's PREBUILT
                  argument). Without it the image is built wholly from source, as
                  docs/tutorials/docker-compose.md says.
  --reduced     build the image and check one service's health only (no compose cluster)
  --keep        keep the work directory (logs, generated files) even when the test passes

Steps, each bounded by a deadline:
  1. start dockerd with its own --data-root, --exec-root, --pidfile and unix socket under a
     temporary directory, with --bridge=none --iptables=false --ip-forward=false, so it leaves
     the host's network configuration as it was (checked at the end);
  2. `docker import` the bookworm root file system as debian:bookworm-slim (only inside this
     engine) and serve the local apt repository on 127.0.0.1 (port 0);
  3. `docker build -t shoal:latest .` as docs/tutorials/docker-compose.md says, with --network
     host and APT_SOURCE pointing at that repository (with --prebuilt: from a copy of the build
     context that also holds the binaries); a Prometheus image from Debian's `prometheus`
     package (tests/docker/prometheus.Dockerfile);
  4. `docker-compose up -d` on docker-compose.yml turned into its host-network form (every
     container on 127.0.0.1: each container port of each service gets its own free port, and
     service names become 127.0.0.1); Grafana is left out (no Debian package, so no local image);
  5. every Shoal service healthy, the one-shot `task` service exits 0, `task watch` through the
     compose `shoalctl` service exits 0 when the task completes, every Prometheus target is up
     and the completed rounds are visible, `model get` writes a model file to stdout;
  6. `docker-compose down -v` leaves no container, volume or network of the project;
  7. dockerd stopped by its PID; the host's interfaces and ip_forward are as they were.
Exits 0 when everything held, 1 otherwise (with the tail of the relevant log).
"""

import argparse
import copy
import http.server
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

import yaml

PROJECT = "shoaltest"
# The compose file's one-shot `task` service creates /etc/shoal/tasks/$SHOAL_TASK.yaml. The test
# mounts this short task there: the image, the services and their wiring are what the default
# task uses, and the cluster tests check what training reaches. Its IID shards need every peer, so
# the task completes only if all four train.
TASK = "docker-smoke"
TASK_FILE = f"""# The container test's task (tests/docker/docker_test.py): a few short rounds.
name: {TASK}
mode: federated-sync
model: mlp
dataset: {{name: fashion-mnist, partition: iid, train_limit: 8000, test_limit: 2000}}
batch_size: 32
optimizer: {{kind: sgd, learning_rate: 0.05, momentum: 0.9}}
round_batches: 25
rounds: 4
min_participants: 4
max_participants: 4
round_deadline_seconds: 120
aggregation: mean
seed: 42
"""
BINARIES = ["shoal-coordinator", "shoal-aggregator", "shoal-peer", "shoalctl", "shoal-gen-certs"]
PREBUILT_IN_CONTEXT = "prebuilt/bin"
DAEMONS = ["coordinator", "aggregator-0", "aggregator-1", "peer-0", "peer-1", "peer-2", "peer-3"]

started = time.monotonic()


def log(text):
    print(f"[{time.monotonic() - started:6.1f}s] {text}", flush=True)


class Failure(Exception):
    pass


def tail(path, lines=30):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError:
        return ""


def wait_until(what, timeout, check, interval=1.0):
    """Calls check() until it returns a truthy value; Failure after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    last = None
    while True:
        try:
            result = check()
            if result:
                return result
        except Failure as e:
            last = str(e)
        if time.monotonic() >= deadline:
            raise Failure(f"{what}: not within {timeout:.0f} s" + (f" ({last})" if last else ""))
        time.sleep(interval)


_ports_given = set()


def free_port():
    """A free port on 127.0.0.1 below the kernel's ephemeral range.

    A port from bind(0) lies in the ephemeral range, where the kernel also picks the local ports
    of outgoing connections: a container connecting early (say the aggregator to the
    coordinator) could get the port a later container must listen on, and that one would fail
    to bind and restart for as long as the connection lasts."""
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        ephemeral_low = int(f.read().split()[0])
    low, high = 10000, max(10001, min(ephemeral_low, 65536))
    for _ in range(1000):
        port = random.randrange(low, high)
        if port in _ports_given:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _ports_given.add(port)
        return port
    raise Failure(f"no free port in [{low}, {high}) on 127.0.0.1")


def host_network_state():
    """What the test must leave as it found it: interface names and IPv4 forwarding."""
    with open("/proc/sys/net/ipv4/ip_forward") as f:
        forward = f.read().strip()
    return sorted(os.listdir("/sys/class/net")), forward


class Engine:
    """A dockerd of the test's own; stopped by its PID."""

    def __init__(self, work):
        self.dir = work
        self.sock = os.path.join(work, "docker.sock")
        self.pidfile = os.path.join(work, "dockerd.pid")
        self.log_path = os.path.join(work, "dockerd.log")
        self.env = dict(os.environ, DOCKER_HOST=f"unix://{self.sock}", SHOAL_TASK=TASK)
        self.proc = None

    def start(self):
        log("starting dockerd (own data-root, exec-root, pidfile and socket)")
        with open(self.log_path, "w") as out:
            self.proc = subprocess.Popen(
                ["dockerd", "--data-root", os.path.join(self.dir, "data"),
                 "--exec-root", os.path.join(self.dir, "exec"), "--pidfile", self.pidfile,
                 "-H", f"unix://{self.sock}", "--bridge=none", "--iptables=false",
                 "--ip6tables=false", "--ip-forward=false", "--ip-masq=false",
                 "--log-level=warn"],
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

        def ready():
            if self.proc.poll() is not None:
                raise Failure(f"dockerd exited with {self.proc.returncode}:\n{tail(self.log_path)}")
            return subprocess.run(["docker", "version"], env=self.env, capture_output=True,
                                  timeout=30).returncode == 0
        wait_until("dockerd answering on its socket", 60, ready, 0.5)

    def stop(self):
        if self.proc is None:
            return
        pid = self.proc.pid
        try:
            with open(self.pidfile) as f:
                pid = int(f.read().strip())
        except (OSError, ValueError):
            pass
        log(f"stopping dockerd (pid {pid})")
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            log("dockerd did not stop within 60 s; SIGKILL")
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)
        self.proc = None
        # dockerd leaves its netns bind mount behind; nothing of the test stays mounted.
        with open("/proc/self/mounts") as f:
            mounts = [line.split()[1] for line in f]
        for target in reversed(mounts):
            if target.startswith(self.dir + "/"):
                subprocess.run(["umount", "-l", target], check=False)

    def run(self, args, timeout, log_name=None, check=True, stdout=None):
        """Runs a docker/docker-compose command; its output goes to WORK/<log_name>.log."""
        log_path = os.path.join(self.dir, f"{log_name or args[0]}.log")
        with open(log_path, "a") as out:
            out.write(f"$ {' '.join(args)}\n")
            out.flush()
            try:
                done = subprocess.run(args, env=self.env, stdout=stdout or out,
                                      stderr=out, timeout=timeout)
            except subprocess.TimeoutExpired:
                raise Failure(f"`{' '.join(args)}` still runs after {timeout} s:\n{tail(log_path)}")
        if check and done.returncode != 0:
            raise Failure(f"`{' '.join(args)}` exited with {done.returncode}:\n{tail(log_path)}")
        return done

    def output(self, args, timeout=60):
        done = subprocess.run(args, env=self.env, capture_output=True, text=True, timeout=timeout)
        if done.returncode != 0:
            raise Failure(f"`{' '.join(args)}` exited with {done.returncode}: {done.stderr.strip()}")
        return done.stdout


class AptRepository:
    """Serves scripts/docker-base's flat apt repository on 127.0.0.1 (port 0)."""

    def __init__(self, directory):
        handler = lambda *a, **kw: QuietHandler(*a, directory=directory, **kw)
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=False)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.thread.join()
        self.server.server_close()

    @property
    def source(self):
        return f"deb [trusted=yes] http://127.0.0.1:{self.server.server_address[1]}/ ./"


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def host_network_compose(compose, source, prometheus_config):
    """docker-compose.yml with every container on the host's network, on 127.0.0.1.

    Returns (compose dict, {(service, container port): host port})."""
    services = compose["services"]
    # Each service its own copy: YAML anchors share one object between services (the `ha`
    # profile's coordinators share their health check), and each gets its own ports.
    for name in services:
        services[name] = copy.deepcopy(services[name])
    names = set(services)
    ports = {}

    def port_of(service, container_port):
        key = (service, int(container_port))
        if key not in ports:
            ports[key] = free_port()
        return ports[key]

    # HOST:PORT on its own, in a list or in a URL (http://etcd-0:2380, etcd://A:1,B:2/prefix).
    host_port = re.compile(r"(?P<lead>^|[/,=])(?P<host>[A-Za-z0-9.-]+):(?P<port>[0-9]+)(?=$|[/,])")

    def rewrite(service, arg):
        if arg.startswith("--") and "=" in arg:
            flag, value = arg.split("=", 1)
            return f"{flag}={rewrite(service, value)}"

        def replace(m):
            host = m.group("host")
            if host in ("0.0.0.0", "127.0.0.1", "localhost"):
                owner = service
            elif host in names:
                owner = host
            else:
                return m.group(0)
            return f"{m.group('lead')}127.0.0.1:{port_of(owner, m.group('port'))}"

        return host_port.sub(replace, arg)

    for name, s in services.items():
        s["network_mode"] = "host"
        s.pop("ports", None)
        s.pop("networks", None)
        for key in ("command", "entrypoint"):
            if isinstance(s.get(key), list):
                s[key] = [rewrite(name, a) for a in s[key]]
        health = s.get("healthcheck", {})
        if isinstance(health.get("test"), list):
            health["test"] = [rewrite(name, a) for a in health["test"]]
        volumes = []
        for v in s.get("volumes", []):
            if isinstance(v, str) and v.startswith("./"):
                v = os.path.join(source, v[2:])
            volumes.append(v)
        if volumes:
            s["volumes"] = volumes
        if "build" in s:
            dockerfile = s["build"].get("dockerfile") if isinstance(s["build"], dict) else None
            s["build"] = {"context": source, **({"dockerfile": dockerfile} if dockerfile else {})}

    # Prometheus: Debian's package in a local image, scraping the 127.0.0.1 ports.
    prom = services["prometheus"]
    prom["image"] = "shoal-test/prometheus:local"
    prom_port = port_of("prometheus", 9090)
    prom["command"] = ["--config.file=/etc/prometheus/prometheus.yml",
                       "--storage.tsdb.path=/prometheus",
                       f"--web.listen-address=127.0.0.1:{prom_port}"]
    prom["volumes"] = [f"{prometheus_config}:/etc/prometheus/prometheus.yml:ro"]
    # Grafana has no Debian package, so no local image: left out of the test's cluster.
    if "grafana" in services:
        services["grafana"]["profiles"] = ["grafana"]
        services["grafana"].pop("depends_on", None)
    return compose, ports


def host_network_prometheus_config(path, ports, out_path):
    with open(path) as f:
        config = yaml.safe_load(f)
    for job in config["scrape_configs"]:
        for static in job.get("static_configs", []):
            targets = []
            for t in static["targets"]:
                host, port = t.rsplit(":", 1)
                service = "prometheus" if host == "localhost" else host
                if (service, int(port)) not in ports:
                    raise Failure(f"{path}: target {t} is no port of any compose service")
                targets.append(f"127.0.0.1:{ports[(service, int(port))]}")
            static["targets"] = targets
    with open(out_path, "w") as f:
        yaml.safe_dump(config, f, sort_keys=False)


class ComposeTest:
    def __init__(self, args, work):
        self.args = args
        self.source = os.path.abspath(args.source)
        self.base = os.path.abspath(args.base)
        self.work = work
        self.engine = Engine(work)
        self.compose_file = os.path.join(work, "docker-compose.host.yml")
        self.ports = {}

    def compose(self, *args):
        return ["docker-compose", "-p", PROJECT, "-f", self.compose_file,
                "--project-directory", self.source, *args]

    def build_images(self, apt):
        log("docker import bookworm-slim.tar as debian:bookworm-slim")
        self.engine.run(["docker", "import", "--change", 'CMD ["bash"]',
                         os.path.join(self.base, "bookworm-slim.tar"), "debian:bookworm-slim"],
                        120, "import")
        context, extra = self.source, []
        if self.args.prebuilt:
            context = self.context_with_binaries()
            extra = ["--build-arg", f"PREBUILT={PREBUILT_IN_CONTEXT}"]
        log(f"docker build -t shoal:latest {' '.join(extra)} . (log: build.log)")
        t = time.monotonic()
        self.engine.run(["docker", "build", "--network", "host", "--build-arg",
                         f"APT_SOURCE={apt.source}", *extra, "-t", "shoal:latest", context],
                        2400, "build")
        size = self.engine.output(["docker", "image", "inspect", "-f", "{{.Size}}",
                                   "shoal:latest"]).strip()
        log(f"built shoal:latest in {time.monotonic() - t:.0f} s "
            f"({int(size) / 1e6:.0f} MB)")
        if self.args.reduced:
            return
        t = time.monotonic()
        self.engine.run(["docker", "build", "--network", "host", "--build-arg",
                         f"APT_SOURCE={apt.source}", "-t", "shoal-test/prometheus:local",
                         "-f", os.path.join(self.source, "tests/docker/prometheus.Dockerfile"),
                         os.path.join(self.source, "tests/docker")],
                        600, "build-prometheus")
        log(f"built shoal-test/prometheus:local in {time.monotonic() - t:.0f} s")

    def context_with_binaries(self):
        """A build context for --prebuilt: the source tree as .dockerignore leaves it, hard-linked
        where the file system allows, with the binaries under PREBUILT_IN_CONTEXT."""
        context = os.path.join(self.work, "context")
        top_ignored = shutil.ignore_patterns("build*", ".git", ".cache", "node_modules", "*.swp")
        nested_ignored = shutil.ignore_patterns("node_modules", "*.swp")

        def ignore(directory, names):
            if os.path.abspath(directory) == self.source:
                return top_ignored(directory, names)
            return nested_ignored(directory, names)

        def link_or_copy(src, dst):
            try:
                os.link(src, dst)
            except OSError:
                shutil.copy2(src, dst)

        shutil.copytree(self.source, context, ignore=ignore, copy_function=link_or_copy,
                        symlinks=True)
        binaries = os.path.join(context, PREBUILT_IN_CONTEXT)
        os.makedirs(binaries)
        for name in BINARIES:
            path = os.path.join(self.args.prebuilt, name)
            if not os.access(path, os.X_OK):
                raise Failure(f"--prebuilt {self.args.prebuilt}: {name} is missing or not "
                              "executable (build it first: scripts/build)")
            shutil.copy2(path, binaries)
        log(f"build context with the binaries of {self.args.prebuilt}: {context}")
        return context

    def one_service(self):
        """The reduced form: the image's default command (the coordinator) turns healthy."""
        port, metrics = free_port(), free_port()
        self.engine.run(["docker", "volume", "create", "shoaltest-certs"], 60, "run")
        self.engine.run(["docker", "run", "--rm", "-v", "shoaltest-certs:/certs",
                         "shoal:latest", "shoal-gen-certs", "/certs", "coordinator"], 120, "run")
        self.engine.run(["docker", "run", "-d", "--name", "shoaltest-coordinator",
                         "--network", "host", "-v", "shoaltest-certs:/certs:ro",
                         "--health-interval", "2s", "shoal:latest", "shoal-coordinator",
                         "--listen", f"127.0.0.1:{port}", "--metrics-listen",
                         f"127.0.0.1:{metrics}", "--state-dir", "/var/lib/shoal/state",
                         "--tls-dir", "/certs/coordinator"], 60, "run")
        wait_until("the coordinator container healthy", 120,
                   lambda: self.engine.output(["docker", "exec", "shoaltest-coordinator",
                                               "shoalctl", "health", "--target",
                                               f"127.0.0.1:{port}", "--tls-dir",
                                               "/certs/coordinator"]) is not None)
        log("coordinator container: SERVING")
        self.engine.run(["docker", "rm", "-f", "shoaltest-coordinator"], 60, "run")
        self.engine.run(["docker", "volume", "rm", "shoaltest-certs"], 60, "run")

    def write_compose(self):
        with open(os.path.join(self.source, "docker-compose.yml")) as f:
            compose = yaml.safe_load(f)
        prometheus_config = os.path.join(self.work, "prometheus.yml")
        compose, self.ports = host_network_compose(compose, self.source, prometheus_config)
        task_file = os.path.join(self.work, f"{TASK}.yaml")
        with open(task_file, "w") as f:
            f.write(TASK_FILE)
        os.chmod(task_file, 0o644)
        compose["services"]["task"].setdefault("volumes", []).append(
            f"{task_file}:/etc/shoal/tasks/{TASK}.yaml:ro")
        host_network_prometheus_config(
            os.path.join(self.source, "deploy/prometheus/prometheus.yml"), self.ports,
            prometheus_config)
        with open(self.compose_file, "w") as f:
            yaml.safe_dump(compose, f, sort_keys=False)
        self.engine.run(self.compose("config", "-q"), 60, "compose")

    def health(self, service):
        cid = self.engine.output(self.compose("ps", "-q", service)).strip()
        if not cid:
            return "missing"
        return self.engine.output(["docker", "inspect", "-f",
                                   "{{if .State.Health}}{{.State.Health.Status}}{{end}}/"
                                   "{{.State.Status}}/{{.State.ExitCode}}", cid]).strip()

    def cluster(self):
        self.write_compose()
        log("docker-compose up -d (log: compose.log)")
        self.engine.run(self.compose("up", "-d"), 600, "compose")

        def all_healthy():
            states = {s: self.health(s) for s in DAEMONS}
            bad = [f"{s}: {h}" for s, h in states.items() if not h.startswith("healthy/")]
            for s, h in states.items():
                if "/exited/" in h:
                    raise Failure(f"{s} exited ({h}):\n" +
                                  self.engine.output(self.compose("logs", "--tail", "20", s)))
            restarting = [s for s, h in states.items() if "/restarting/" in h]
            if restarting:  # its last words say why
                raise Failure(", ".join(bad) + "\n" + self.engine.output(
                    self.compose("logs", "--tail", "20", *restarting)))
            if bad:
                raise Failure(", ".join(bad))
            return True
        wait_until("every Shoal service healthy", 240, all_healthy, 2)
        log("every Shoal service is healthy: " + ", ".join(DAEMONS))

        def task_created():
            h = self.health("task")
            if h.endswith("/exited/0"):
                return True
            if "/exited/" in h:
                raise Failure(f"the task service failed ({h}):\n" +
                              self.engine.output(self.compose("logs", "task")))
            raise Failure(h)
        wait_until("the one-shot task service exits 0", 120, task_created, 1)
        log("the one-shot `task` service created the task")

        log(f"docker-compose run --rm shoalctl task watch {TASK}")
        t = time.monotonic()
        self.engine.run(self.compose("run", "--rm", "-T", "shoalctl", "task", "watch", TASK),
                        1200, "watch")
        watch = tail(os.path.join(self.work, "watch.log"), 40)
        if f"task {TASK} completed" not in watch or "final test accuracy" not in watch:
            raise Failure(f"task watch did not report completion:\n{watch}")
        accuracy = re.search(r"final test accuracy: ([0-9.]+)", watch).group(1)
        log(f"task completed in {time.monotonic() - t:.0f} s of watching; "
            f"final test accuracy {accuracy}")

        self.prometheus()

        model = os.path.join(self.work, "model.bin")
        with open(model, "wb") as out:
            self.engine.run(self.compose("run", "--rm", "-T", "shoalctl", "model", "get", TASK,
                                         "--out", "-"), 300, "model", stdout=out)
        with open(model, "rb") as f:
            magic = f.read(8)
        size = os.path.getsize(model)
        if magic != b"SHOALMDL" or size < 1000:
            raise Failure(f"model get wrote {size} bytes starting {magic!r}, not a model file")
        log(f"model get wrote a {size}-byte model file")

        log("docker-compose down -v")
        self.engine.run(self.compose("down", "-v"), 300, "compose")
        label = f"label=com.docker.compose.project={PROJECT}"
        left = (self.engine.output(["docker", "ps", "-aq", "--filter", label]).split() +
                self.engine.output(["docker", "volume", "ls", "-q", "--filter", label]).split() +
                self.engine.output(["docker", "network", "ls", "-q", "--filter", label]).split())
        if left:
            raise Failure(f"down -v left containers, volumes or networks behind: {left}")
        log("down -v removed every container, volume and network of the project")

    def prometheus(self):
        base = f"http://127.0.0.1:{self.ports[('prometheus', 9090)]}"

        def get(path):
            try:
                with urllib.request.urlopen(base + path, timeout=10) as r:
                    return json.load(r)
            except OSError as e:
                raise Failure(f"GET {path}: {e}")

        def targets_up():
            active = get("/api/v1/targets")["data"]["activeTargets"]
            down = [f"{t['labels']['job']} {t['scrapeUrl']}: {t['health']} {t['lastError']}"
                    for t in active if t["health"] != "up"]
            if len(active) != 8 or down:
                raise Failure(f"{len(active)} targets, not up: {down}")
            return True
        wait_until("every Prometheus target up", 60, targets_up, 2)

        def rounds_seen():
            result = get("/api/v1/query?query=shoal_coordinator_rounds_completed_total")
            values = [float(r["value"][1]) for r in result["data"]["result"]]
            if not values or max(values) < 1:
                raise Failure(f"shoal_coordinator_rounds_completed_total = {values}")
            return max(values)
        rounds = wait_until("completed rounds in Prometheus", 60, rounds_seen, 2)
        log(f"Prometheus: all 8 targets up, {rounds:.0f} completed rounds scraped")

    def run(self):
        before = host_network_state()
        try:
            self.engine.start()
            with AptRepository(os.path.join(self.base, "apt")) as apt:
                self.build_images(apt)
            if self.args.reduced:
                self.one_service()
            else:
                self.cluster()
        except Failure:
            if self.engine.proc is not None and not self.args.reduced:
                # Every container's output, kept with the work directory for the post-mortem.
                self.engine.run(self.compose("logs", "--no-color"), 120, "services", check=False)
            raise
        finally:
            if self.engine.proc is not None and not self.args.reduced:
                # Whatever happened, no container outlives the test.
                self.engine.run(self.compose("down", "-v", "--timeout", "5"), 300, "compose",
                                check=False)
            self.engine.stop()
        after = host_network_state()
        if before != after:
            raise Failure(f"the host's network changed: {before} -> {after}")
        log("dockerd stopped; the host's interfaces and ip_forward are as they were")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--source", required=True)
    parser.add_argument("--base", required=True)
    parser.add_argument("--prebuilt")
    parser.add_argument("--reduced", action="store_true")
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args()
    for needed in ("bookworm-slim.tar", "apt/Packages"):
        if not os.path.exists(os.path.join(args.base, needed)):
            print(f"docker_test: {args.base}/{needed} is missing; run scripts/docker-base "
                  f"--out {args.base}", file=sys.stderr)
            return 1
    for tool in ("dockerd", "docker", "docker-compose"):
        if shutil.which(tool) is None:
            print(f"docker_test: {tool} is not installed (scripts/bootstrap docker)",
                  file=sys.stderr)
            return 1
    # A short path: the engine's unix socket must fit in 108 bytes.
    work = tempfile.mkdtemp(prefix="shoal-docker-", dir="/tmp")
    ok = False
    try:
        ComposeTest(args, work).run()
        ok = True
    except Failure as e:
        log(f"FAILED: {e}")
    except subprocess.TimeoutExpired as e:
        log(f"FAILED: {e}")
    finally:
        if ok and not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            log(f"logs and generated files kept in {work}")
    log("PASSED" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
