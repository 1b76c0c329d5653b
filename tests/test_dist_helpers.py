"""The warm gloo world the distributed tests share: each call as if on fresh processes, failures loud."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from tests.dist_helpers import RankFailed, run_world


def seed_and_reduce(rank: int) -> tuple[int, float, int]:
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    return torch.initial_seed(), t.item(), torch.get_num_threads()


def fails_on_rank_1(rank: int) -> int:
    if rank == 1:
        raise ValueError("planted on rank 1")
    return rank


def test_each_call_is_seeded_like_a_fresh_process_and_a_failing_rank_is_raised(tmp_path):
    first = run_world(seed_and_reduce, 2, tmp_path / "a")
    second = run_world(seed_and_reduce, 2, tmp_path / "b")
    assert len({seed for seed, _, _ in first + second}) == 4  # a new random seed per rank and call
    assert {(total, threads) for _, total, threads in first + second} == {(3.0, 1)}  # a real 2-rank all-reduce
    with pytest.raises(RankFailed, match="rank 1 raised:(.|\n)*planted on rank 1"):
        run_world(fails_on_rank_1, 2, tmp_path / "c")
    assert [total for _, total, _ in run_world(seed_and_reduce, 2, tmp_path / "d")] == [3.0, 3.0]  # a new world
