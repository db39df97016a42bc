"""``eval_mode(module)``: run a block in eval mode and give the module back in the mode it was in."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from torch import nn


@contextlib.contextmanager
def eval_mode(module: nn.Module) -> Iterator[nn.Module]:
    """``with eval_mode(model): ...``: BatchNorm and dropout in inference mode inside, the caller's mode after."""
    was_training = module.training
    module.eval()
    try:
        yield module
    finally:
        module.train(was_training)
