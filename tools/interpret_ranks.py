"""A Triton version's kernel for several ranks on a CPU, under Triton's interpreter: one thread a rank, one program
each, every rank's symmetric heap in host memory (each rank's heap_bases names them all), calls run free (no barrier
between a rank's calls). What it shows without a GPU: each rank's output against the closed form, and whether any
wait gave up (the version's give-up word). Not a timing, and not the memory model: the interpreter runs each
program's operations in order and shares one memory.

    python -m tools.interpret_ranks v12 --shape 8,2,256,8 --calls 20 --local
    python -m tools.interpret_ranks v12 --shape 64,6,2048,8 --world-size 4 --programs 3 --seed 542

--programs P runs each rank's grid of P programs, one thread a program (program ids kept per thread): the waits
between a rank's programs and its peers' (a receiver's program q reads each source's program q) as on a GPU, and
a rank's next call only once all its programs are done (its stream's order).

--local keeps every token's rows on its own rank (rank 0 one token, the others all they may hold), so the ranks'
calls meet only through the flags that say "nothing for you": the case in which a rank can run a call ahead of a
peer (v7-v11 give up there; v12 keeps its range words by call parity). The line's vendor timers and back-off
(`_now_ns`, `_backoff`: inline assembly, which the interpreter cannot run) are stood in for by the host's clock
and a yield; a kernel whose NVIDIA branch holds other inline assembly for the shape runs its AMD branch instead.
Prints one JSON line a rank; exit 0 when every output and every expert's row count is right and no wait gave up, 1
otherwise, 112 when the file's import fails, 113 on bad input (a file with no Triton kernel all2all_kernel among them).
The file is imported in this process, as the user who runs it: a tool for code you trust (docs/judge.md).
"""
from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # before Triton is imported: the kernels are interpreted, not compiled

import argparse  # noqa: E402
import builtins  # noqa: E402
import functools  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
import triton.runtime.interpreter as interpreter  # noqa: E402

import wire  # noqa: E402
from a2a import cli, contract  # noqa: E402
from a2a import plan as planning  # noqa: E402

BAD_INPUT, IMPORT_FAILED = 113, 112


@triton.jit
def _host_now_ns(HIP: tl.constexpr):
    return tl.full([], time.monotonic_ns(), tl.int64)


@triton.jit
def _host_backoff(HIP: tl.constexpr):
    time.sleep(0)  # lets the other ranks' threads run


def _patches_kept() -> None:
    """The interpreter patches triton.language for each call and restores it at the call's end: with one thread a
    rank, one rank's end would pull the patches from under another's call. Patched once a module, kept."""
    real, kept, lock = interpreter._patch_lang, set(), threading.Lock()

    class _Kept:
        def restore(self) -> None:
            pass

    def patch_once(fn):
        with lock:
            if id(fn.__globals__) not in kept:
                kept.add(id(fn.__globals__))
                real(fn)
        return _Kept()

    interpreter._patch_lang = patch_once


def _program_ids_per_thread():
    """The interpreter keeps the running program's id and the grid in one builder shared by every thread: kept per
    thread instead, and a thread's own program id and grid size (set in `program`) win over the launch's (1, 1, 1)."""
    local = threading.local()
    builder = type(interpreter.interpreter_builder)

    def field(name: str):
        def get(self):
            own = getattr(local, "own_" + name, None)
            return own if own is not None else getattr(local, name, None)
        return property(get, lambda self, value: setattr(local, name, value))

    builder.grid_idx, builder.grid_dim = field("grid_idx"), field("grid_dim")

    def program(pid: int, programs: int) -> None:
        local.own_grid_idx, local.own_grid_dim = (pid, 0, 0), (programs, 1, 1)

    return program


def _as_int(value) -> int:
    """A loop bound the kernel computes (an interpreted scalar tensor) as a Python int."""
    return int(np.asarray(getattr(getattr(value, "handle", None), "data", value)).reshape(-1)[0])


def _inputs(reference, shape: dict, rank: int, world: int, local: bool, seed: int):
    """The rank's input as the runner draws it; with `local`, its tokens all go to its own experts."""
    data = reference.generate_input(**shape, seed=seed, rank=rank, world_size=world, device=torch.device("cpu"))
    return (planning.keep_rows_home(data) if local else data)[:2]


def run(module, reference, shape: dict, world: int, calls: int, local: bool, hip: bool, timeout_ns: int,
        programs: int, seed: int, program) -> list:
    """Each rank's (tokens, right, largest difference, counts right, give-up word, error) after `calls` calls: the
    output against the closed form, and the last call's rows per local expert (the kernel's counters, by call
    parity) against what the ranks' indices send it."""
    constants = module.constants(**shape, world_size=world, trace=False, hip=hip)
    layout = module.heap_layout(world, shape["max_num_tokens"], shape["hidden_dim"], shape["experts_per_token"])
    heaps = [torch.zeros(layout["total"], dtype=torch.uint8) for _ in range(world)]
    bases = torch.tensor([heap.data_ptr() for heap in heaps], dtype=torch.int64)
    local_experts = shape["num_experts"] // world
    inputs = [_inputs(reference, shape, rank, world, local, seed) for rank in range(world)]
    ranks = []
    for cfg, rank_data in inputs:
        ranks.append({"scratch": torch.zeros(2 * local_experts + 1, dtype=torch.int32),  # counters, then abandon
                      "report": torch.zeros(1, dtype=torch.int64),
                      "out": torch.zeros(cfg.max_num_tokens, cfg.hidden_dim, dtype=torch.float16),
                      "expert_meta": torch.zeros(local_experts * cfg.max_num_tokens * world, 4, dtype=torch.int32),
                      "route": torch.zeros(programs * constants["ROUTE_WORDS"], dtype=torch.int32),
                      "call_done": threading.Barrier(programs), "errors": []})
    found = [None] * world

    def program_thread(rank: int, pid: int) -> None:
        cfg, rank_data = inputs[rank]
        mine = ranks[rank]
        program(pid, programs)
        try:
            for epoch in range(1, calls + 1):
                module.all2all_kernel[(1,)](
                    rank_data.x, rank_data.indices, rank_data.weights, rank_data.num_tokens, epoch, mine["out"],
                    bases, mine["scratch"], mine["scratch"][2 * local_experts:], mine["expert_meta"], mine["route"],
                    mine["report"].data_ptr(), torch.zeros(1, dtype=torch.int64), rank, timeout_ns, **constants)
                mine["call_done"].wait()  # the rank's next call starts once every program of this one is done
        except threading.BrokenBarrierError:
            pass
        except Exception as failed:  # noqa: BLE001 - said in the rank's line
            mine["errors"].append(f"{type(failed).__name__}: {failed}"[:500])
            mine["call_done"].abort()

    threads = {(rank, pid): threading.Thread(target=program_thread, args=(rank, pid), daemon=True)
               for rank in range(world) for pid in range(programs)}
    for thread in threads.values():
        thread.start()
    for thread in threads.values():
        thread.join()
    for rank, (cfg, rank_data) in enumerate(inputs):
        mine = ranks[rank]
        if mine["errors"]:
            found[rank] = (0, False, float("nan"), False, 0, mine["errors"][0])
            continue
        got = mine["out"][:rank_data.num_tokens].float()
        want = reference.closed_form_output((cfg, rank_data, rank, world), on_cpu=True).float()
        routed = torch.cat([data.indices.reshape(-1).long() for _, data in inputs]) - rank * local_experts
        want_counts = torch.bincount(routed[(routed >= 0) & (routed < local_experts)], minlength=local_experts)
        half = (calls & 1) * local_experts
        counts = mine["scratch"][half:half + local_experts].long()
        found[rank] = (rank_data.num_tokens, bool(torch.allclose(got, want, rtol=1e-2, atol=5e-3)),
                       float((got - want).abs().max()) if got.numel() else 0.0, torch.equal(counts, want_counts),
                       int(mine["report"].item()), None)
    return found


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("version", help="a Triton version (v7 on): name or file")
    parser.add_argument("--shape", default="8,2,256,8", help="num_experts,experts_per_token,hidden_dim,max_tokens")
    cli.add_options(parser, "world-size", "seed",
                    world_size={"default": 2, "help": "ranks, one thread each (default: 2)"},
                    seed={"default": 7, "help": "the inputs' seed (default: 7)"})
    parser.add_argument("--calls", type=int, default=3)
    parser.add_argument("--local", action="store_true", help="every token's rows stay on its own rank")
    parser.add_argument("--programs", type=int, default=1, help="programs a rank, one thread each (default: 1)")
    parser.add_argument("--give-up-s", type=float, default=20.0,
                        help="seconds of the host's clock after which a wait gives up (the interpreter is slow)")
    args = parser.parse_args(argv)
    try:
        path = planning.resolve_version(args.version)
        numbers = [int(part) for part in args.shape.split(",")]
        if (len(numbers) != 4 or min(numbers) < 1 or args.world_size < 1 or args.calls < 1 or args.programs < 1
                or not args.give_up_s > 0):
            raise ValueError
    except planning.UserError as bad:
        print(f"tools/interpret_ranks.py: {bad}", file=sys.stderr)
        return BAD_INPUT
    except ValueError:
        print("tools/interpret_ranks.py: --shape takes four positive integers; --world-size, --calls, --programs and "
              "--give-up-s positive numbers", file=sys.stderr)
        return BAD_INPUT
    shape = dict(zip(("num_experts", "experts_per_token", "hidden_dim", "max_num_tokens"), numbers))
    if "TRITON_KERNELS" not in path.read_text(errors="replace") or shape["num_experts"] % args.world_size:
        print(f"tools/interpret_ranks.py: {path.name} is not a Triton version, or {shape['num_experts']} experts do "
              f"not split over {args.world_size} ranks", file=sys.stderr)
        return BAD_INPUT
    planning.use_bundle_modules()
    import reference

    _patches_kept()
    # NOTES: the file runs here, as the caller, outside any sandbox (docs/judge.md: tools for code you trust)
    try:
        module = planning.load_version(path, f"interpreted_{path.stem}")
    except Exception as error:
        print(f"tools/interpret_ranks.py: importing {path.name} failed: "
              f"{wire.as_text(f'{type(error).__name__}: {error}')}", file=sys.stderr)
        return IMPORT_FAILED
    if not hasattr(getattr(getattr(module, "all2all_kernel", None), "fn", None), "__globals__"):
        print(f"tools/interpret_ranks.py: {path.name} has no Triton kernel named all2all_kernel", file=sys.stderr)
        return BAD_INPUT
    names = module.all2all_kernel.fn.__globals__
    names["_now_ns"], names["_backoff"] = _host_now_ns, _host_backoff
    names["range"] = lambda *bounds: builtins.range(*map(_as_int, bounds))
    timeout_ns = int(args.give_up_s * 1e9)
    program = _program_ids_per_thread()
    runs = {hip: functools.partial(run, module, reference, shape, args.world_size, args.calls, args.local, hip,
                                   timeout_ns, args.programs, args.seed, program) for hip in (False, True)}
    found = runs[False]()
    if any(error and "inline_asm" in error for *_, error in found):
        found = runs[True]()
    for rank, (tokens, right, difference, counts_right, give_up, error) in enumerate(found):
        said = contract.describe_give_up(give_up, rank, timeout_ns // 10**6, path.stem) if give_up else None
        print(json.dumps({"rank": rank, "tokens": tokens, "right": right, "largest_difference": difference,
                          "counts_right": counts_right, "gave_up": said, "error": error}))
    return 0 if all(right and counts and not give_up and not error for _, right, _, counts, give_up, error in found) \
        else 1


if __name__ == "__main__":
    sys.exit(main())
