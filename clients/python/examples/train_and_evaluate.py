#!/usr/bin/env python3
"""Creates a task, prints a line per round until it ends, downloads the trained model and prints
its tensors; with PyTorch installed and an MLP task, also loads the model into a torch module
and measures its accuracy on the first 1000 Fashion-MNIST test images.

    /usr/bin/python3 clients/python/examples/train_and_evaluate.py \\
        --coordinator 127.0.0.1:7000 --tls-dir certs/shoalctl [--task FILE]

Without --task it creates `python-example`: an MLP, 3 short rounds on 6000 training samples,
with the defaults of docs/reference/task-file.md for the rest. Needs at least one peer.
"""

import argparse
import gzip
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import shoal_client  # noqa: E402  (the checkout's, unless the package is installed)

EXAMPLE_TASK = {
    "name": "python-example",
    "model": "mlp",
    "dataset": {"train_limit": 6000, "test_limit": 1000},
    "round_batches": 20,
    "rounds": 3,
}


def test_images(data_dir, count):
    """The first `count` Fashion-MNIST test images (pixels / 255, as the peers train) and
    labels, from Debian's dataset-fashion-mnist files."""
    import numpy as np

    with gzip.open(os.path.join(data_dir, "t10k-images-idx3-ubyte.gz")) as f:
        images = np.frombuffer(f.read(), dtype=np.uint8, offset=16).reshape(-1, 1, 28, 28)
    with gzip.open(os.path.join(data_dir, "t10k-labels-idx1-ubyte.gz")) as f:
        labels = np.frombuffer(f.read(), dtype=np.uint8, offset=8)
    return images[:count].astype(np.float32) / 255.0, labels[:count].astype(np.int64)


def evaluate_mlp(state, data_dir):
    """Accuracy of the downloaded MLP (libs/training/models.cc: 784 -> 200 -> 10, ReLU) on 1000
    test images, in PyTorch."""
    import torch

    class Mlp(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = torch.nn.Linear(784, 200)
            self.fc2 = torch.nn.Linear(200, 10)

        def forward(self, x):
            return self.fc2(torch.relu(self.fc1(torch.flatten(x, 1))))

    model = shoal_client.load_into(Mlp(), state).eval()
    images, labels = test_images(data_dir, 1000)
    with torch.no_grad():
        predicted = model(torch.from_numpy(images)).argmax(dim=1)
    return (predicted == torch.from_numpy(labels)).float().mean().item()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--coordinator", action="append", required=True,
                        help="HOST:PORT; repeat to try several in order")
    parser.add_argument("--tls-dir", help="ca.crt, tls.crt, tls.key (default $SHOAL_TLS_DIR)")
    parser.add_argument("--insecure", action="store_true", help="plaintext gRPC")
    parser.add_argument("--task", help="a YAML or JSON task file (default: a small MLP task)")
    parser.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist",
                        help="Fashion-MNIST, for the evaluation")
    args = parser.parse_args()

    try:
        with shoal_client.connect(args.coordinator, tls_dir=args.tls_dir,
                                  insecure=args.insecure) as client:
            status = client.create_task(args.task or EXAMPLE_TASK)
            name, rounds = status.spec.name, status.spec.rounds
            print(f"task {name}: created on {client.address}, {rounds} rounds")
            for summary in client.watch(name):
                line = (f"round {summary.round}/{rounds}: {summary.participant_count} peers, "
                        f"train loss {summary.mean_train_loss:.4f}")
                if summary.evaluated:
                    line += f", test accuracy {summary.test_accuracy:.4f}"
                print(line, flush=True)
            final = client.get_task(name)
            state_name = shoal_client.control_pb2.TaskState.Name(final.state)
            print(f"task {name}: {state_name}, model version {final.model_version}"
                  + (f" ({final.message})" if final.message else ""))
            state = client.download_model(name)
    except shoal_client.ShoalError as e:
        sys.exit(f"train_and_evaluate: {e}")
    for tensor, array in state.items():
        print(f"  {tensor}: {'x'.join(map(str, array.shape))}")
    try:
        import torch  # noqa: F401
    except ImportError:
        return
    if final.spec.model == "mlp" and os.path.isdir(args.data_dir):
        print(f"accuracy of the downloaded model on 1000 test images (PyTorch): "
              f"{evaluate_mlp(state, args.data_dir):.4f}")


if __name__ == "__main__":
    main()
