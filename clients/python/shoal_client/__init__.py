"""Python client of the Shoal coordinator's ControlService: create, follow and stop tasks, list
peers and download trained models. See clients/python/README.md.

    import shoal_client
    with shoal_client.connect("127.0.0.1:7000", tls_dir="certs/shoalctl") as client:
        client.create_task("deploy/tasks/fashion-mnist-cnn.yaml")
        for summary in client.watch("fashion-mnist-cnn"):
            print(summary.round, summary.mean_train_loss)
        state = client.download_model("fashion-mnist-cnn")  # {name: numpy array}
"""

from shoal_client.client import (ENDED, Client, NodeInfo, RoundSummary, TaskStatus, connect,
                                  decode_model)
from shoal_client.errors import ShoalError
from shoal_client.taskfile import task_file_text
from shoal_client.torch_support import load_into, to_torch
from shoal_client._gen.shoal.common.v1 import task_pb2
from shoal_client._gen.shoal.coordinator.v1 import control_pb2

__all__ = ["Client", "ENDED", "NodeInfo", "RoundSummary", "ShoalError", "TaskStatus",
           "connect", "control_pb2", "decode_model", "load_into", "task_file_text",
           "task_pb2", "to_torch"]
