"""Reference for the all2all task (the leaderboard bundle's reference.py).

It keeps the official interface (`generate_input`, `ref_kernel`, `check_implementation`, `MoEConfig`,
`RankTestData`, `PyTorchAllToAll`) and semantics, including the order in which the random generator is drawn
and the float16 accumulation of combine, but replaces the official per-token Python loops with tensor
operations. It also holds a second, independent oracle: `closed_form_output` computes a rank's result locally,
with no communication, from the fact that the simulated expert is `x * (1 + owner_rank)`.

Runs on GPUs (NCCL, tensors on cuda:rank, or cuda:(rank mod GPUs) where ranks share GPUs) and on CPUs (gloo,
tensors on the CPU).
"""
import dataclasses

import torch
import torch.distributed as dist

from task import input_t, output_t

META_DIM = 5  # global_expert, src_rank, src_token, src_k, pad
MAX_REPORTED_MISMATCHES = 5


@dataclasses.dataclass
class MoEConfig:
    num_experts: int
    experts_per_token: int
    hidden_dim: int
    max_num_tokens: int
    in_dtype: torch.dtype = torch.float16
    out_dtype: torch.dtype = torch.float16


def rank_device(rank: int) -> torch.device:
    """cuda:rank on a GPU run (cuda:(rank mod GPUs) where ranks share GPUs, which the runner never does); the CPU
    when there is no GPU or the process group runs on gloo."""
    on_gloo = dist.is_available() and dist.is_initialized() and dist.get_backend() == "gloo"
    if torch.cuda.is_available() and not on_gloo:
        return torch.device(f"cuda:{rank % torch.cuda.device_count()}")
    return torch.device("cpu")


class RankTestData:
    """One rank's input. The generator is drawn in the official order: token count, one randperm per token,
    weights, x. The per-token randperm loop stays a loop: it is what fixes the random stream."""

    def __init__(self, cfg: MoEConfig, rng: torch.Generator, rank: int, device: torch.device | None = None):
        device = device or rank_device(rank)
        self.num_tokens = int(torch.randint(1, cfg.max_num_tokens, [1], generator=rng, device=device).item())
        self.indices = torch.empty(self.num_tokens, cfg.experts_per_token, dtype=torch.int32, device=device)
        for t in range(self.num_tokens):
            perm = torch.randperm(cfg.num_experts, generator=rng, device=device)
            self.indices[t] = perm[: cfg.experts_per_token]
        self.weights = torch.rand(
            self.num_tokens, cfg.experts_per_token, dtype=torch.float32, generator=rng, device=device
        )
        self.x = torch.randn(self.num_tokens, cfg.hidden_dim, dtype=cfg.in_dtype, generator=rng, device=device)


def _exchange(send: torch.Tensor, send_counts: torch.Tensor, recv_counts: torch.Tensor) -> torch.Tensor:
    """Non-uniform all-to-all of rows: `send_counts[r]` rows go to rank r, `recv_counts[r]` come from it."""
    recv = send.new_empty((int(recv_counts.sum().item()),) + tuple(send.shape[1:]))
    dist.all_to_all_single(
        recv, send, output_split_sizes=recv_counts.tolist(), input_split_sizes=send_counts.tolist()
    )
    return recv


def _exchange_counts(send_counts: torch.Tensor) -> torch.Tensor:
    recv_counts = torch.empty_like(send_counts)
    dist.all_to_all_single(recv_counts, send_counts)
    return recv_counts


class PyTorchAllToAll:
    """Dispatch and combine with torch.distributed collectives, in the official (pplx) layout and order."""

    META_DIM = META_DIM

    def __init__(self, cfg: MoEConfig, rank: int, world_size: int):
        self.cfg = cfg
        self.rank = rank
        self.world_size = world_size
        self.num_local_experts = cfg.num_experts // world_size
        self.max_recv = cfg.max_num_tokens * world_size

    def dispatch(self, dp_x: torch.Tensor, indices: torch.Tensor):
        """Returns (expert_num_tokens, expert_x, expert_meta) for this rank's local experts.

        Rows go out grouped by destination rank, token-major then k, as the official loop emits them; on arrival
        each local expert keeps them in arrival order."""
        cfg, device = self.cfg, dp_x.device
        topk = indices.shape[1]
        flat_expert = indices.reshape(-1).long()
        dst_rank = flat_expert // self.num_local_experts
        send_order = torch.argsort(dst_rank, stable=True)
        src_token = send_order // topk
        src_k = send_order % topk
        send_counts = torch.bincount(dst_rank, minlength=self.world_size)
        send_meta = torch.stack(
            [
                flat_expert[send_order],
                torch.full_like(src_token, self.rank),
                src_token,
                src_k,
                torch.zeros_like(src_token),
            ],
            dim=1,
        ).to(torch.int32)

        recv_counts = _exchange_counts(send_counts)
        recv_x = _exchange(dp_x[src_token], send_counts, recv_counts)
        recv_meta = _exchange(send_meta, send_counts, recv_counts)

        local_expert = recv_meta[:, 0].long() % self.num_local_experts
        expert_num_tokens = torch.bincount(local_expert, minlength=self.num_local_experts).to(torch.int32)
        arrival = torch.argsort(local_expert, stable=True)
        expert_start = torch.cumsum(expert_num_tokens, 0) - expert_num_tokens
        slot = torch.arange(arrival.numel(), device=device) - expert_start[local_expert[arrival]]

        expert_x = torch.empty(
            (self.num_local_experts, self.max_recv, cfg.hidden_dim), dtype=cfg.in_dtype, device=device
        )
        expert_meta = torch.empty((self.num_local_experts, self.max_recv, META_DIM), dtype=torch.int32, device=device)
        expert_x[local_expert[arrival], slot] = recv_x[arrival]
        expert_meta[local_expert[arrival], slot] = recv_meta[arrival]
        return expert_num_tokens, expert_x, expert_meta

    def combine(self, out_tokens, weights, expert_meta, expert_y, expert_num_tokens):
        """Sends expert outputs home and adds them into `out_tokens` (float16), one float32 product at a time in
        arrival order, as the official loop does. Tokens are independent, so the j-th arrival of every token is
        added in one vectorised step: the rounding sequence per token is unchanged."""
        device = out_tokens.device
        slot = torch.arange(expert_y.shape[1], device=device)
        valid = slot[None, :] < expert_num_tokens[:, None].long()
        send_meta_all = expert_meta[valid]  # expert-major, then slot: the official send order
        send_y_all = expert_y[valid]
        dst_rank = send_meta_all[:, 1].long()
        send_order = torch.argsort(dst_rank, stable=True)
        send_counts = torch.bincount(dst_rank, minlength=self.world_size)

        recv_counts = _exchange_counts(send_counts)
        recv_y = _exchange(send_y_all[send_order], send_counts, recv_counts)
        recv_meta = _exchange(send_meta_all[send_order], send_counts, recv_counts)

        src_token = recv_meta[:, 2].long()
        src_k = recv_meta[:, 3].long()
        products = recv_y.to(torch.float32) * weights[src_token, src_k].to(torch.float32)[:, None]
        by_token = torch.argsort(src_token, stable=True)
        counts = torch.bincount(src_token, minlength=out_tokens.shape[0])
        group_start = torch.cumsum(counts, 0) - counts
        arrival_index = torch.empty_like(src_token)
        arrival_index[by_token] = torch.arange(src_token.numel(), device=device) - group_start[src_token[by_token]]
        for j in range(int(counts.max().item()) if counts.numel() else 0):
            step = arrival_index == j
            rows = src_token[step]
            out_tokens[rows] = (out_tokens[rows].to(torch.float32) + products[step]).to(out_tokens.dtype)
        return out_tokens


def generate_input(num_experts, experts_per_token, hidden_dim, max_num_tokens, seed, rank, world_size, *, device=None):
    """One rank's input. `device` (keyword, the harness's): where to make it when that is not this process's rank
    device (the evaluator's own copy, made apart from the ranks); the same numbers as the rank makes there."""
    device = device or rank_device(rank)
    gen = torch.Generator(device=device)
    gen.manual_seed(seed + rank)
    cfg = MoEConfig(
        num_experts=num_experts,
        experts_per_token=experts_per_token,
        hidden_dim=hidden_dim,
        max_num_tokens=max_num_tokens,
        in_dtype=torch.float16,
        out_dtype=torch.float16,
    )
    return cfg, RankTestData(cfg, gen, rank, device), rank, world_size


def simulated_expert(expert_x: torch.Tensor, rank: int, out_dtype: torch.dtype) -> torch.Tensor:
    return expert_x.to(out_dtype) * (1 + rank)


def ref_kernel(data: input_t) -> output_t:
    cfg, rank_data, rank, world_size = data
    ata = PyTorchAllToAll(cfg, rank, world_size)
    expert_num, expert_x, expert_meta = ata.dispatch(rank_data.x, rank_data.indices)
    expert_y = simulated_expert(expert_x, rank, cfg.out_dtype)
    y = torch.zeros(cfg.max_num_tokens, cfg.hidden_dim, dtype=cfg.out_dtype, device=rank_data.x.device)
    ata.combine(y, rank_data.weights, expert_meta, expert_y, expert_num)
    return y[: rank_data.num_tokens]


def closed_form_output(data: input_t, on_cpu: bool = False) -> torch.Tensor:
    """The same result computed locally: y[t] = sum_k w[t,k] * fp16(x[t] * (1 + owner(indices[t,k]))),
    summed in float32. Differs from `ref_kernel` by float16 rounding of the running sum only. `on_cpu`: the
    check apart's form on a CPU, which has no float16 arithmetic: the expert's product taken once per owning rank
    in float32 and rounded to float16 (the same numbers: a float16 times an integer up to 1024 is exact in
    float32), then weighted by the sum of the token's weights that go to that rank (float32 sums in another order,
    well inside the check's tolerance)."""
    cfg, rank_data, _, world_size = data
    owner = rank_data.indices.long() // (cfg.num_experts // world_size)
    if on_cpu:  # one product per owning rank, weighted by the sum of the weights that go to it
        x = rank_data.x.to(torch.float32)
        y = torch.zeros(x.shape, dtype=torch.float32)
        for rank in owner.unique().tolist():
            weight = torch.where(owner == rank, rank_data.weights, 0.0).sum(dim=1)
            y += (x * (1 + rank)).to(cfg.out_dtype).to(torch.float32) * weight[:, None]
        return y.to(cfg.out_dtype)
    scale = (1 + owner).to(cfg.out_dtype)
    expert_out = rank_data.x.to(cfg.out_dtype)[:, None, :] * scale[:, :, None]
    y = (expert_out.to(torch.float32) * rank_data.weights[:, :, None]).sum(dim=1)
    return y.to(cfg.out_dtype)


def describe_mismatch(output: torch.Tensor, expected: torch.Tensor, rtol: float, atol: float) -> str:
    """Counts the elements outside tolerance and lists the first few; never prints whole tensors."""
    bad = ~torch.isclose(output, expected, rtol=rtol, atol=atol)
    positions = bad.nonzero()
    shown = ", ".join(
        f"{tuple(p.tolist())}: got {output[tuple(p)].item():.6g}, expected {expected[tuple(p)].item():.6g}"
        for p in positions[:MAX_REPORTED_MISMATCHES]
    )
    more = "" if positions.shape[0] <= MAX_REPORTED_MISMATCHES else ", ..."
    return f"{positions.shape[0]} of {output.numel()} elements differ (rtol={rtol}, atol={atol}): {shown}{more}"


def check_output(output, expected: torch.Tensor, rtol: float = 1e-2, atol: float = 5e-3):
    if not isinstance(output, torch.Tensor):
        return False, f"custom_kernel returned {type(output).__name__}, expected a torch.Tensor"
    if output.device != expected.device:
        return False, f"Output device mismatch: {output.device} != {expected.device}"
    if output.shape != expected.shape:
        return False, f"Output shape mismatch: {tuple(output.shape)} != {tuple(expected.shape)}"
    if output.dtype != expected.dtype:
        return False, f"Output dtype mismatch: {output.dtype} != {expected.dtype}"
    if not torch.allclose(output, expected, rtol=rtol, atol=atol):
        return False, "Output values mismatch: " + describe_mismatch(output, expected, rtol, atol)
    return True, ""


def check_implementation(data: input_t, output: output_t):
    return check_output(output, ref_kernel(data))
