"""shoal_client without a coordinator: the task file text it sends (as written, a dict as JSON,
a TorchScript file's digest added, missing files and the size limit) and the decoding of model streams
(shapes, and streams that do not add up or whose digests do not match).

Usage: /usr/bin/python3 client_unit_test.py SOURCE_DIR
"""

import hashlib
import json
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
    """What the client sends as CreateTaskRequest.task_file (the coordinator parses it)."""

    def test_a_file_goes_as_written_and_a_dict_as_json(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "t.yaml")
            text = "name: t\nmode: federated-async  # a comment\n"
            with open(path, "w") as f:
                f.write(text)
            self.assertEqual(shoal_client.task_file_text(path), (text, path))
        sent, name = shoal_client.task_file_text({"name": "t", "rounds": 3})
        self.assertEqual((json.loads(sent), name), ({"name": "t", "rounds": 3}, "task"))

    def test_a_torchscript_models_digest_is_added(self):
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "m.pt"), "wb") as f:
                f.write(b"model bytes")
            digest = hashlib.sha256(b"model bytes").hexdigest()
            for body in ("model: {torchscript: m.pt}\n",
                         "model: torchscript\ntorchscript: {file: m.pt}\n"):
                path = os.path.join(d, "t.yaml")
                with open(path, "w") as f:
                    f.write("name: t\n" + body)
                sent = json.loads(shoal_client.task_file_text(path)[0])
                self.assertEqual(sent["torchscript"]["sha256"], digest)
                self.assertEqual(sent["name"], "t")
            # A digest the task gives is the task's: the text goes unchanged.
            given = "name: t\nmodel: {torchscript: m.pt}\ntorchscript: {sha256: abc}\n"
            with open(path, "w") as f:
                f.write(given)
            self.assertEqual(shoal_client.task_file_text(path)[0], given)

    def test_missing_files_and_limits(self):
        cases = [("/nonexistent/task.yaml", "NOT_FOUND", "/nonexistent/task.yaml")]
        with tempfile.TemporaryDirectory() as d:
            missing_model = os.path.join(d, "t.yaml")
            with open(missing_model, "w") as f:
                f.write("name: t\nmodel: {torchscript: gone.pt}\n")
            cases.append((missing_model, "NOT_FOUND", "the model file " + d + "/gone.pt"))
            big = os.path.join(d, "big.yaml")
            with open(big, "w") as f:
                f.write("#" * (1 << 20) + "\n")
            cases.append((big, "INVALID_ARGUMENT", "over the limit"))
            for path, code, expected in cases:
                with self.assertRaises(shoal_client.ShoalError) as caught:
                    shoal_client.task_file_text(path)
                self.assertEqual(caught.exception.code, code)
                self.assertIn(expected, caught.exception.message)

    def test_the_coordinators_errors_name_the_file(self):
        from shoal_client.taskfile import name_source
        named = name_source(shoal_client.ShoalError("INVALID_ARGUMENT",
                                                    "task_file: batch: unknown field"), "t.yaml")
        self.assertEqual(named.message, "t.yaml: batch: unknown field")
        other = shoal_client.ShoalError("ALREADY_EXISTS", "task_file: x")
        self.assertIs(name_source(other, "t.yaml"), other)


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
