"""Input and output types of the all2all task (the leaderboard bundle's task.py)."""
from typing import TYPE_CHECKING, TypedDict, TypeVar

import torch

if TYPE_CHECKING:
    from reference import MoEConfig, RankTestData

# data = (cfg, rank_data, rank, world_size); the output is this rank's (num_tokens, hidden_dim) tokens.
input_t = TypeVar("input_t", bound=tuple["MoEConfig", "RankTestData", int, int])
output_t = TypeVar("output_t", bound=torch.Tensor)


class TestSpec(TypedDict):
    num_experts: int
    experts_per_token: int
    hidden_dim: int
    max_num_tokens: int
    seed: int
    world_size: int
