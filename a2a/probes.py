"""Device probes for the instrument: the timeline marker, clock alignment between GPUs, and the microbenchmarks the
speed-of-light model of this machine is built from.

- `stamp`: a one-thread kernel that writes the device clock: where the stream reached this point (timeline markers).
- `clock_offsets`: ping-pong between rank 0 and every other rank through peer memory; each GPU's clock offset from
  rank 0's, with its error bound (half the fastest round trip, at least one clock tick).
- `launch_cost_us`: empty kernels back to back. `one_way_latency_us`: a remote flag store seen by a spinning reader.
- `peer_store_gbps`: kernel-driven stores into peers' memory, every participant starting together (a barrier
  through peer flags inside the kernel), timed by the device clock from release to the last block's system fence.
- `handshake`: the least a correct multi-rank call does (the handshake row of the leaderboard tables): one launch
  that raises a flag at every peer and waits for every peer's flag, moving no data. Its launch takes no argument
  from Python (the kernel counts its own calls), so the host path is one extension call and one launch.

The device source follows the versions' portable prelude (CUDA dialect, hipified on ROCm); `make check-device`
compiles it for sm_90, gfx942 and gfx90a too.
"""
from __future__ import annotations

import functools
from typing import Optional

KERNELS = r"""
// ---------------------------------------------------------------------------------------------------------------
// Portable prelude: everything that differs between AMD (HIP after hipify) and NVIDIA (CUDA).
// ---------------------------------------------------------------------------------------------------------------
#include <stdint.h>
#if defined(__HIP_PLATFORM_AMD__)
#include <hip/hip_runtime.h>
#define A2A_WARP_SIZE 64
__device__ __forceinline__ int load_acquire_sys(const int* p) {
  return __hip_atomic_load(p, __ATOMIC_ACQUIRE, __HIP_MEMORY_SCOPE_SYSTEM);
}
__device__ __forceinline__ uint64_t load_acquire_sys(const uint64_t* p) {
  return __hip_atomic_load(p, __ATOMIC_ACQUIRE, __HIP_MEMORY_SCOPE_SYSTEM);
}
__device__ __forceinline__ void store_release_sys(int* p, int v) {
  __hip_atomic_store(p, v, __ATOMIC_RELEASE, __HIP_MEMORY_SCOPE_SYSTEM);
}
__device__ __forceinline__ void store_release_sys(uint64_t* p, uint64_t v) {
  __hip_atomic_store(p, v, __ATOMIC_RELEASE, __HIP_MEMORY_SCOPE_SYSTEM);
}
// s_memrealtime runs at a constant 100 MHz on MI300X.
__device__ __forceinline__ uint64_t realtime_ns() { return __builtin_amdgcn_s_memrealtime() * 10ull; }
static inline cudaError_t alloc_remote_buffer(void** ptr, size_t bytes) {
  return hipExtMallocWithFlags(ptr, bytes, hipDeviceMallocFinegrained);
}
#else
#include <cuda_runtime.h>
#define A2A_WARP_SIZE 32
__device__ __forceinline__ int load_acquire_sys(const int* p) {
  int v;
  asm volatile("ld.acquire.sys.global.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ uint64_t load_acquire_sys(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.acquire.sys.global.b64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void store_release_sys(int* p, int v) {
  asm volatile("st.release.sys.global.b32 [%0], %1;" :: "l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ void store_release_sys(uint64_t* p, uint64_t v) {
  asm volatile("st.release.sys.global.b64 [%0], %1;" :: "l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ uint64_t realtime_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
static inline cudaError_t alloc_remote_buffer(void** ptr, size_t bytes) { return cudaMalloc(ptr, bytes); }
#endif
// ---------------------------------------------------------------------------------------------------------------

#define PROBE_THREADS 512

// Probe heap layout (bytes from the heap base, the same on every rank).
//   ping      [64] uint64  slot = client rank; written by the client on the server's heap
//   pong      [64] uint64  slot = server rank; written by the server on the client's heap
//   pong_time [64] uint64  slot = server rank; the server's clock when it answered (written before pong)
//   arrive    [64] uint64  slot = arriving rank; the in-kernel barrier of peer_store
//   hand      [64] uint64  slot = the rank whose handshake call this is (its call count)
//   data      [world][bytes_per_peer]  slot = sending rank
// NOTES: every flag holds a sequence number that only grows (the host keeps the counters, identical on every rank),
// so nothing is ever reset.
#define OFF_PING 0
#define OFF_PONG 512
#define OFF_PONG_TIME 1024
#define OFF_ARRIVE 1536
#define OFF_HAND 2048
#define OFF_DATA 4096

__device__ __forceinline__ uint64_t* heap_word(const int64_t* heap_bases, int rank, int64_t offset, int slot) {
  return reinterpret_cast<uint64_t*>(heap_bases[rank] + offset) + slot;
}

__global__ void empty_kernel() {}

// The device clock when the stream reaches this kernel (a timeline marker).
__global__ void stamp_kernel(int64_t* out) {
  if (threadIdx.x == 0) *out = (int64_t)realtime_ns();
}

// The smallest step of the device clock seen in 64 changes.
__global__ void timer_step_kernel(int64_t* out) {
  if (threadIdx.x != 0) return;
  uint64_t smallest = ~0ull, last = realtime_ns();
  for (int changes = 0; changes < 64;) {
    const uint64_t now = realtime_ns();
    if (now != last) {
      smallest = now - last < smallest ? now - last : smallest;
      last = now;
      ++changes;
    }
  }
  *out = (int64_t)smallest;
}

struct PingParams {
  const int64_t* heap_bases;
  int rank, peer, rounds;
  uint64_t seq0;
  int64_t timeout_ns;
  int64_t* out;  // client: [rounds][3] (sent, server clock, back); a round that gave up holds -1
};

// One thread. Round i: stamp, ping the server, wait for its pong, stamp again.
__global__ void ping_client(PingParams p) {
  if (threadIdx.x != 0) return;
  uint64_t* server_ping = heap_word(p.heap_bases, p.peer, OFF_PING, p.rank);
  const uint64_t* pong = heap_word(p.heap_bases, p.rank, OFF_PONG, p.peer);
  const uint64_t* pong_time = heap_word(p.heap_bases, p.rank, OFF_PONG_TIME, p.peer);
  for (int i = 0; i < p.rounds; ++i) {
    const uint64_t seq = p.seq0 + i + 1;
    const uint64_t sent = realtime_ns();
    store_release_sys(server_ping, seq);
    bool answered = true;
    while (load_acquire_sys(pong) != seq) {
      if (realtime_ns() - sent > (uint64_t)p.timeout_ns) { answered = false; break; }
    }
    const uint64_t back = realtime_ns();
    p.out[3 * i] = answered ? (int64_t)sent : -1;
    p.out[3 * i + 1] = answered ? (int64_t)load_acquire_sys(pong_time) : -1;
    p.out[3 * i + 2] = answered ? (int64_t)back : -1;
    if (!answered) return;
  }
}

// One thread. Round i: wait for the client's ping, answer with this GPU's clock.
__global__ void ping_server(PingParams p) {
  if (threadIdx.x != 0) return;
  const uint64_t* ping = heap_word(p.heap_bases, p.rank, OFF_PING, p.peer);
  uint64_t* client_pong = heap_word(p.heap_bases, p.peer, OFF_PONG, p.rank);
  uint64_t* client_pong_time = heap_word(p.heap_bases, p.peer, OFF_PONG_TIME, p.rank);
  for (int i = 0; i < p.rounds; ++i) {
    const uint64_t seq = p.seq0 + i + 1;
    const uint64_t start = realtime_ns();
    while (load_acquire_sys(ping) != seq) {
      if (realtime_ns() - start > (uint64_t)p.timeout_ns) return;
    }
    *(volatile uint64_t*)client_pong_time = realtime_ns();
    store_release_sys(client_pong, seq);  // release: the clock value above is visible first
  }
}

struct StoreParams {
  const int64_t* heap_bases;
  const uint4* src;        // bytes_per_peer of local data, sent to every destination
  int rank, world;
  unsigned send_mask;      // ranks this rank writes to
  unsigned participants;   // ranks that run this kernel now (they start together)
  int64_t bytes_per_peer;  // a multiple of 16
  uint64_t epoch;          // grows by one per call, the same on every participant
  int* go;                 // local: block 0 releases the grid by writing the epoch
  int* done;               // local; NOTES: zero between calls (the last block resets it)
  int64_t* times;          // local [2]: release, last block's system fence (device clock); -1 on give-up
  int64_t timeout_ns;
};

__device__ __forceinline__ int nth_set_bit(unsigned mask, int n) {
  for (int bit = 0; bit < 32; ++bit) {
    if (mask >> bit & 1u) {
      if (n == 0) return bit;
      --n;
    }
  }
  return -1;
}

// Every participant's grid starts within a flag hop of the others, then writes bytes_per_peer to each destination
// in warp-sized runs of 16-byte stores, destinations interleaved so that every link is busy at once. The grid is at
// most one block per multiprocessor, so every block is resident while block 0 holds the others at `go`.
__global__ void __launch_bounds__(PROBE_THREADS) peer_store(StoreParams p) {
  __shared__ int started;
  if (threadIdx.x == 0) {
    started = 1;
    const uint64_t begin = realtime_ns();
    if (blockIdx.x == 0) {
      for (int r = 0; r < p.world; ++r)
        if (p.participants >> r & 1u) store_release_sys(heap_word(p.heap_bases, r, OFF_ARRIVE, p.rank), p.epoch);
      for (int r = 0; r < p.world && started; ++r) {
        if (!(p.participants >> r & 1u)) continue;
        while (load_acquire_sys(heap_word(p.heap_bases, p.rank, OFF_ARRIVE, r)) < p.epoch) {
          if (realtime_ns() - begin > (uint64_t)p.timeout_ns) { started = 0; break; }
        }
      }
      p.times[0] = started ? (int64_t)realtime_ns() : -1;
      store_release_sys(p.go, started ? (int)p.epoch : -(int)p.epoch);
    } else {
      int seen;
      while ((seen = load_acquire_sys(p.go)) != (int)p.epoch && seen != -(int)p.epoch) {
        if (realtime_ns() - begin > (uint64_t)p.timeout_ns) { seen = -(int)p.epoch; break; }
      }
      started = seen == (int)p.epoch;
    }
  }
  __syncthreads();
  if (started) {
    const int destinations = __popc(p.send_mask);
    const int64_t vectors = p.bytes_per_peer / 16;
    const int64_t runs_per_peer = (vectors + A2A_WARP_SIZE - 1) / A2A_WARP_SIZE;
    const int lane = threadIdx.x % A2A_WARP_SIZE;
    const int64_t warps = (int64_t)gridDim.x * (blockDim.x / A2A_WARP_SIZE);
    for (int64_t run = blockIdx.x * (blockDim.x / A2A_WARP_SIZE) + threadIdx.x / A2A_WARP_SIZE;
         run < runs_per_peer * destinations; run += warps) {
      const int dst = nth_set_bit(p.send_mask, (int)(run % destinations));
      const int64_t v = (run / destinations) * A2A_WARP_SIZE + lane;
      if (v < vectors) {
        uint4* out = reinterpret_cast<uint4*>(p.heap_bases[dst] + OFF_DATA + (int64_t)p.rank * p.bytes_per_peer);
        out[v] = p.src[v];
      }
    }
  }
  __threadfence_system();
  __syncthreads();
  if (threadIdx.x == 0 && atomicAdd(p.done, 1) == (int)gridDim.x - 1) {
    p.times[1] = started ? (int64_t)realtime_ns() : -1;
    *p.done = 0;
  }
}

struct HandshakeParams {
  const int64_t* heap_bases;
  int rank, world;
  uint64_t* calls;   // local: this rank's handshake calls so far (the kernel counts them; the same on every rank)
  int* gave_up;      // local: set once a wait gives up (then every later call gives up at once)
  int64_t timeout_ns;
};

// One block, a thread per peer: raise this call's flag at the peer, then wait for the peer's flag here.
// NOTES: flags hold a call count that only grows, so nothing is reset between calls.
__global__ void handshake_kernel(HandshakeParams p) {
  __shared__ uint64_t call;
  if (threadIdx.x == 0) call = *p.calls + 1;
  __syncthreads();
  const int peer = threadIdx.x;
  if (peer < p.world) {
    store_release_sys(heap_word(p.heap_bases, peer, OFF_HAND, p.rank), call);
    const uint64_t* mine = heap_word(p.heap_bases, p.rank, OFF_HAND, peer);
    const uint64_t begin = realtime_ns();
    while (load_acquire_sys(mine) < call) {
      if (*(volatile int*)p.gave_up || realtime_ns() - begin > (uint64_t)p.timeout_ns) {
        *(volatile int*)p.gave_up = 1;
        break;
      }
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) *p.calls = call;
}

// Host side: plain runtime calls, no torch. Return 0 or a runtime error code.
int probe_heap_alloc(void** base, size_t bytes) {
  cudaError_t err = alloc_remote_buffer(base, bytes);
  if (err == cudaSuccess) err = cudaMemset(*base, 0, bytes);  // sequence numbers start at 1
  return (int)err;
}
int probe_heap_export(void* base, cudaIpcMemHandle_t* handle) { return (int)cudaIpcGetMemHandle(handle, base); }
int probe_heap_import(void** base, cudaIpcMemHandle_t handle) {
  return (int)cudaIpcOpenMemHandle(base, handle, cudaIpcMemLazyEnablePeerAccess);
}
int probe_heap_unimport(void* base) { return (int)cudaIpcCloseMemHandle(base); }
int probe_heap_release(void* base) { return (int)cudaFree(base); }

int launch_empty(int count, cudaStream_t stream) {
  for (int i = 0; i < count; ++i) empty_kernel<<<1, 32, 0, stream>>>();
  return (int)cudaGetLastError();
}
int launch_stamp(int64_t* out, cudaStream_t stream) {
  stamp_kernel<<<1, 32, 0, stream>>>(out);
  return (int)cudaGetLastError();
}
int launch_timer_step(int64_t* out, cudaStream_t stream) {
  timer_step_kernel<<<1, 32, 0, stream>>>(out);
  return (int)cudaGetLastError();
}
int launch_ping(const PingParams& p, bool server, cudaStream_t stream) {
  // Braces: hipify rewrites a launch that follows `else` on the same line into an identifier (elsehipLaunch...).
  if (server) {
    ping_server<<<1, 32, 0, stream>>>(p);
  } else {
    ping_client<<<1, 32, 0, stream>>>(p);
  }
  return (int)cudaGetLastError();
}
int launch_peer_store(const StoreParams& p, int grid, cudaStream_t stream) {
  peer_store<<<grid, PROBE_THREADS, 0, stream>>>(p);
  return (int)cudaGetLastError();
}
int launch_handshake(const HandshakeParams& p, cudaStream_t stream) {
  handshake_kernel<<<1, 64, 0, stream>>>(p);
  return (int)cudaGetLastError();
}
"""

BINDING = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

static void check(int err, const char* what) {
  TORCH_CHECK(err == 0, "a2a probes: ", what, " failed: ", cudaGetErrorString((cudaError_t)err));
}

int64_t heap_create(int64_t bytes) {
  void* base = nullptr;
  check(probe_heap_alloc(&base, (size_t)bytes), "allocating the probe heap");
  return reinterpret_cast<int64_t>(base);
}

torch::Tensor heap_handle(int64_t base) {
  cudaIpcMemHandle_t handle;
  check(probe_heap_export(reinterpret_cast<void*>(base), &handle), "cudaIpcGetMemHandle");
  auto out = torch::empty({(int64_t)sizeof(handle)}, torch::kUInt8);
  memcpy(out.data_ptr(), &handle, sizeof(handle));
  return out;
}

int64_t heap_open(torch::Tensor handle_bytes) {
  cudaIpcMemHandle_t handle;
  TORCH_CHECK(handle_bytes.numel() == (int64_t)sizeof(handle), "a2a probes: bad IPC handle size");
  memcpy(&handle, handle_bytes.cpu().data_ptr(), sizeof(handle));
  void* base = nullptr;
  check(probe_heap_import(&base, handle), "cudaIpcOpenMemHandle");
  return reinterpret_cast<int64_t>(base);
}

int64_t heap_close(int64_t base) { return probe_heap_unimport(reinterpret_cast<void*>(base)); }
int64_t heap_free(int64_t base) { return probe_heap_release(reinterpret_cast<void*>(base)); }

static cudaStream_t stream() { return at::cuda::getCurrentCUDAStream(); }

void empty_kernels(int64_t count) { check(launch_empty((int)count, stream()), "launching empty kernels"); }

void stamp(torch::Tensor out) { check(launch_stamp(out.data_ptr<int64_t>(), stream()), "launching the stamp"); }

void timer_step(torch::Tensor out) {
  check(launch_timer_step(out.data_ptr<int64_t>(), stream()), "launching the timer step probe");
}

void ping(torch::Tensor heap_bases, int64_t rank, int64_t peer, int64_t seq0, int64_t rounds, int64_t timeout_ns,
          torch::Tensor out, bool server) {
  PingParams p;
  p.heap_bases = heap_bases.data_ptr<int64_t>();
  p.rank = (int)rank; p.peer = (int)peer; p.rounds = (int)rounds; p.seq0 = (uint64_t)seq0;
  p.timeout_ns = timeout_ns; p.out = out.data_ptr<int64_t>();
  check(launch_ping(p, server, stream()), "launching the ping-pong");
}

void peer_stores(torch::Tensor heap_bases, torch::Tensor src, int64_t rank, int64_t world, int64_t send_mask,
                 int64_t participants, int64_t bytes_per_peer, int64_t epoch, torch::Tensor scratch,
                 torch::Tensor times, int64_t timeout_ns, int64_t grid) {
  StoreParams p;
  p.heap_bases = heap_bases.data_ptr<int64_t>();
  p.src = reinterpret_cast<const uint4*>(src.data_ptr());
  p.rank = (int)rank; p.world = (int)world; p.send_mask = (unsigned)send_mask; p.participants = (unsigned)participants;
  p.bytes_per_peer = bytes_per_peer; p.epoch = (uint64_t)epoch;
  p.go = scratch.data_ptr<int>(); p.done = scratch.data_ptr<int>() + 1;
  p.times = times.data_ptr<int64_t>(); p.timeout_ns = timeout_ns;
  check(launch_peer_store(p, (int)grid, stream()), "launching the peer stores");
}

// The handshake's arguments and device, set once per group; the call itself takes none (the least a host path can
// pass). NOTES: it launches on its own device, as a version does from its inputs: the current device is the runner's
// cuda:0 in every rank (ranks 1-3 launched there at world size 4 and hit an illegal address).
static HandshakeParams handshake_params;
static int handshake_device = 0;

void handshake_setup(torch::Tensor heap_bases, int64_t rank, int64_t world, torch::Tensor calls,
                     torch::Tensor gave_up, int64_t timeout_ns) {
  TORCH_CHECK(world <= 64, "a2a probes: the handshake takes at most 64 ranks");
  handshake_params.heap_bases = heap_bases.data_ptr<int64_t>();
  handshake_params.rank = (int)rank; handshake_params.world = (int)world;
  handshake_params.calls = reinterpret_cast<uint64_t*>(calls.data_ptr<int64_t>());
  handshake_params.gave_up = gave_up.data_ptr<int>();
  handshake_params.timeout_ns = timeout_ns;
  handshake_device = heap_bases.device().index();
}

void handshake() {
  const at::cuda::CUDAGuard guard((c10::DeviceIndex)handshake_device);
  check(launch_handshake(handshake_params, stream()), "launching the handshake");
}
"""

CPP_DECLS = """
int64_t heap_create(int64_t bytes);
torch::Tensor heap_handle(int64_t base);
int64_t heap_open(torch::Tensor handle_bytes);
int64_t heap_close(int64_t base);
int64_t heap_free(int64_t base);
void empty_kernels(int64_t count);
void stamp(torch::Tensor out);
void timer_step(torch::Tensor out);
void ping(torch::Tensor heap_bases, int64_t rank, int64_t peer, int64_t seq0, int64_t rounds, int64_t timeout_ns,
          torch::Tensor out, bool server);
void peer_stores(torch::Tensor heap_bases, torch::Tensor src, int64_t rank, int64_t world, int64_t send_mask,
                 int64_t participants, int64_t bytes_per_peer, int64_t epoch, torch::Tensor scratch,
                 torch::Tensor times, int64_t timeout_ns, int64_t grid);
void handshake_setup(torch::Tensor heap_bases, int64_t rank, int64_t world, torch::Tensor calls,
                     torch::Tensor gave_up, int64_t timeout_ns);
void handshake();
"""

OFF_DATA = 4096
SPIN_TIMEOUT_NS = 5_000_000_000


@functools.lru_cache(maxsize=None)
def extension():
    """The probe extension, built once per machine (load_inline's cache)."""
    import torch
    from torch.utils.cpp_extension import load_inline

    return load_inline(name="a2a_probes", cpp_sources=CPP_DECLS, cuda_sources=[KERNELS, BINDING],
                       functions=["heap_create", "heap_handle", "heap_open", "heap_close", "heap_free",
                                  "empty_kernels", "stamp", "timer_step", "ping", "peer_stores", "handshake_setup",
                                  "handshake"],
                       extra_cuda_cflags=["-O3"] + ([] if torch.version.hip else ["-arch=sm_90"]), verbose=False)


class Probes:
    """One process group's probe heap (a collective to build: every rank at the same time). Sequence numbers of
    the ping-pong and of the store barrier are counted here, identically on every rank."""

    def __init__(self, rank: int, world_size: int, data_bytes_per_peer: int = 0):
        import torch
        import torch.distributed as dist

        import eval as core

        self.ext = extension()
        self.rank, self.world_size = rank, world_size
        self.device = core.rank_device(rank)
        self.data_bytes_per_peer = data_bytes_per_peer
        self.base = self.ext.heap_create(OFF_DATA + world_size * data_bytes_per_peer)
        mine = self.ext.heap_handle(self.base).to(self.device)
        handles = torch.empty(world_size, mine.numel(), dtype=torch.uint8, device=self.device)
        dist.all_gather_into_tensor(handles, mine)
        handles = handles.cpu()
        self.peers = {r: self.ext.heap_open(handles[r]) for r in range(world_size) if r != rank}
        self.heap_bases = torch.tensor([self.base if r == rank else self.peers[r] for r in range(world_size)],
                                       dtype=torch.int64, device=self.device)
        self.scratch = torch.zeros(2, dtype=torch.int32, device=self.device)
        self.ping_seq = {}  # (server, client) -> last sequence number used
        self.store_epoch = 0
        self.grid = torch.cuda.get_device_properties(self.device).multi_processor_count
        dist.barrier()

    def close(self) -> None:
        import torch
        import torch.distributed as dist

        torch.cuda.synchronize(self.device)
        dist.barrier()  # nobody still writes into a heap that is about to go
        for base in self.peers.values():
            self.ext.heap_close(base)
        self.ext.heap_free(self.base)

    def stamp(self, out) -> None:
        """Queues the marker kernel: `out` (an int64 element on this GPU) gets the device clock."""
        self.ext.stamp(out)

    def timer_step_ns(self) -> int:
        import torch

        out = torch.zeros(1, dtype=torch.int64, device=self.device)
        self.ext.timer_step(out)
        return int(out.item())

    def _ping(self, server: int, client: int, rounds: int):
        """Runs `rounds` round trips between `server` and `client` (both must call); returns the client's
        [rounds][3] (sent, server clock, back) on the client, None elsewhere."""
        import torch
        import torch.distributed as dist

        seq0 = self.ping_seq.get((server, client), 0)
        self.ping_seq[(server, client)] = seq0 + rounds
        out = torch.zeros(rounds, 3, dtype=torch.int64, device=self.device)
        dist.barrier()
        if self.rank in (server, client):
            peer = client if self.rank == server else server
            self.ext.ping(self.heap_bases, self.rank, peer, seq0, rounds, SPIN_TIMEOUT_NS, out, self.rank == server)
            torch.cuda.synchronize(self.device)
        dist.barrier()
        return out.cpu() if self.rank == client else None

    def clock_offsets(self, rounds: int = 200) -> list[dict]:
        """Per rank: offset_ns (this GPU's clock minus rank 0's) and error_ns (half the fastest round trip, at least
        one clock step). Every rank gets the whole list."""
        import torch.distributed as dist

        step = self.timer_step_ns()
        mine = {"offset_ns": 0.0, "error_ns": 0.0, "timer_step_ns": step}
        for client in range(1, self.world_size):
            trips = self._ping(0, client, rounds)
            if trips is None:
                continue
            good = trips[trips[:, 0] >= 0]
            if not len(good):
                raise RuntimeError(f"clock alignment: rank 0 never answered rank {client}")
            rtt = (good[:, 2] - good[:, 0]).double()
            fastest = good[rtt <= rtt.min() + step]
            offsets = (fastest[:, 0] + fastest[:, 2]).double() / 2 - fastest[:, 1].double()
            mine = {"offset_ns": float(offsets.median()), "error_ns": max(float(rtt.min()) / 2, step),
                    "timer_step_ns": step}
        gathered = [None] * self.world_size
        dist.all_gather_object(gathered, mine)
        return gathered

    def one_way_latency_us(self, rounds: int = 2000) -> float:
        """Rank 1 pings rank 0 `rounds` times: the whole loop over 2 x rounds hops (rank 1's answer; NaN elsewhere)."""
        trips = self._ping(0, 1, rounds)
        if trips is None:
            return float("nan")
        if int(trips[-1, 0]) < 0:
            raise RuntimeError("latency probe: rank 0 stopped answering")
        return float(trips[-1, 2] - trips[0, 0]) / (2 * rounds) / 1e3

    def launch_cost_us(self, count: int = 2000) -> float:
        """Device time per empty kernel launched back to back (events around `count` launches)."""
        import torch

        self.ext.empty_kernels(100)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        self.ext.empty_kernels(count)
        end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1e3 / count

    def peer_store_gbps(self, senders: list[int], receivers_of: dict, bytes_per_peer: int, repeats: int = 5) -> float:
        """Every rank in `senders` writes bytes_per_peer into each of its receivers_of[rank] at the same time;
        returns this rank's best rate (GB/s, bytes it sent over device time), NaN on a rank that sends nothing.
        A collective: every rank calls it."""
        import torch
        import torch.distributed as dist

        if bytes_per_peer % 16 or bytes_per_peer > self.data_bytes_per_peer:
            raise ValueError(f"bytes_per_peer must be a multiple of 16 and at most {self.data_bytes_per_peer}")
        participants = sum(1 << r for r in senders) | sum(1 << d for r in senders for d in receivers_of[r])
        src = torch.randint(0, 2**15, (bytes_per_peer // 2,), dtype=torch.int16, device=self.device)
        times = torch.zeros(2, dtype=torch.int64, device=self.device)
        best = float("nan")
        for _ in range(repeats):
            self.store_epoch += 1
            dist.barrier()
            if participants >> self.rank & 1:
                mask = sum(1 << d for d in receivers_of.get(self.rank, []))
                self.ext.peer_stores(self.heap_bases, src, self.rank, self.world_size, mask, participants,
                                     bytes_per_peer, self.store_epoch, self.scratch, times, SPIN_TIMEOUT_NS, self.grid)
                torch.cuda.synchronize(self.device)
                start, end = times.tolist()
                if start < 0 or end < 0:
                    raise RuntimeError(f"peer store probe: rank {self.rank} gave up waiting for its peers")
                if mask:
                    rate = bin(mask).count("1") * bytes_per_peer / (end - start)  # bytes per ns = GB/s
                    best = rate if best != best else max(best, rate)
            dist.barrier()
        return best


class Handshake:
    """The handshake row's call on one process group's probe heap (a collective to build and to close). Every
    call raises this rank's flag at every peer and returns once every peer's flag of the same call is in, then
    returns a preallocated output (`returning(out)`: a call for one case's output shape), like the empty
    submission. NOTES: the kernel's arguments are set once per process (the call passes none, the least a host
    path can pass), so one Handshake lives in a process at a time, shared by every case."""

    live = False

    def __init__(self, rank: int, world_size: int):
        import torch

        if Handshake.live:
            raise RuntimeError("a2a probes: one Handshake per process at a time (the kernel's arguments are global)")
        self.probes = Probes(rank, world_size)
        device = self.probes.device
        self.calls = torch.zeros(1, dtype=torch.int64, device=device)
        self.gave_up = torch.zeros(1, dtype=torch.int32, device=device)
        self.probes.ext.handshake_setup(self.probes.heap_bases, rank, world_size, self.calls, self.gave_up,
                                        SPIN_TIMEOUT_NS)
        Handshake.live = True

    def launch(self) -> None:
        """One handshake on this rank's device's current stream."""
        self.probes.ext.handshake()

    def returning(self, out):
        launch = self.probes.ext.handshake

        def call(_data):
            launch()
            return out

        return call

    def close(self) -> None:
        """Frees the heap; raises if any call gave up waiting for a peer (the row is then not a floor)."""
        gave_up = int(self.gave_up.item())
        self.probes.close()
        Handshake.live = False
        if gave_up:
            raise RuntimeError(f"the handshake of rank {self.probes.rank} gave up waiting for a peer")


def peer_handshake(rank: int, world_size: int) -> Optional[Handshake]:
    """The handshake whose flag round starts every rank's held (or traced) call together, where each rank has a GPU
    of its own (a2a/clock.py, a2a/timeline.py); None at one rank, on a CPU, or where ranks share GPUs."""
    import torch

    import eval as core

    if world_size < 2 or core.rank_device(rank).type != "cuda" or torch.cuda.device_count() < world_size:
        return None
    with core.own_device(rank):
        return Handshake(rank, world_size)


def local_copy_gbps(device, megabytes: int = 1024, repeats: int = 10) -> float:
    """Device-to-device copy through PyTorch: bytes read plus bytes written over device time, best of `repeats`."""
    import torch

    src = torch.empty(megabytes << 20, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    best = 0.0
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        best = max(best, 2 * src.numel() / (start.elapsed_time(end) * 1e6))
    return best

