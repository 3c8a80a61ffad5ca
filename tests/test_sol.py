"""The speed-of-light model on hand-made routings with closed-form answers."""
import pytest

from a2a import sol

# 1 GB/s = 1000 bytes per µs; round numbers make the answers easy to check by hand.
MACHINE = {"launch_us": 3.0, "one_way_latency_us": 1.0, "a2a_store_gbps": 1.0, "local_copy_gbps": 10.0}


def test_routing_counts_pairs_and_tokens_per_destination():
    # 2 ranks, 2 experts each (experts 0,1 on rank 0; 2,3 on rank 1)
    rank0 = [[0, 2], [2, 3], [1, 0]]  # token 0: ranks 0,1; token 1: rank 1 twice; token 2: rank 0 twice
    rank1 = [[3, 2]]                  # token 0: rank 1 twice
    routing = sol.routing_matrices([rank0, rank1], num_local_experts=2, world_size=2)
    assert routing.routed == [[3, 3], [0, 2]]
    assert routing.dedup == [[2, 2], [0, 1]]
    assert routing.tokens == [3, 1]


def test_model_routed_and_dedup_closed_form():
    routing = sol.Routing(routed=[[3, 3], [0, 2]], dedup=[[2, 2], [0, 1]], tokens=[3, 1])
    hidden = 500  # a row is 1000 bytes: 1 µs on the link, 0.1 µs locally
    result = sol.model(routing, hidden, MACHINE)
    fixed = 3.0 + 2 * 1.0
    # routed: rank 0 sends 3 rows to rank 1 and receives 0; rank 1 sends 0, receives 3 -> 3 + 0 per rank
    assert result["routed"]["link_us"] == pytest.approx(3.0)
    # local: rank 0: 2*3 tokens + 0 received + 3 sent = 9 rows = 0.9 µs; rank 1: 2 + 3 + 0 = 5 rows
    assert result["routed"]["local_us"] == pytest.approx(0.9)
    assert result["routed"]["total_us"] == pytest.approx(fixed + 3.0)
    # dedup: 2 rows cross instead of 3
    assert result["dedup"]["link_us"] == pytest.approx(2.0)
    assert result["dedup"]["total_us"] == pytest.approx(fixed + 2.0)


def test_model_takes_the_busiest_rank_and_both_directions():
    # 3 ranks: rank 0 sends 4 rows to each of ranks 1 and 2 and receives 1 row from each
    routed = [[0, 4, 4], [1, 0, 0], [1, 0, 0]]
    routing = sol.Routing(routed=routed, dedup=routed, tokens=[8, 1, 1])
    result = sol.model(routing, 500, MACHINE)
    assert result["routed"]["link_us"] == pytest.approx(10.0)  # rank 0: 8 out + 2 in


def test_local_traffic_bounds_a_case_that_stays_home():
    routing = sol.Routing(routed=[[5, 0], [0, 5]], dedup=[[5, 0], [0, 5]], tokens=[5, 5])
    result = sol.model(routing, 500, MACHINE)
    assert result["routed"]["link_us"] == 0.0
    assert result["routed"]["total_us"] == pytest.approx(5.0 + 1.0)  # 10 rows of x in and out at 0.1 µs


def test_routing_of_a_case_matches_the_inputs_of_every_rank():
    from reference import generate_input

    args = dict(num_experts=8, experts_per_token=3, hidden_dim=16, max_num_tokens=9, seed=5, world_size=2)
    routing = sol.routing_of_case(args)
    for rank in range(2):
        data = generate_input(**args, rank=rank)[1]
        assert routing.tokens[rank] == data.num_tokens
        assert sum(routing.routed[rank]) == data.num_tokens * 3
