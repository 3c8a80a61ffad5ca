#!/usr/bin/env python3
"""How fast this machine's CPUs run a rank's host work, CPU by CPU: whether the speed a pool draws is where it runs,
when it runs, or the process itself (issue #49, the ranking figure's spread).

The owner's step holds host work on both sides (the owner places, wakes and copies; the rank makes its inputs' views
and publishes its output), and on the H200 hosts that work's speed varied 2-3x from one pool to the next, the owner's
and the rank's apart (step anatomy, b04a593). Three measurements of one block of that kind of work (tensor views and
slices of a small CPU tensor, a dict, an attribute or two; `block_us`, the median over repeats):

- **by CPU**: one process moves from CPU to CPU (its affinity), `--passes` times over all of them, the second pass in
  reverse order: a CPU that is slow in both passes is slow where it is, one slow in a single pass was slow then;
- **fresh processes**: `--fresh` new processes, one after another, each pinned to the fastest CPU and then to the
  slowest: their spread on one CPU is the process's own draw (its memory, its caches);
- **loaded**: the same block on a few CPUs while a spinning process holds every other CPU, as spinning ranks and an
  owner do: a CPU that slows then shares a core, or its host's time, with another one.

    python -m a2a.cli cpu-speed [--passes 2] [--fresh 5] [--iterations 200] [--repeats 5] [--out results]
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import eval as core
from a2a import cli
from births import on_cpu
from a2a import plan as planning

LOADED_TARGETS = 4  # CPUs measured under load: the fastest, the slowest, and the ones nearest the median


def block_us(iterations: int, repeats: int) -> float:
    """The median over `repeats` of one block of host work (`iterations` rounds of it), µs per round."""
    import torch

    base = torch.zeros(1 << 16, dtype=torch.uint8)
    holder = type("Holder", (), {})()

    def rounds(count: int) -> None:
        for _ in range(count):
            views = {"x": base[256:8448].view(torch.float16).view(64, 64), "w": base[8448:8960].view(torch.float32)}
            holder.x, holder.w = views["x"][:17], views["w"][:17]
            holder.n = holder.x.shape[0] + holder.w.numel()

    rounds(max(10, iterations // 4))  # warm: the first calls of each path
    samples = []
    for _ in range(repeats):
        started = time.perf_counter_ns()
        rounds(iterations)
        samples.append((time.perf_counter_ns() - started) / iterations / 1e3)
    return statistics.median(samples)


def block_on(cpu: int, iterations: int, repeats: int) -> float:
    """block_us with this thread on `cpu` (births.on_cpu)."""
    with on_cpu(cpu):
        time.sleep(0.001)  # leave the old CPU before the clock starts
        return block_us(iterations, repeats)


def fresh_process(cpu: int, iterations: int, repeats: int) -> float:
    """block_us in a new process pinned to `cpu` from its start (it imports torch there); NaN if it fails."""
    child = subprocess.Popen([sys.executable, "-m", "tools.cpu_speed", "--one", str(cpu), "--iterations",
                              str(iterations), "--repeats", str(repeats)], cwd=core.HERE,
                             env=core.environ_with({"PYTHONPATH": str(core.HERE)}), preexec_fn=core.die_with_parent,
                             stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        out, _ = child.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()
        return math.nan
    return float(json.loads(out)["block_us"]) if child.returncode == 0 else math.nan


def under_load(targets: list, cpus: list, iterations: int, repeats: int) -> dict:
    """block_us on each of `targets`, a spinning process on every other CPU of `cpus` meanwhile."""
    found = {}
    for target in targets:
        spinners = [subprocess.Popen([sys.executable, "-c", f"import os\nos.sched_setaffinity(0, {{{cpu}}})\n"
                                      "while True:\n    pass\n"], preexec_fn=core.die_with_parent,
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                    for cpu in cpus if cpu != target]
        try:
            time.sleep(0.3)  # every spinner started and spinning
            found[target] = block_on(target, iterations, repeats)
        finally:
            for spinner in spinners:
                spinner.kill()
            for spinner in spinners:
                spinner.wait()
    return found


def _log_sd(values: list) -> float:
    values = [math.log(v) for v in values if v == v and v > 0]
    return statistics.pstdev(values) if len(values) > 1 else math.nan


def measure(passes: int, fresh: int, iterations: int, repeats: int) -> dict:
    cpus = sorted(os.sched_getaffinity(0))
    by_cpu = {cpu: [] for cpu in cpus}
    for number in range(passes):
        for cpu in cpus if number % 2 == 0 else reversed(cpus):
            by_cpu[cpu].append(block_on(cpu, iterations, repeats))
    mean_of = {cpu: statistics.fmean(values) for cpu, values in by_cpu.items()}
    ranked = sorted(cpus, key=mean_of.get)
    fastest, slowest = ranked[0], ranked[-1]
    fresh_runs = {cpu: [fresh_process(cpu, iterations, repeats) for _ in range(fresh)]
                  for cpu in dict.fromkeys((fastest, slowest))} if fresh else {}
    middle = sorted(ranked, key=lambda cpu: abs(mean_of[cpu] - statistics.median(mean_of.values())))
    targets = list(dict.fromkeys([fastest, slowest, *middle]))[:LOADED_TARGETS] if len(cpus) > 1 else []
    loaded = under_load(targets, cpus, iterations, repeats)
    pass_gaps = [abs(math.log(v[0] / v[-1])) for v in by_cpu.values() if len(v) > 1]
    return {"cpus": cpus, "by_cpu": {str(c): v for c, v in by_cpu.items()},
            "fresh": {str(c): v for c, v in fresh_runs.items()}, "loaded": {str(c): v for c, v in loaded.items()},
            "summary": {"across_cpus_log_sd": _log_sd(list(mean_of.values())),
                        "slowest_over_fastest": mean_of[slowest] / mean_of[fastest],
                        "pass_to_pass_median_log_gap": statistics.median(pass_gaps) if pass_gaps else math.nan,
                        "fresh_log_sd": {str(c): _log_sd(v) for c, v in fresh_runs.items()},
                        "loaded_over_alone": {str(c): v / mean_of[c] for c, v in loaded.items()}},
            "settings": {"passes": passes, "fresh": fresh, "iterations": iterations, "repeats": repeats}}


def report(found: dict, meta: dict) -> str:
    from tabulate import tabulate

    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), "unknown") if Path("/proc/cpuinfo").exists() else "unknown"
    rows = []
    for cpu in found["cpus"]:
        runs = found["by_cpu"][str(cpu)]
        rows.append({"CPU": cpu, **{f"pass {i + 1} µs": v for i, v in enumerate(runs)},
                     "loaded µs": found["loaded"].get(str(cpu), math.nan),
                     "fresh processes µs": ", ".join(f"{v:.2f}" for v in found["fresh"].get(str(cpu), []))})
    s = found["summary"]
    fresh = "; ".join(f"CPU {c}: SD of the log {v:.3f}" for c, v in s["fresh_log_sd"].items()) or "not measured"
    loaded = "; ".join(f"CPU {c}: {v:.2f}x" for c, v in s["loaded_over_alone"].items()) or "not measured (one CPU)"
    return "\n".join([
        f"# Host speed by CPU: {model}", "",
        f"{meta['device']}, {meta['date']}, commit {meta['commit']}; one block = {found['settings']['iterations']} "
        f"rounds of a rank's kind of host work, median of {found['settings']['repeats']} repeats, µs per round.", "",
        f"- Across CPUs: SD of the log {s['across_cpus_log_sd']:.3f}, the slowest {s['slowest_over_fastest']:.2f}x "
        f"the fastest.",
        f"- Pass to pass on one CPU: median gap {s['pass_to_pass_median_log_gap']:.3f} (log).",
        f"- Fresh processes on one CPU: {fresh}.",
        f"- Loaded (a spinner on every other CPU) over alone: {loaded}.", "",
        tabulate(rows, headers="keys", tablefmt="github", floatfmt=".2f")])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    cli.add_options(parser, "out")
    parser.add_argument("--passes", type=int, default=2)
    parser.add_argument("--fresh", type=int, default=5, help="fresh processes on each of the fastest and slowest CPU")
    parser.add_argument("--iterations", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)  # a fresh process's own measurement
    args = parser.parse_args(argv)
    for name, low in (("passes", 1), ("fresh", 0), ("iterations", 1), ("repeats", 1)):
        if getattr(args, name) < low:
            raise core.UserError(f"--{name} must be at least {low}, not {getattr(args, name)}")
    if args.one is not None:
        print(json.dumps({"block_us": block_on(args.one, args.iterations, args.repeats)}))
        return 0
    cli.writable(args.out)
    found = measure(args.passes, args.fresh, args.iterations, args.repeats)
    meta = planning.run_meta("gloo", 1, "cpu-speed")
    text = report(found, meta)
    print(text)

    def write(folder: Path) -> None:
        (folder / "cpu_speed.md").write_text(text + "\n")
        (folder / "cpu_speed.json").write_text(json.dumps({**meta, **found}, indent=1) + "\n")
    cli.save_run(args.out, meta, write)
    return 0


if __name__ == "__main__":
    sys.exit(cli.run_cli(main))
