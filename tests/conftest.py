import os

import pytest
import torch

# Tests compare numbers across runs: keep them single-process deterministic and quiet.
torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture
def tiny64():
    """The shared tiny random model in float64 (tests/tiny_models.py): exact comparisons."""
    from tiny_models import tiny_model
    return tiny_model(torch.float64)


@pytest.fixture
def tiny32():
    """The shared tiny random model in float32 (tests/tiny_models.py): comparisons up to rounding."""
    from tiny_models import tiny_model
    return tiny_model(torch.float32)
