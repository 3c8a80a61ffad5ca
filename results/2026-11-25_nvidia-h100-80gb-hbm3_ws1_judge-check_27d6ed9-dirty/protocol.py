"""The staged bundle of a version through the protocol face on this machine's GPU, at world size 1."""
import sys, time
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import os
from a2a.harness import run_protocol
import eval as core
version, out = sys.argv[1], Path(sys.argv[2])
bundle = out / f"bundle_{version}"
import subprocess
subprocess.run([sys.executable, "eval.py", "stage", version, str(bundle)], check=True)
(bundle / "t1.txt").write_text((bundle / "tests.txt").read_text().replace("world_size: 8", "world_size: 1"))
(bundle / "b1.txt").write_text("\n".join((bundle / "benchmarks.txt").read_text().replace("world_size: 8", "world_size: 1").splitlines()[:2]) + "\n")
env = {**os.environ, "POPCORN_GPUS": "1", "A2A_BACKEND": "nccl"}
for key in ("A2A_EXTRA", "A2A_RANK_PREFIX", "A2A_RENDEZVOUS"):
    env.pop(key, None)
for mode, f, extra in (("test", "t1.txt", {}), ("benchmark", "b1.txt", {}), ("leaderboard", "b1.txt", {"POPCORN_SEED": "31337"})):
    t0 = time.time()
    code, output, stderr = run_protocol(bundle, mode, f, {**env, **extra})
    print(f"== protocol {version} {mode}: exit {code} in {time.time() - t0:.0f} s")
    print(output)
    print(stderr[-3000:])
