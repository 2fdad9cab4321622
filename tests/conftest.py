import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tests never reach for a model hub
torch.set_num_threads(2)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """The offline tiny model, built once per test session and loaded through from_pretrained."""
    from grpo_aug.models.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("cache"), hidden_size=32, num_layers=2, num_heads=2,
                            intermediate_size=64, seed=0)
