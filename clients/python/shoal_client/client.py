"""The coordinator's ControlService (protos/shoal/coordinator/v1/control.proto) from Python."""

import os
import queue
import time
from typing import Any, Dict, Iterator, List, Optional, Sequence, Union

import grpc
import numpy as np
import xxhash

from shoal_client._gen.shoal.common.v1 import model_pb2, task_pb2, tensor_pb2
from shoal_client._gen.shoal.coordinator.v1 import control_pb2, control_pb2_grpc
from shoal_client.errors import ShoalError, from_rpc_error
from shoal_client.taskfile import name_source, task_file_text

TaskStatus = control_pb2.TaskStatus
RoundSummary = control_pb2.RoundSummary
NodeInfo = control_pb2.NodeInfo

# Tasks in these states are over (WatchTask ends).
ENDED = (control_pb2.TASK_STATE_COMPLETED, control_pb2.TASK_STATE_STOPPED,
         control_pb2.TASK_STATE_FAILED)


def _credentials(tls_dir: str) -> grpc.ChannelCredentials:
    """Mutual TLS with TLS_DIR/ca.crt, tls.crt and tls.key, the files of `shoalctl --tls-dir`
    (scripts/gen-certs makes them)."""
    files = []
    for name in ("ca.crt", "tls.crt", "tls.key"):
        path = os.path.join(tls_dir, name)
        try:
            with open(path, "rb") as f:
                files.append(f.read())
        except OSError as e:
            raise ShoalError("NOT_FOUND", f"tls_dir: cannot read {path} ({e.strerror}; make "
                             "certificates with scripts/gen-certs)") from None
    return grpc.ssl_channel_credentials(root_certificates=files[0], private_key=files[2],
                                        certificate_chain=files[1])


def connect(addresses: Union[Sequence[str], str], tls_dir: Optional[str] = None,
            insecure: bool = False, timeout: float = 10) -> "Client":
    """A Client of the first coordinator in `addresses` (HOST:PORT, or a list tried in order)
    whose channel comes up within `timeout` seconds and that serves; an address that refuses the
    connection or the TLS handshake is skipped at once, and so is a standby coordinator (it
    answers UNAVAILABLE naming the active one). Exactly one of `tls_dir` (mutual TLS with
    the directory's ca.crt, tls.crt and tls.key, as `shoalctl --tls-dir`; default
    $SHOAL_TLS_DIR) and `insecure` (plaintext, for a coordinator run with --insecure). `timeout`
    is also the deadline of every call but watch() and download_model(). Raises ShoalError:
    INVALID_ARGUMENT for bad arguments, UNAVAILABLE when no address answers (each named)."""
    if isinstance(addresses, str):
        addresses = [addresses]
    if not addresses:
        raise ShoalError("INVALID_ARGUMENT", "addresses: at least one HOST:PORT")
    if tls_dir is None and not insecure:
        tls_dir = os.environ.get("SHOAL_TLS_DIR") or None
    if insecure and tls_dir is not None:
        raise ShoalError("INVALID_ARGUMENT", "insecure: cannot be combined with tls_dir")
    if not insecure and tls_dir is None:
        raise ShoalError("INVALID_ARGUMENT", "tls_dir: required (a directory with ca.crt, "
                         "tls.crt, tls.key from scripts/gen-certs), or insecure=True")
    credentials = None if insecure else _credentials(tls_dir)
    failures = []
    for address in addresses:
        channel = (grpc.insecure_channel(address) if credentials is None
                   else grpc.secure_channel(address, credentials))
        problem = _wait_ready(channel, timeout)
        if problem is None:
            problem = _standby(channel, timeout)
        if problem is None:
            return Client(channel, address, timeout)
        channel.close()
        failures.append(f"{address} ({problem})")
    raise ShoalError("UNAVAILABLE", "no coordinator answered: " + ", ".join(failures))


def _standby(channel: grpc.Channel, timeout: float) -> Optional[str]:
    """The refusal of a standby coordinator behind a ready `channel` (it answers every call
    UNAVAILABLE), or None when the coordinator serves."""
    try:
        control_pb2_grpc.ControlServiceStub(channel).ListTasks(control_pb2.ListTasksRequest(),
                                                               timeout=timeout)
    except grpc.RpcError as e:
        if e.code() == grpc.StatusCode.UNAVAILABLE:
            return e.details()
    return None


def _wait_ready(channel: grpc.Channel, timeout: float) -> Optional[str]:
    """None once `channel` is connected; why not when its first attempt fails (refused,
    TLS handshake) or `timeout` seconds pass."""
    states: "queue.Queue[grpc.ChannelConnectivity]" = queue.Queue()
    channel.subscribe(states.put, try_to_connect=True)
    deadline = time.monotonic() + timeout
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return f"no answer within {timeout:g} s"
            try:
                state = states.get(timeout=left)
            except queue.Empty:
                continue
            if state == grpc.ChannelConnectivity.READY:
                return None
            if state in (grpc.ChannelConnectivity.TRANSIENT_FAILURE,
                         grpc.ChannelConnectivity.SHUTDOWN):
                return "cannot connect: refused, unreachable or TLS handshake failed"
    finally:
        channel.unsubscribe(states.put)


class Client:
    """One coordinator's ControlService. Every method raises ShoalError when the call fails
    (the gRPC status code's name and the coordinator's message). Use as a context manager, or
    call close()."""

    def __init__(self, channel: grpc.Channel, address: str, timeout: float = 10):
        self.address = address
        self.timeout = timeout
        self._channel = channel
        self._stub = control_pb2_grpc.ControlServiceStub(channel)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _call(self, method: str, request: Any) -> Any:
        try:
            return getattr(self._stub, method)(request, timeout=self.timeout)
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None

    def create_task(self, task: Union[str, os.PathLike, Dict[str, Any],
                                      task_pb2.TaskSpec]) -> TaskStatus:
        """Creates a task from a YAML or JSON task file's path, a dict written like one
        (docs/reference/task-file.md: the coordinator reads it as shoalctl reads files, defaults
        included) or a TaskSpec; returns its status. Idempotent for an identical spec. Errors:
        INVALID_ARGUMENT a bad file or spec (the file and field named), NOT_FOUND a missing
        file (the task's or its TorchScript model's), ALREADY_EXISTS the name is taken by
        another spec."""
        if isinstance(task, task_pb2.TaskSpec):
            return self._call("CreateTask", control_pb2.CreateTaskRequest(spec=task)).status
        text, name = task_file_text(task)
        try:
            return self._call("CreateTask", control_pb2.CreateTaskRequest(task_file=text)).status
        except ShoalError as e:
            raise name_source(e, name) from None

    def list_tasks(self) -> List[TaskStatus]:
        """Every task's status (without round history)."""
        return list(self._call("ListTasks", control_pb2.ListTasksRequest()).tasks)

    def get_task(self, name: str) -> TaskStatus:
        """The task's status with its newest rounds. Errors: NOT_FOUND unknown task."""
        return self._call("GetTaskStatus", control_pb2.GetTaskStatusRequest(name=name)).status

    def stop_task(self, name: str) -> TaskStatus:
        """Stops the task (idempotent). Errors: NOT_FOUND unknown task."""
        return self._call("StopTask", control_pb2.StopTaskRequest(name=name)).status

    def delete_task(self, name: str) -> None:
        """Deletes an ended task with its round history, checkpoints and their files; returns
        once it is gone from the coordinator's store. Errors: NOT_FOUND unknown task,
        FAILED_PRECONDITION a task still open (stop it first)."""
        self._call("DeleteTask", control_pb2.DeleteTaskRequest(name=name))

    def list_peers(self) -> List[NodeInfo]:
        """The connected peers with their capacity, by id (ListNodes)."""
        return list(self._call("ListNodes", control_pb2.ListNodesRequest()).peers)

    def watch(self, name: str, timeout: Optional[float] = None) -> Iterator[RoundSummary]:
        """The task's completed rounds, each once and in order, as the coordinator reports
        them (rounds done before the call first), until the task ends; get_task() then gives
        the final status. `timeout`: a deadline for the whole watch in seconds (None: none).
        Test results of a round may arrive after it is yielded (evaluation_complete); they are
        in get_task()'s history. Errors: NOT_FOUND unknown task, DEADLINE_EXCEEDED."""
        stream = self._stub.WatchTask(control_pb2.WatchTaskRequest(name=name), timeout=timeout)
        last = 0
        try:
            for response in stream:
                for summary in response.status.history:
                    if summary.round > last:
                        last = summary.round
                        yield summary
                if response.status.state in ENDED:
                    return
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None
        finally:
            stream.cancel()

    def download_model(self, name: str, version: Optional[int] = None,
                       timeout: float = 120) -> Dict[str, np.ndarray]:
        """The task's checkpointed global model (the latest, or exactly `version`) as
        {parameter name: float32 array of its shape}, in the model's order. `timeout`: the
        download's deadline in seconds. Errors: NOT_FOUND unknown task or no checkpoint yet;
        DATA_LOSS a stream that does not add up (sizes, encoding, a tensor whose XXH3-64 digest
        is not its header's)."""
        request = control_pb2.GetModelRequest(name=name)
        if version is not None:
            request.version = version
        try:
            return decode_model(self._stub.GetModel(request, timeout=timeout))
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None


_DTYPES = {tensor_pb2.DTYPE_FLOAT32: np.dtype("<f4")}


def decode_model(chunks: Iterator[model_pb2.ModelChunk]) -> Dict[str, np.ndarray]:
    """Decodes a model stream (ModelMeta, then per tensor a TensorHeader and its chunks; models
    travel raw float32, protos/shoal/common/v1/model.proto) into {name: array}."""
    meta = None
    tensors: Dict[str, np.ndarray] = {}
    header = None
    parts: List[bytes] = []
    received = 0

    def finish() -> None:
        if header is None:
            return
        if received != header.size_bytes:
            raise ShoalError("DATA_LOSS", f"tensor {header.name}: {received} bytes of "
                             f"{header.size_bytes}")
        payload = b"".join(parts)
        digest = xxhash.xxh3_64_intdigest(payload)
        if digest != header.digest_xxh3:
            raise ShoalError("DATA_LOSS", f"tensor {header.name}: digest mismatch (header says "
                             f"{header.digest_xxh3:x}, payload is {digest:x})")
        array = np.frombuffer(payload, dtype=_DTYPES[header.dtype])
        tensors[header.name] = array.reshape(tuple(header.shape)).astype(np.float32)

    for chunk in chunks:
        item = chunk.WhichOneof("item")
        if item == "meta":
            meta = chunk.meta
            continue
        if meta is None:
            raise ShoalError("DATA_LOSS", "model stream: a frame before its ModelMeta")
        frame = chunk.frame
        if frame.WhichOneof("frame") == "header":
            finish()
            header, parts, received = frame.header, [], 0
            if header.encoding not in (tensor_pb2.ENCODING_UNSPECIFIED, tensor_pb2.ENCODING_RAW):
                raise ShoalError("DATA_LOSS", f"tensor {header.name}: encoding "
                                 f"{tensor_pb2.Encoding.Name(header.encoding)} in a model stream")
            if header.dtype not in _DTYPES:
                raise ShoalError("DATA_LOSS", f"tensor {header.name}: dtype "
                                 f"{tensor_pb2.DType.Name(header.dtype)}")
            count = int(np.prod(header.shape, dtype=np.int64)) if header.shape else 1
            if count * _DTYPES[header.dtype].itemsize != header.size_bytes:
                raise ShoalError("DATA_LOSS", f"tensor {header.name}: shape "
                                 f"{list(header.shape)} does not fit {header.size_bytes} bytes")
        else:
            if header is None:
                raise ShoalError("DATA_LOSS", "model stream: a chunk before a TensorHeader")
            parts.append(frame.chunk)
            received += len(frame.chunk)
            if received > header.size_bytes:
                raise ShoalError("DATA_LOSS", f"tensor {header.name}: more than "
                                 f"{header.size_bytes} bytes")
    finish()
    if meta is None:
        raise ShoalError("DATA_LOSS", "model stream: empty")
    if len(tensors) != meta.num_tensors:
        raise ShoalError("DATA_LOSS", f"model stream: {len(tensors)} tensors of "
                         f"{meta.num_tensors}")
    return tensors
