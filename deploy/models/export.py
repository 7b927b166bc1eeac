#!/usr/bin/python3
"""Exports example models as TorchScript files that a Shoal task can train.

    /usr/bin/python3 deploy/models/export.py OUT_DIR [--seed N]

Needs PyTorch 1.13 (Debian: python3-torch, the same version as libtorch-dev). Writes:

  fashion_mlp.pt   784 -> 128 -> 10 MLP for 1x28x28 images (Fashion-MNIST)
  fashion_cnn.pt   a small CNN with batch normalisation for 1x28x28 images
  tabular_mlp.pt   8 -> 32 -> 32 -> 4 MLP for the machine-condition table that
                   `shoal-example-data` writes (8 feature columns, 4 classes)
  wrong_output.pt  an MLP with 7 outputs: a peer refuses it for a 10-class data set (tests)

Any model works the same way: a torch.nn.Module whose forward(x) takes a batch of samples and
returns one row of logits per sample, with float32 parameters, saved with
torch.jit.script(model).save(FILE) (or torch.jit.trace). A task names the file:

    model: {torchscript: fashion_mlp.pt}   # relative to the task file

Shoal trains the parameters in the order the module registers them; buffers (batch-norm
statistics) stay each peer's own. `shoalctl model get NAME --format torchscript --out FILE`
gives the trained model back as a TorchScript file: torch.jit.load(FILE).
"""

import argparse
import os

import torch
from torch import nn


class FashionMlp(nn.Module):
    def __init__(self, outputs: int = 10):
        super().__init__()
        self.fc1 = nn.Linear(784, 128)
        self.fc2 = nn.Linear(128, outputs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x.flatten(1))))


class TabularMlp(nn.Module):
    def __init__(self, features: int = 8, classes: int = 4):
        super().__init__()
        self.fc1 = nn.Linear(features, 32)
        self.fc2 = nn.Linear(32, 32)
        self.fc3 = nn.Linear(32, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc3(torch.relu(self.fc2(torch.relu(self.fc1(x)))))


class FashionCnn(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 5, padding=2)
        self.bn1 = nn.BatchNorm2d(16)
        self.conv2 = nn.Conv2d(16, 32, 5, padding=2)
        self.fc = nn.Linear(32 * 7 * 7, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.max_pool2d(torch.relu(self.bn1(self.conv1(x))), 2)
        x = torch.max_pool2d(torch.relu(self.conv2(x)), 2)
        return self.fc(x.flatten(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir")
    parser.add_argument("--seed", type=int, default=1, help="weight initialisation seed")
    args = parser.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)
    models = {
        "fashion_mlp.pt": lambda: FashionMlp(),
        "fashion_cnn.pt": lambda: FashionCnn(),
        "tabular_mlp.pt": lambda: TabularMlp(),
        "wrong_output.pt": lambda: FashionMlp(outputs=7),
    }
    for name, make in models.items():
        torch.manual_seed(args.seed)
        path = os.path.join(args.out_dir, name)
        torch.jit.script(make()).save(path + ".part")
        os.replace(path + ".part", path)  # never half a file under the final name
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
