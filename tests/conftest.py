"""Shared fixtures."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from deepmetric.data.table import RetrievalDataset
from helpers import make_table


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    np.random.seed(0)


@pytest.fixture
def blob_table() -> RetrievalDataset:
    return make_table()
