"""Task files (YAML or JSON) and dicts to TaskSpec, with the rules of docs/reference/task-file.md:
keys are the proto field names, enums are written in their friendly form (`federated-sync`,
`label-skew`) or as their full names (`MODE_FEDERATED_SYNC`), `model: {torchscript: FILE}` names
a TorchScript file, and fields left out keep the documented defaults (shoalctl's
DefaultTaskSpec, libs/task/task_file.cc). The defaults that depend on other fields (a mode's own
section, a strategy's parameters, the settings of data sets in own files) are not filled here:
write them out, or the coordinator answers INVALID_ARGUMENT naming the field."""

import copy
import hashlib
import json
import os
from typing import Any, Dict, Union

from google.protobuf import descriptor as _descriptor
from google.protobuf import json_format

from shoal_client._gen.shoal.common.v1 import task_pb2
from shoal_client.errors import ShoalError

# shoalctl's DefaultTaskSpec (libs/task/task_file.cc), as a task file would write it.
DEFAULTS: Dict[str, Any] = {
    "mode": "MODE_FEDERATED_SYNC",
    "model": "cnn",
    "loss": "LOSS_CROSS_ENTROPY",
    "dataset": {"name": "fashion-mnist", "format": "DATA_FORMAT_FASHION_MNIST",
                "partition": "PARTITION_IID"},
    "batch_size": 32,
    "optimizer": {"kind": "OPTIMIZER_SGD", "learning_rate": 0.05, "momentum": 0.9},
    "round_batches": 50,
    "rounds": 10,
    "min_participants": 1,
    "round_deadline_seconds": 120,
    "aggregation": "AGGREGATION_MEAN",
    "seed": 1,
    "compression": "COMPRESSION_NONE",
}
MAX_BYTES = 1 << 20  # the task file limit of shoalctl (1 MiB)


def load_task(source: Union[str, os.PathLike, Dict[str, Any]]) -> task_pb2.TaskSpec:
    """The TaskSpec of a task file's path or of a dict written like one. Raises ShoalError
    (NOT_FOUND: no such file; INVALID_ARGUMENT: bad content, the file and field named)."""
    if isinstance(source, dict):
        return spec_from_dict(source, "task", os.getcwd())
    path = os.fspath(source)
    try:
        size = os.path.getsize(path)
        if size > MAX_BYTES:
            raise ShoalError("INVALID_ARGUMENT", f"{path}: the task file is {size} bytes, over "
                             f"the limit of {MAX_BYTES} bytes (1 MiB)")
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise ShoalError("NOT_FOUND", f"{path}: {e.strerror}") from None
    except UnicodeDecodeError as e:
        raise ShoalError("INVALID_ARGUMENT", f"{path}: not UTF-8 text ({e.reason})") from None
    return spec_from_dict(_parse_text(text, path), path, os.path.dirname(os.path.abspath(path)))


def _parse_text(text: str, source: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        pass
    try:
        import yaml  # python3-yaml (scripts/bootstrap test)
    except ImportError:
        raise ShoalError("INVALID_ARGUMENT", f"{source}: not JSON, and PyYAML (python3-yaml) "
                         "is not installed to read YAML") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ShoalError("INVALID_ARGUMENT", f"{source}: {e}") from None


def spec_from_dict(task: Any, source: str, base_dir: str) -> task_pb2.TaskSpec:
    """TaskSpec of a parsed task file; `source` starts every error message and `base_dir`
    resolves a relative TorchScript file."""
    if not isinstance(task, dict):
        raise ShoalError("INVALID_ARGUMENT", f"{source}: a task file is a mapping of fields")
    task = copy.deepcopy(task)
    model = task.get("model")
    if isinstance(model, dict):
        if set(model) != {"torchscript"}:
            raise ShoalError("INVALID_ARGUMENT", f"{source}: model: expected cnn, mlp, "
                             "wide-mlp, or {torchscript: FILE}")
        task["model"] = "torchscript"
        task["torchscript"] = {"file": str(model["torchscript"]),
                               "sha256": _sha256(model["torchscript"], source, base_dir)}
    merged = _merge(copy.deepcopy(DEFAULTS), task)
    _friendly_enums(merged, task_pb2.TaskSpec.DESCRIPTOR, source, "")
    spec = task_pb2.TaskSpec()
    try:
        json_format.ParseDict(merged, spec)
    except json_format.ParseError as e:
        raise ShoalError("INVALID_ARGUMENT", f"{source}: {str(e).splitlines()[0]}") from None
    dataset = spec.dataset
    if dataset.partition == task_pb2.PARTITION_LABEL_SKEW and dataset.classes_per_shard == 0:
        dataset.classes_per_shard = 2
    if dataset.partition == task_pb2.PARTITION_DIRICHLET and dataset.alpha == 0:
        dataset.alpha = 0.5
    return spec


def _sha256(file: Any, source: str, base_dir: str) -> str:
    path = os.path.join(base_dir, str(file))
    try:
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    except OSError as e:
        raise ShoalError("NOT_FOUND",
                         f"{source}: model.torchscript: {path}: {e.strerror}") from None


def _merge(base: Dict[str, Any], over: Dict[str, Any]) -> Dict[str, Any]:
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            _merge(base[key], value)
        else:
            base[key] = value
    return base


def _friendly_enums(obj: Dict[str, Any], message: _descriptor.Descriptor, source: str,
                    path: str) -> None:
    """Rewrites friendly enum names to full ones, in place; refuses unknown keys (shoalctl's
    message). Values of the wrong type are left for json_format, which names the field."""
    for key, value in obj.items():
        where = f"{path}{key}"
        field = message.fields_by_name.get(key)
        if field is None:
            expected = ", ".join(sorted(message.fields_by_name))
            raise ShoalError("INVALID_ARGUMENT", f"{source}: {where}: unknown field (expected "
                             f"one of {expected})")
        values = value if isinstance(value, list) else [value]
        if field.message_type is not None:
            for item in values:
                if isinstance(item, dict):
                    _friendly_enums(item, field.message_type, source, where + ".")
        elif field.enum_type is not None:
            full = [_enum_value(field.enum_type, v, source, where) for v in values]
            obj[key] = full if isinstance(value, list) else full[0]


def _enum_value(enum: _descriptor.EnumDescriptor, value: Any, source: str, where: str) -> Any:
    if not isinstance(value, str):
        return value
    wanted = value.upper().replace("-", "_")
    unspecified = [v.name for v in enum.values if v.name.endswith("_UNSPECIFIED")]
    prefix = unspecified[0][: -len("UNSPECIFIED")] if unspecified else ""
    for v in enum.values:
        if v.name.endswith("_UNSPECIFIED"):
            continue
        if wanted == v.name or prefix + wanted == v.name:
            return v.name
    names = ", ".join(v.name[len(prefix):].lower().replace("_", "-") for v in enum.values
                      if not v.name.endswith("_UNSPECIFIED"))
    raise ShoalError("INVALID_ARGUMENT",
                     f"{source}: {where}: unknown value \"{value}\" (expected {names})")
