"""shoal_client without a coordinator: task files to TaskSpec (friendly enums, defaults, a
TorchScript file's digest, errors naming the file and field) and the decoding of model streams
(shapes, and streams that do not add up or whose digests do not match).

Usage: /usr/bin/python3 client_unit_test.py SOURCE_DIR
"""

import hashlib
import os
import sys
import tempfile
import time
import unittest

import numpy as np
import xxhash

sys.path.insert(0, os.path.join(os.path.abspath(sys.argv[1]), "clients", "python"))

import shoal_client  # noqa: E402
from shoal_client._gen.shoal.common.v1 import model_pb2, task_pb2, tensor_pb2  # noqa: E402


def stream(tensors, num_tensors=None, cut=0, flip=None):
    """A model stream of {name: float32 array}, each tensor's payload in two chunks and its
    XXH3-64 digest in its header; `cut` bytes are left off the last tensor; the first byte of
    tensor `flip` is changed after its digest was taken."""
    chunks = [model_pb2.ModelChunk(meta=model_pb2.ModelMeta(
        task="t", version=3, num_tensors=len(tensors) if num_tensors is None else num_tensors))]
    for name, array in tensors.items():
        data = array.astype("<f4").tobytes()
        chunks.append(model_pb2.ModelChunk(frame=tensor_pb2.TensorFrame(
            header=tensor_pb2.TensorHeader(name=name, dtype=tensor_pb2.DTYPE_FLOAT32,
                                           shape=array.shape, encoding=tensor_pb2.ENCODING_RAW,
                                           size_bytes=len(data),
                                           digest_xxh3=xxhash.xxh3_64_intdigest(data)))))
        if name == flip:
            data = bytes([data[0] ^ 1]) + data[1:]
        half = len(data) // 2
        for part in (data[:half], data[half:]):
            chunks.append(model_pb2.ModelChunk(frame=tensor_pb2.TensorFrame(chunk=part)))
    if cut:
        last = chunks[-1].frame.chunk
        chunks[-1] = model_pb2.ModelChunk(frame=tensor_pb2.TensorFrame(chunk=last[:-cut]))
    return chunks


class TaskFileTest(unittest.TestCase):
    def test_friendly_enums_and_defaults(self):
        spec = shoal_client.load_task({"name": "t", "mode": "federated-async",
                                       "dataset": {"partition": "label-skew"},
                                       "optimizer": {"kind": "OPTIMIZER_ADAM"}})
        self.assertEqual(spec.mode, task_pb2.MODE_FEDERATED_ASYNC)
        self.assertEqual(spec.dataset.partition, task_pb2.PARTITION_LABEL_SKEW)
        self.assertEqual(spec.dataset.classes_per_shard, 2)
        self.assertEqual(spec.optimizer.kind, task_pb2.OPTIMIZER_ADAM)
        self.assertEqual(spec.optimizer.learning_rate, 0.05)
        self.assertEqual((spec.model, spec.batch_size, spec.rounds, spec.seed), ("cnn", 32, 10, 1))

    def test_yaml_json_and_torchscript(self):
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "m.pt"), "wb") as f:
                f.write(b"model bytes")
            with open(os.path.join(d, "t.yaml"), "w") as f:
                f.write("name: t\nmodel: {torchscript: m.pt}\ndataset:\n  train_limit: 10\n")
            with open(os.path.join(d, "t.json"), "w") as f:
                f.write('{"name": "t", "rounds": 3}')
            spec = shoal_client.load_task(os.path.join(d, "t.yaml"))
            self.assertEqual(spec.model, "torchscript")
            self.assertEqual(spec.torchscript.file, "m.pt")
            self.assertEqual(spec.torchscript.sha256, hashlib.sha256(b"model bytes").hexdigest())
            self.assertEqual(spec.dataset.train_limit, 10)
            self.assertEqual(shoal_client.load_task(os.path.join(d, "t.json")).rounds, 3)

    def test_errors_name_the_file_and_field(self):
        cases = [({"name": "t", "dataset": {"partitio": "iid"}},
                  "dataset.partitio: unknown field"),
                 ({"name": "t", "mode": "federated"}, 'mode: unknown value "federated"'),
                 ({"name": "t", "batch_size": "many"}, "batch_size"),
                 ({"name": "t", "model": {"onnx": "m"}}, "model: expected")]
        for task, expected in cases:
            with self.assertRaises(shoal_client.ShoalError) as caught:
                shoal_client.load_task(task)
            self.assertEqual(caught.exception.code, "INVALID_ARGUMENT")
            self.assertIn(expected, caught.exception.message)
        with self.assertRaises(shoal_client.ShoalError) as caught:
            shoal_client.load_task("/nonexistent/task.yaml")
        self.assertEqual(caught.exception.code, "NOT_FOUND")
        self.assertIn("/nonexistent/task.yaml", caught.exception.message)


class DecodeModelTest(unittest.TestCase):
    TENSORS = {"fc1.weight": np.arange(6, dtype=np.float32).reshape(2, 3),
               "fc1.bias": np.array([0.5, -1.5], dtype=np.float32),
               "scale": np.array(2.0, dtype=np.float32)}

    def test_names_shapes_and_values(self):
        state = shoal_client.decode_model(stream(self.TENSORS))
        self.assertEqual(list(state), list(self.TENSORS))
        for name, array in self.TENSORS.items():
            self.assertEqual(state[name].shape, array.shape)
            np.testing.assert_array_equal(state[name], array)

    def test_streams_that_do_not_add_up(self):
        for chunks, expected in ((stream(self.TENSORS, cut=1), "tensor scale: 3 bytes of 4"),
                                 (stream(self.TENSORS, num_tensors=4), "3 tensors of 4"),
                                 (stream(self.TENSORS, flip="fc1.bias"),
                                  "tensor fc1.bias: digest mismatch"),
                                 (stream(self.TENSORS)[1:], "before its ModelMeta"),
                                 ([], "empty")):
            with self.assertRaises(shoal_client.ShoalError) as caught:
                shoal_client.decode_model(iter(chunks))
            self.assertEqual(caught.exception.code, "DATA_LOSS")
            self.assertIn(expected, caught.exception.message)


if __name__ == "__main__":
    start = time.monotonic()
    result = unittest.main(argv=[sys.argv[0], "-v"], exit=False).result
    print(f"client_unit_test: {time.monotonic() - start:.1f} s")
    sys.exit(0 if result.wasSuccessful() else 1)
