"""Downloaded models into PyTorch (needs torch; the rest of shoal_client does not)."""

from typing import Any, Dict

import numpy as np


def to_torch(state: Dict[str, np.ndarray]) -> Dict[str, Any]:
    """{name: torch.Tensor} of a download_model() result (copies, so they are writable)."""
    import torch

    return {name: torch.from_numpy(np.array(array, copy=True)) for name, array in state.items()}


def load_into(module: Any, state: Dict[str, np.ndarray]) -> Any:
    """Loads a download_model() result into a torch.nn.Module whose parameter names and
    shapes match (strict: a missing or extra name raises RuntimeError); returns the module."""
    module.load_state_dict(to_torch(state), strict=True)
    return module
