"""Task files (YAML or JSON) and dicts, as the text of CreateTaskRequest.task_file. The
coordinator reads that text with the same reader as shoalctl (libs/task: the defaults of fields
left out, friendly enum names, errors naming the field), so this module knows only what the
coordinator cannot do itself: read a TorchScript model's file, whose SHA-256 it adds to the task
(`torchscript: {sha256: HEX}`), and say which file an error is about."""

import hashlib
import json
import os
from typing import Any, Dict, Tuple, Union

from shoal_client.errors import ShoalError

MAX_BYTES = 1 << 20  # the task file limit of shoalctl and of the coordinator (1 MiB)
# The coordinator's name for the text in its error messages.
SOURCE = "task_file"


def task_file_text(source: Union[str, os.PathLike, Dict[str, Any]]) -> Tuple[str, str]:
    """(text to send, name for messages) of a task file's path or of a dict written like one.
    Raises ShoalError: NOT_FOUND no such file (the task's or its TorchScript model's);
    INVALID_ARGUMENT a file over 1 MiB, not UTF-8, or whose model cannot be found in it."""
    if isinstance(source, dict):
        return _with_model_digest(source, "task", os.getcwd(), None), "task"
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
    task = _parse(text)
    base_dir = os.path.dirname(os.path.abspath(path))
    return _with_model_digest(task, path, base_dir, text), path


def name_source(error: ShoalError, name: str) -> ShoalError:
    """The coordinator's error about the task file text, naming the file instead."""
    prefix = SOURCE + ": "
    if error.code == "INVALID_ARGUMENT" and error.message.startswith(prefix):
        return ShoalError(error.code, f"{name}: {error.message[len(prefix):]}")
    return error


def _parse(text: str) -> Any:
    """The task as Python values, to find its model file; None when this cannot tell (the
    coordinator then reads the text and names what is wrong)."""
    try:
        return json.loads(text)
    except ValueError:
        pass
    try:
        import yaml  # python3-yaml (scripts/bootstrap test)
    except ImportError:
        return None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return None


def _model_file(task: Any) -> Any:
    """The TorchScript file a task names (`model: {torchscript: FILE}` or
    `torchscript: {file: FILE}`), or None."""
    if not isinstance(task, dict):
        return None
    model = task.get("model")
    if isinstance(model, dict) and "torchscript" in model:
        return model["torchscript"]
    torchscript = task.get("torchscript")
    if isinstance(torchscript, dict):
        return torchscript.get("file")
    return None


def _with_model_digest(task: Any, name: str, base_dir: str, text: Any) -> str:
    """The text to send: `text` as written (or the dict as JSON), with the SHA-256 of a
    TorchScript model's file added unless the task gives it."""
    file = _model_file(task)
    torchscript = task.get("torchscript") if isinstance(task, dict) else None
    if file is None or (isinstance(torchscript, dict) and torchscript.get("sha256")):
        return text if text is not None else json.dumps(task)
    path = os.path.join(base_dir, str(file))
    try:
        with open(path, "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()
    except OSError as e:
        raise ShoalError("NOT_FOUND",
                         f"{name}: the model file {path}: {e.strerror}") from None
    task = dict(task)
    task["torchscript"] = dict(torchscript or {}, sha256=digest)
    return json.dumps(task)
