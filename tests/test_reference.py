"""The reference against the closed-form oracle, input generation, the check's messages, seed mixing."""
import functools

import pytest
import torch

from eval import cantor_combine, get_test_cases, parse_test_line
from a2a.launch import parallel_launch

SMALL = dict(num_experts=16, experts_per_token=3, hidden_dim=64, max_num_tokens=24)


def _reference_vs_oracle(rank, world_size, spec):
    from reference import closed_form_output, generate_input, ref_kernel

    data = generate_input(**spec, rank=rank, world_size=world_size)
    out, oracle = ref_kernel(data), closed_form_output(data)
    assert out.shape == (data[1].num_tokens, spec["hidden_dim"]) and out.dtype == torch.float16
    diff = (out.float() - oracle.float()).abs()
    bound = 5e-3 + 1e-2 * oracle.float().abs()
    return bool((diff <= bound).all()), float(diff.max()), int(data[1].num_tokens)


def _dispatched_rows(rank, world_size, spec):
    """Every (src_rank, token, k) routed to this rank arrives exactly once, at the expert it names, carrying the x
    row of that token."""
    from reference import PyTorchAllToAll, generate_input

    data = generate_input(**spec, rank=rank, world_size=world_size)
    cfg, rank_data = data[0], data[1]
    counts, expert_x, meta = PyTorchAllToAll(cfg, rank, world_size).dispatch(rank_data.x, rank_data.indices)
    sources = {r: generate_input(**spec, rank=r, world_size=world_size)[1] for r in range(world_size)}
    arrived = []
    for local in range(counts.numel()):
        for slot in range(int(counts[local])):
            global_expert, src_rank, src_token, src_k, _ = meta[local, slot].tolist()
            source = sources[src_rank]
            assert global_expert == rank * counts.numel() + local
            assert int(source.indices[src_token, src_k]) == global_expert
            assert torch.equal(expert_x[local, slot], source.x[src_token])
            arrived.append((src_rank, src_token, src_k))
    routed = {(src, token, k) for src, s in sources.items() for token, row in enumerate(s.indices.tolist())
              for k, expert in enumerate(row) if expert // counts.numel() == rank}
    return len(arrived) == len(set(arrived)) and set(arrived) == routed


def _checks(rank, world_size, checks):
    """Every check of one world size in one launch (each rank imports torch once): {name: its result, or the
    error it raised}."""
    found = {}
    for name, fn, spec in checks:
        try:
            found[name] = fn(rank, world_size, spec)
        except Exception as error:  # one check's failure is its test's, not its neighbours'
            found[name] = f"{type(error).__name__}: {error}"
    return found


CHECKS = {
    2: [("closed form", _reference_vs_oracle, dict(SMALL, seed=9)),
        ("official shape", _reference_vs_oracle, dict(num_experts=256, experts_per_token=8, hidden_dim=7168,
                                                      max_num_tokens=128, seed=4))],
    4: [("closed form", _reference_vs_oracle, dict(SMALL, seed=11)),
        ("dispatch", _dispatched_rows, dict(SMALL, seed=3))],
    8: [("closed form", _reference_vs_oracle, dict(SMALL, seed=15))],
}


@functools.cache
def _launched(world_size: int) -> list:
    return parallel_launch(world_size, _checks, CHECKS[world_size], backend="gloo")


def launched(world_size: int, name: str) -> list:
    """What each rank found for check `name` of the one launch at `world_size` (made once per test process)."""
    return [found[name] for found in _launched(world_size)]


@pytest.mark.parametrize("world_size", [2, 4, 8])
def test_reference_matches_closed_form(world_size):
    results = launched(world_size, "closed form")
    assert all(isinstance(r, tuple) and r[0] for r in results), results
    assert len({n for _, _, n in results}) > 1, "ranks should hold different token counts"


def test_reference_matches_closed_form_official_shape():
    results = launched(2, "official shape")
    assert all(isinstance(r, tuple) and r[0] for r in results), results


def test_reference_dispatch_delivers_each_pair_once():
    assert all(found is True for found in launched(4, "dispatch")), launched(4, "dispatch")


def test_generate_input_semantics():
    from reference import generate_input

    spec = dict(SMALL, seed=11)
    cfg, data, rank, world_size = generate_input(**spec, rank=1, world_size=4)
    assert (rank, world_size) == (1, 4)
    assert 1 <= data.num_tokens < spec["max_num_tokens"]
    assert data.indices.dtype == torch.int32 and data.weights.dtype == torch.float32
    assert data.x.dtype == torch.float16 and data.x.shape == (data.num_tokens, spec["hidden_dim"])
    for row in data.indices.tolist():
        assert len(set(row)) == len(row) and all(0 <= e < spec["num_experts"] for e in row)
    again = generate_input(**spec, rank=1, world_size=4)[1]
    assert torch.equal(again.x, data.x) and torch.equal(again.indices, data.indices)
    # seed + rank: rank 1 of seed 11 is rank 0 of seed 12
    shifted = generate_input(**dict(spec, seed=12), rank=0, world_size=4)[1]
    assert torch.equal(shifted.x, data.x)


def test_check_messages_are_short_and_specific():
    from reference import check_output

    expected = torch.randn(40, 512).half()
    assert check_output(expected.clone(), expected) == (True, "")
    assert "expected a torch.Tensor" in check_output([1, 2], expected)[1]
    assert "shape mismatch" in check_output(expected[:-1], expected)[1]
    assert "dtype mismatch" in check_output(expected.float(), expected)[1]
    assert "device mismatch" in check_output(expected.to("meta"), expected)[1]
    wrong = expected.clone()
    wrong[3, 7] += 1
    wrong[20:30] = 0
    ok, message = check_output(wrong, expected)
    assert not ok
    count = int((~torch.isclose(wrong, expected, rtol=1e-2, atol=5e-3)).sum())
    assert f"{count} of {expected.numel()} elements differ" in message
    assert "(3, 7)" in message and len(message) < 800


def test_seed_mixing_is_cantor_pairing():
    assert cantor_combine(5, 0) == 20
    assert cantor_combine(1234, 99991) == 5123302159
    line = "num_experts: 8; experts_per_token: 2; hidden_dim: 64; max_num_tokens: 4; seed: 10; world_size: 2"
    (case,) = get_test_cases(line, 77)
    assert case.args["seed"] == 3838
    assert {k: v for k, v in case.args.items() if k != "seed"} == {k: v for k, v in parse_test_line(line).items()
                                                                 if k != "seed"}
    assert get_test_cases(line, None)[0].args["seed"] == 10


@pytest.mark.parametrize("line", ["num_experts: 8; hidden_dim 64", "num_experts: 8;; seed: 1", "seed: 1.5"])
def test_malformed_test_line_is_rejected(line):
    with pytest.raises(ValueError, match="invalid test case"):
        parse_test_line(line)
