"""The Python client (clients/python) against a real cluster over mutual TLS: a coordinator, an
aggregator and two peers of this build on 127.0.0.1 port 0. Creates a small MLP task from a YAML
file, follows it to completion, downloads its model and checks the MLP's shapes, and checks the
errors: NOT_FOUND for an unknown task, INVALID_ARGUMENT naming the field of a bad task file; runs
the example, clients/python/examples/train_and_evaluate.py.

Usage: /usr/bin/python3 client_cluster_test.py SOURCE_DIR BIN_DIR (Debian's python3-grpcio,
python3-protobuf, python3-numpy, python3-yaml).
"""

import hashlib
import os
import subprocess
import sys
import tempfile
import time
import unittest

SOURCE, BIN = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
os.environ["BUILD_DIR"] = os.path.dirname(BIN)
sys.path[:0] = [os.path.join(SOURCE, "clients", "python"), os.path.join(SOURCE, "scripts", "lib")]

import shoal_client  # noqa: E402
import shoal_cluster  # noqa: E402

TASK = """\
name: python-client
mode: federated-sync
model: mlp
dataset:
  partition: iid
  train_limit: 6000
  test_limit: 1000
round_batches: 10
rounds: 2
min_participants: 2
round_deadline_seconds: 20
seed: 7
"""
# The MLP of libs/training/models.cc: 784 -> 200 -> 10.
MLP_SHAPES = {"fc1.weight": (200, 784), "fc1.bias": (200,), "fc2.weight": (10, 200),
              "fc2.bias": (10,)}


class ClientClusterTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.work = tempfile.TemporaryDirectory(prefix="shoal-python-client-")
        work = cls.work.name
        cls.tls = os.path.join(work, "certs")
        cls.cluster = shoal_cluster.Cluster("client_cluster_test", work, tls_dir=cls.tls)
        try:
            cls.cluster.start_coordinator()
            cls.cluster.start_aggregator()
            for i in range(2):
                cls.cluster.start_peer(i, 2, wait=False)
            cls.cluster.wait_started()
        except BaseException:
            cls.cluster.stop()
            raise
        cls.cluster.security_flags("shoalctl")  # makes the client's certificate
        # The first address refuses connections: connect() moves on to the coordinator.
        cls.client = shoal_client.connect(["127.0.0.1:1", cls.cluster.coordinator],
                                          tls_dir=os.path.join(cls.tls, "shoalctl"))

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        cls.cluster.stop()
        cls.work.cleanup()

    def write(self, name, text):
        path = os.path.join(self.work.name, name)
        with open(path, "w") as f:
            f.write(text)
        return path

    def test_task_runs_to_its_model(self):
        status = self.client.create_task(self.write("task.yaml", TASK))
        self.assertEqual(status.spec.name, "python-client")
        self.assertEqual(status.spec.optimizer.learning_rate, 0.05)  # a default filled in
        self.assertIn("python-client", [t.spec.name for t in self.client.list_tasks()])
        deadline = time.monotonic() + 20
        while len(self.client.list_peers()) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        self.assertEqual(sorted(p.id for p in self.client.list_peers()), ["peer-0", "peer-1"])

        rounds = list(self.client.watch("python-client", timeout=60))
        self.assertEqual([r.round for r in rounds], [1, 2])
        self.assertTrue(all(r.participant_count == 2 for r in rounds), rounds)
        final = self.client.get_task("python-client")
        self.assertEqual(final.state, shoal_client.control_pb2.TASK_STATE_COMPLETED, final.message)

        state = self.client.download_model("python-client")
        self.assertEqual({name: a.shape for name, a in state.items()}, MLP_SHAPES)
        self.assertTrue(all(str(a.dtype) == "float32" for a in state.values()))
        first = self.client.download_model("python-client", version=1)
        self.assertEqual(list(first), list(MLP_SHAPES))
        self.assertFalse((first["fc1.weight"] == state["fc1.weight"]).all())
        self.assertEqual(self.client.stop_task("python-client").spec.name, "python-client")

    def test_example_trains_and_evaluates(self):
        # clients/python/examples/train_and_evaluate.py as its README runs it (with PyTorch,
        # python3-torch: the model loaded into a torch module and evaluated).
        example = os.path.join(SOURCE, "clients", "python", "examples", "train_and_evaluate.py")
        out = subprocess.run([sys.executable, example, "--coordinator", self.cluster.coordinator,
                              "--tls-dir", os.path.join(self.tls, "shoalctl")],
                             capture_output=True, text=True, timeout=120)
        self.assertEqual(out.returncode, 0, out.stderr)
        for line in ("round 3/3: 2 peers", "TASK_STATE_COMPLETED", "fc1.weight: 200x784",
                     "fc2.bias: 10", "accuracy of the downloaded model"):
            self.assertIn(line, out.stdout)

    def test_unknown_task_is_not_found(self):
        with self.assertRaises(shoal_client.ShoalError) as caught:
            self.client.get_task("no-such-task")
        self.assertEqual(caught.exception.code, "NOT_FOUND")
        with self.assertRaises(shoal_client.ShoalError) as caught:
            self.client.download_model("no-such-task")
        self.assertEqual(caught.exception.code, "NOT_FOUND")

    def test_bad_task_file_is_invalid_argument(self):
        # Refused by the coordinator, which names the field.
        bad = self.write("bad.yaml", "name: bad-task\noptimizer:\n  learning_rate: -1\n")
        with self.assertRaises(shoal_client.ShoalError) as caught:
            self.client.create_task(bad)
        self.assertEqual(caught.exception.code, "INVALID_ARGUMENT")
        self.assertIn("optimizer.learning_rate", caught.exception.message)
        # The coordinator's task-file reader (shoalctl's) refuses an unknown field or enum
        # value; the client's message names the file.
        for text, named in (("name: bad-task\nbatch: 3\n", "batch: unknown field"),
                            ("name: bad-task\nmode: federated\n", 'mode: unknown value')):
            with self.assertRaises(shoal_client.ShoalError) as caught:
                self.client.create_task(self.write("bad2.yaml", text))
            self.assertEqual(caught.exception.code, "INVALID_ARGUMENT")
            self.assertIn("bad2.yaml", caught.exception.message)
            self.assertIn(named, caught.exception.message)

    def test_the_coordinator_fills_every_default(self):
        # A mode's own defaults and a TorchScript model's digest, as shoalctl would send them.
        # Three participants needed, two peers here: the tasks never start.
        model = os.path.join(os.environ.get("SHOAL_TEST_MODELS", ""), "fashion_mlp.pt")
        path = self.write("defaults.yaml", "name: defaults\nmode: decentralized\n"
                          "min_participants: 3\nmodel: {torchscript: %s}\n" % model)
        status = self.client.create_task(path)
        self.assertEqual(status.spec.max_connection_retry, 3)  # decentralized's own default
        with open(model, "rb") as f:
            self.assertEqual(status.spec.torchscript.sha256, hashlib.sha256(f.read()).hexdigest())
        with self.assertRaises(shoal_client.ShoalError) as caught:
            self.client.delete_task("defaults")
        self.assertEqual(caught.exception.code, "FAILED_PRECONDITION")
        self.assertIn("stop it first", caught.exception.message)
        self.client.stop_task("defaults")
        self.client.delete_task("defaults")
        with self.assertRaises(shoal_client.ShoalError) as caught:
            self.client.get_task("defaults")
        self.assertEqual(caught.exception.code, "NOT_FOUND")

    def test_connect_errors(self):
        with self.assertRaises(shoal_client.ShoalError) as caught:
            shoal_client.connect("127.0.0.1:1", tls_dir=os.path.join(self.tls, "shoalctl"),
                                 timeout=5)
        self.assertEqual(caught.exception.code, "UNAVAILABLE")
        self.assertIn("127.0.0.1:1", caught.exception.message)
        with self.assertRaises(shoal_client.ShoalError) as caught:
            shoal_client.connect(self.cluster.coordinator, tls_dir=self.work.name)
        self.assertEqual(caught.exception.code, "NOT_FOUND")
        self.assertIn("ca.crt", caught.exception.message)
        # Plaintext to a TLS coordinator fails the first call.
        with self.assertRaises(shoal_client.ShoalError):
            shoal_client.connect(self.cluster.coordinator, insecure=True, timeout=2).list_tasks()


if __name__ == "__main__":
    start = time.monotonic()
    result = unittest.main(argv=[sys.argv[0], "-v"], exit=False).result
    print(f"client_cluster_test: {time.monotonic() - start:.1f} s")
    sys.exit(0 if result.wasSuccessful() else 1)
