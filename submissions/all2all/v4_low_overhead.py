#!POPCORN leaderboard amd-all2all
#!POPCORN gpu MI300x8
"""v4 - nothing in the hot path that need not be there.

From v3, one idea: a call costs one Python line, one extension call and one kernel launch. v3's breakdown (WORKLOG)
showed the GPU idle for most of a small call: Python building the parameter block, an output allocation, a memset,
four launches with a gap before each. Now:
- per call: no allocation (the output is a view of a buffer made with the group's state), no memset (block 0 of the
  kernel zeroes the expert counts; every other counter is reset by the kernel that used it), no host sync, and one
  extension call that takes the three input tensors and the token count; the parameter block is built in C++ from a
  state object made once per group and shape;
- one persistent kernel instead of four: dispatch-send, then dispatch-recv + expert + combine-send one row at a time
  (a warp lays out a received row, scales it and sends it home in one pass), then combine-recv. The kernel
  boundaries gave grid-wide order that no step needs: every wait is already a flag. The grid is capped at what can be
  resident at once, since blocks wait on flags that other blocks raise;
- a CUDA/HIP graph path (USE_GRAPH): the launch captured once, the parameter block patched in per call. Measured
  against the plain launch (WORKLOG); the plain launch is the default.

Dispatch writes every (token, k) row into its owner's receive slots on the owner's heap, with a per-slot flag raised by
a system-scope release store; the last block to finish sending publishes the per-destination row counts. The receive
part waits for the counts and each slot's flag (acquire), lays the row out per local expert, scales it and writes it
back into the source rank's heap, flagged the same way; the combine part waits for the top-k results of each token
and sums them with the weights in float32.

Flags carry the call's sequence number (epoch), so no flag is ever reset: a stale value from an earlier call never
equals the current epoch. Every rank makes the same calls in a process group, so epochs agree across ranks.

The device source is CUDA with a small portable prelude (the only place where AMD and NVIDIA differ); PyTorch
hipifies it when `load_inline` runs on ROCm. KERNELS holds no torch headers (it is what `make check-device`
compiles for sm_90, gfx940 and gfx90a); BINDING is the thin torch layer.

Trace build (A2A_TRACE=1 at import; its own extension name, so the timed build never contains probes): the kernels
record (phase, block, warp, start, end) with the device clock into a per-rank buffer that `trace_take()` reads;
`python eval.py trace v4` turns them into a timeline.
"""
import ctypes
import inspect
import os
import sys
import threading
import time

import torch
import torch.distributed as dist
from torch.utils.cpp_extension import load_inline

from task import input_t, output_t

KERNELS = r"""
// ---------------------------------------------------------------------------------------------------------------
// Portable prelude: everything that differs between AMD (HIP after hipify) and NVIDIA (CUDA).
// ---------------------------------------------------------------------------------------------------------------
#include <stdint.h>
#include <stdio.h>
#if defined(__HIP_PLATFORM_AMD__)
#include <hip/hip_runtime.h>
#include <hip/hip_fp16.h>
#define A2A_WARP_SIZE 64
__device__ __forceinline__ void warp_sync() { __builtin_amdgcn_wave_barrier(); }
__device__ __forceinline__ int warp_broadcast(int value, int lane) { return __shfl(value, lane); }
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
// Remotely accessed memory is fine-grained on AMD: coherent across devices, so peers' stores are seen.
static inline cudaError_t alloc_remote_buffer(void** ptr, size_t bytes) {
  return hipExtMallocWithFlags(ptr, bytes, hipDeviceMallocFinegrained);
}
static inline hipError_t instantiate_graph(hipGraphExec_t* exec, hipGraph_t graph) {
  return hipGraphInstantiate(exec, graph, nullptr, nullptr, 0);
}
typedef hipKernelNodeParams kernel_node_params_t;  // PyTorch's hipify does not rename this type
#else
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#define A2A_WARP_SIZE 32
__device__ __forceinline__ void warp_sync() { __syncwarp(); }
__device__ __forceinline__ int warp_broadcast(int value, int lane) { return __shfl_sync(0xffffffffu, value, lane); }
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
static inline cudaError_t instantiate_graph(cudaGraphExec_t* exec, cudaGraph_t graph) {
  return cudaGraphInstantiate(exec, graph, 0);
}
typedef cudaKernelNodeParams kernel_node_params_t;
#endif
// ---------------------------------------------------------------------------------------------------------------

#define A2A_MAX_THREADS 1024

// Heap layout, identical on every rank (offsets in bytes from the heap base), defined here once: Python sizes the
// heap with heap_regions(); the kernels find each region through it. `slots` = max_tokens * topk: the most rows one
// source can send to one destination. Rows are `hidden` halves.
//   disp_x    [world][slots] rows    written by the source (dispatch-send), read by this rank
//   comb_y    [world][slots] rows    written by the expert's rank (combine-send), read by this rank
//   disp_meta [world][slots] int4    (token, k, global expert, 0), written with disp_x
//   disp_flag [world][slots] int     = epoch once the slot's row and meta are in place
//   comb_flag [world][slots] int     = epoch once comb_y's row is in place
//   disp_count[world]        uint64  = (epoch << 32) | rows sent by that source this call
struct HeapLayout {
  int64_t disp_x, comb_y, disp_meta, disp_flag, comb_flag, disp_count, total;
};
static inline HeapLayout heap_layout(int world, int slots, int hidden) {
  HeapLayout l;
  int64_t at = 0;
  auto take = [&at](int64_t bytes) { const int64_t here = at; at += (bytes + 255) / 256 * 256; return here; };
  const int64_t region = (int64_t)world * slots;
  l.disp_x = take(region * hidden * 2);
  l.comb_y = take(region * hidden * 2);
  l.disp_meta = take(region * 16);
  l.disp_flag = take(region * 4);
  l.comb_flag = take(region * 4);
  l.disp_count = take((int64_t)world * 8);
  l.total = at;
  return l;
}

// Local scratch (int32 words, zeroed once when the group's state is built), defined here once like the heap.
struct ScratchLayout {
  int64_t send_counter, blocks_done, expert_count, pair_slot, pair_dst, abandon, total;
};
static inline ScratchLayout scratch_layout(int world, int num_local_experts, int slots) {
  ScratchLayout l;
  int64_t at = 0;
  auto take = [&at](int64_t words) { const int64_t here = at; at += words; return here; };
  l.send_counter = take(world);
  l.blocks_done = take(1);
  l.expert_count = take(num_local_experts);
  l.pair_slot = take(slots);
  l.pair_dst = take(slots);
  l.abandon = take(1);
  l.total = at;
  return l;
}

struct A2AParams {
  const __half* x;
  const int* indices;
  const float* weights;
  __half* out;
  const int64_t* heap_bases;
  HeapLayout heap;
  int* send_counter;   // [world] local; NOTES: zero between calls (the last block to finish sending resets it)
  int* blocks_done;    // [1] local;     NOTES: zero between calls (the last block to finish sending resets it)
  int* pair_slot;      // [tokens * topk] local: slot each pair got on its destination
  int* pair_dst;       // [tokens * topk] local: destination rank of each pair
  int* expert_count;   // [local experts] local; NOTES: zeroed by block 0 while sending, before the counts go out
                       // (no receiving warp can count before every block has sent)
  __half* expert_x;    // [local experts][capacity] rows: the dispatch output a grouped GEMM would read
  int4* expert_meta;   // [local experts][capacity] (src rank, slot, token, k)
  uint64_t* report;    // mapped pinned host word: the first wait that gives up writes its record here
  int* abandon;        // [1] local; NOTES: set once by the first wait that gives up, never reset: every later wait
                       // of this group returns at once (the group's data is no longer trustworthy)
  int num_tokens, topk, hidden, num_local_experts, rank, world, slots, capacity, epoch;
  int64_t timeout_ns;
};

template <typename T>
__device__ __forceinline__ T* on_rank(const A2AParams& p, int rank, int64_t offset) {
  return reinterpret_cast<T*>(p.heap_bases[rank] + offset);
}

__device__ __forceinline__ int lane_id() { return threadIdx.x % A2A_WARP_SIZE; }
// Warps are counted from the launch shape, which is chosen at run time.
__device__ __forceinline__ int global_warp() {
  return blockIdx.x * (blockDim.x / A2A_WARP_SIZE) + threadIdx.x / A2A_WARP_SIZE;
}
__device__ __forceinline__ int total_warps() { return gridDim.x * (blockDim.x / A2A_WARP_SIZE); }

// Timeline probes: compiled only with -DA2A_TRACE. A record is (phase, block << 16 | warp, start ns, end ns) in a
// per-rank buffer whose first word counts the records; phase names are TRACE_PHASES in Python, in this order.
#if defined(A2A_TRACE)
enum TracePhase {
  PH_KERNEL, PH_SEND_ROW, PH_PUBLISH_COUNTS, PH_WAIT_COUNTS, PH_WAIT_ROW_FLAG, PH_ROW_IN_AND_HOME, PH_WAIT_COMBINED,
  PH_REDUCE
};
__device__ int64_t* a2a_trace_buffer;
__device__ int a2a_trace_capacity;
__device__ __forceinline__ void trace_record(int phase, uint64_t start) {
  const uint64_t end = realtime_ns();
  const unsigned long long i = atomicAdd(reinterpret_cast<unsigned long long*>(a2a_trace_buffer), 1ull);
  if (i < (unsigned long long)a2a_trace_capacity) {
    int64_t* record = a2a_trace_buffer + 1 + 4 * i;
    record[0] = phase;
    record[1] = ((int64_t)blockIdx.x << 16) | (threadIdx.x / A2A_WARP_SIZE);
    record[2] = (int64_t)start;
    record[3] = (int64_t)end;
  }
}
int trace_attach_buffer(int64_t* buffer, int capacity) {
  cudaError_t err = cudaMemcpyToSymbol(a2a_trace_buffer, &buffer, sizeof(buffer));
  if (err == cudaSuccess) err = cudaMemcpyToSymbol(a2a_trace_capacity, &capacity, sizeof(capacity));
  return (int)err;
}
#define TRACE_NOW(name) const uint64_t name = realtime_ns()
#define TRACE_WARP(phase, start) do { if (lane_id() == 0) trace_record(phase, start); } while (0)
#define TRACE_BLOCK(phase, start) do { if (threadIdx.x == 0) trace_record(phase, start); } while (0)
#define TRACE_BLOCK_END(phase, start) do { __syncthreads(); TRACE_BLOCK(phase, start); } while (0)
#else
#define TRACE_NOW(name)
#define TRACE_WARP(phase, start)
#define TRACE_BLOCK(phase, start)
#define TRACE_BLOCK_END(phase, start)
#endif

// Spin-waits give up after timeout_ns instead of hanging the GPU. The first one to give up raises `abandon` and
// stores one packed record of what it waited for into mapped host memory, where a host thread reads it; every
// other wait then returns at once, the kernels finish (with wrong data) and the context stays usable.
enum WaitKind { WAIT_COUNT = 1, WAIT_DISPATCHED_ROW = 2, WAIT_COMBINED_ROW = 3 };

__device__ bool abandoned(const A2AParams& p) { return *(volatile int*)p.abandon != 0; }

// `leader`: the one thread of the waiting group (a warp's lane 0, or a lone thread) that records.
__device__ void give_up(const A2AParams& p, bool leader, int kind, int peer, int slot) {
  if (leader && atomicExch(p.abandon, 1) == 0) {
    // [63:60] kind | [59:52] peer | [51:28] slot + 1 | [27:0] epoch
    const uint64_t record = ((uint64_t)kind << 60) | ((uint64_t)(peer & 0xff) << 52) |
                            ((uint64_t)((slot + 1) & 0xffffff) << 28) | (uint64_t)(p.epoch & 0xfffffff);
    store_release_sys(p.report, record);
    __threadfence_system();
  }
}

__device__ void wait_flag(const A2AParams& p, const int* flag, int kind, int peer, int slot) {
  if (load_acquire_sys(flag) == p.epoch) return;
  const uint64_t start = realtime_ns();
  while (load_acquire_sys(flag) != p.epoch) {
    if (abandoned(p)) return;
    if (realtime_ns() - start > (uint64_t)p.timeout_ns) return give_up(p, lane_id() == 0, kind, peer, slot);
  }
}

// Waited on by single threads (one per source rank).
__device__ int wait_count(const A2AParams& p, const uint64_t* word, int peer) {
  uint64_t seen = load_acquire_sys(word);
  const uint64_t start = realtime_ns();
  while ((int)(seen >> 32) != p.epoch) {
    if (abandoned(p)) return 0;
    if (realtime_ns() - start > (uint64_t)p.timeout_ns) {
      give_up(p, true, WAIT_COUNT, peer, -1);
      return 0;
    }
    seen = load_acquire_sys(word);
  }
  return (int)(seen & 0xffffffffu);
}

// Copies one row (hidden halves, a multiple of 8) with 16-byte accesses spread over the warp's lanes.
__device__ __forceinline__ void copy_row(__half* dst, const __half* src, int hidden) {
  const uint4* s = reinterpret_cast<const uint4*>(src);
  uint4* d = reinterpret_cast<uint4*>(dst);
  for (int i = lane_id(); i < hidden / 8; i += A2A_WARP_SIZE) d[i] = s[i];
}

// One pass over a received row: the dispatch layout gets it as is, and the expert's output fp16(src * scale) goes
// home; 16 bytes per lane access, float math rounded once (what v2's separate pass computed, bit for bit).
__device__ __forceinline__ void lay_out_and_send_home(__half* layout, __half* home, const __half* src, int hidden,
                                                      float scale) {
  const uint4* s = reinterpret_cast<const uint4*>(src);
  uint4* l = reinterpret_cast<uint4*>(layout);
  uint4* h = reinterpret_cast<uint4*>(home);
  for (int i = lane_id(); i < hidden / 8; i += A2A_WARP_SIZE) {
    uint4 packed = s[i];
    l[i] = packed;
    __half2* halves = reinterpret_cast<__half2*>(&packed);
    for (int j = 0; j < 4; ++j) {
      const float2 f = __half22float2(halves[j]);
      halves[j] = __floats2half2_rn(f.x * scale, f.y * scale);
    }
    h[i] = packed;
  }
}

// Reads a word another block of this kernel wrote (the L1 of this multiprocessor may hold an older copy).
__device__ __forceinline__ int load_fresh(const int* p) { return *(const volatile int*)p; }

// Makes the warp's row writes visible system-wide, then raises the flag (one lane, release).
__device__ __forceinline__ void publish(int* flag, int epoch) {
  __threadfence_system();
  warp_sync();
  if (lane_id() == 0) store_release_sys(flag, epoch);
}

// Reads the per-source counts into shared memory (waiting for this call's epoch); returns the total.
__device__ int gather_counts(const A2AParams& p, int* counts) {
  if (threadIdx.x < p.world)
    counts[threadIdx.x] = wait_count(p, on_rank<uint64_t>(p, p.rank, p.heap.disp_count) + threadIdx.x, threadIdx.x);
  __syncthreads();
  int total = 0;
  for (int r = 0; r < p.world; ++r) total += counts[r];
  return total;
}

// One call, one kernel, three parts. The parts meet only through flags, so no grid-wide barrier stands between
// them; every block must be resident (the host caps the grid), because warps wait on flags that other blocks raise.
// NOTES: per call, every flag a part waits on carries this call's epoch; nothing is ever reset but the counters
// noted in A2AParams, each by the kernel that used it.
__global__ void __launch_bounds__(A2A_MAX_THREADS) all2all_kernel(A2AParams p) {
  TRACE_NOW(t_kernel);
  const int warp = global_warp();
  const int num_warps = total_warps();
  // Part 1, dispatch: every (token, k) row into its expert's rank, flagged.
  if (blockIdx.x == 0)
    for (int e = threadIdx.x; e < p.num_local_experts; e += blockDim.x) p.expert_count[e] = 0;
  for (int pair = warp; pair < p.num_tokens * p.topk; pair += num_warps) {
    TRACE_NOW(t_row);
    const int token = pair / p.topk, k = pair % p.topk;
    const int expert = p.indices[pair];
    const int dst = expert / p.num_local_experts;
    int slot = 0;
    if (lane_id() == 0) slot = atomicAdd(&p.send_counter[dst], 1);
    slot = warp_broadcast(slot, 0);
    const int64_t index = (int64_t)p.rank * p.slots + slot;  // this rank's region on dst
    copy_row(on_rank<__half>(p, dst, p.heap.disp_x) + index * p.hidden, p.x + (int64_t)token * p.hidden, p.hidden);
    if (lane_id() == 0) {
      on_rank<int4>(p, dst, p.heap.disp_meta)[index] = make_int4(token, k, expert, 0);
      p.pair_slot[pair] = slot;
      p.pair_dst[pair] = dst;
    }
    publish(on_rank<int>(p, dst, p.heap.disp_flag) + index, p.epoch);
    TRACE_WARP(PH_SEND_ROW, t_row);
  }
  // The last block to finish sending knows the final per-destination counts and publishes them.
  __syncthreads();
  __shared__ int is_last;
  if (threadIdx.x == 0) {
    __threadfence();
    is_last = atomicAdd(p.blocks_done, 1) == (int)gridDim.x - 1;
  }
  __syncthreads();
  if (is_last && threadIdx.x < p.world) {
    TRACE_NOW(t_counts);
    const int dst = threadIdx.x;
    const int count = atomicAdd(&p.send_counter[dst], 0);
    store_release_sys(on_rank<uint64_t>(p, dst, p.heap.disp_count) + p.rank, ((uint64_t)p.epoch << 32) | (uint32_t)count);
    p.send_counter[dst] = 0;
    if (dst == 0) *p.blocks_done = 0;
    TRACE_BLOCK(PH_PUBLISH_COUNTS, t_counts);
  }

  // Part 2, receive + expert + send home, one warp per received row, over one index space of all sources.
  TRACE_NOW(t_counts_wait);
  __shared__ int counts[64];
  const int total = gather_counts(p, counts);
  TRACE_BLOCK(PH_WAIT_COUNTS, t_counts_wait);
  const int first_expert = p.rank * p.num_local_experts;
  const float scale = 1.0f + p.rank;  // the simulated expert
  for (int arrival = warp; arrival < total; arrival += num_warps) {
    int src = 0, slot = arrival;
    while (slot >= counts[src]) slot -= counts[src++];
    const int64_t index = (int64_t)src * p.slots + slot;
    TRACE_NOW(t_wait);
    wait_flag(p, on_rank<int>(p, p.rank, p.heap.disp_flag) + index, WAIT_DISPATCHED_ROW, src, slot);
    TRACE_WARP(PH_WAIT_ROW_FLAG, t_wait);
    TRACE_NOW(t_row);
    const int4 meta = on_rank<int4>(p, p.rank, p.heap.disp_meta)[index];
    const int local = meta.z - first_expert;
    int position = 0;
    if (lane_id() == 0) position = atomicAdd(&p.expert_count[local], 1);
    position = warp_broadcast(position, 0);
    const int64_t row = (int64_t)local * p.capacity + position;
    const int64_t home = (int64_t)p.rank * p.slots + slot;  // this rank's region on the source
    lay_out_and_send_home(p.expert_x + row * p.hidden, on_rank<__half>(p, src, p.heap.comb_y) + home * p.hidden,
                          on_rank<__half>(p, p.rank, p.heap.disp_x) + index * p.hidden, p.hidden, scale);
    if (lane_id() == 0) p.expert_meta[row] = make_int4(src, slot, meta.x, meta.y);
    publish(on_rank<int>(p, src, p.heap.comb_flag) + home, p.epoch);
    TRACE_WARP(PH_ROW_IN_AND_HOME, t_row);
  }

  // Part 3, combine: one warp per token waits for its top-k results and sums them with the weights in float32.
  const __half* comb_y = on_rank<__half>(p, p.rank, p.heap.comb_y);
  const int* comb_flag = on_rank<int>(p, p.rank, p.heap.comb_flag);
  for (int token = warp; token < p.num_tokens; token += num_warps) {
    TRACE_NOW(t_wait);
    for (int k = 0; k < p.topk; ++k) {
      const int pair = token * p.topk + k;
      const int dst = load_fresh(&p.pair_dst[pair]), slot = load_fresh(&p.pair_slot[pair]);
      wait_flag(p, comb_flag + (int64_t)dst * p.slots + slot, WAIT_COMBINED_ROW, dst, slot);
    }
    TRACE_WARP(PH_WAIT_COMBINED, t_wait);
    TRACE_NOW(t_reduce);
    for (int v = lane_id(); v < p.hidden / 8; v += A2A_WARP_SIZE) {
      float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
      for (int k = 0; k < p.topk; ++k) {
        const int pair = token * p.topk + k;
        const int64_t index = (int64_t)load_fresh(&p.pair_dst[pair]) * p.slots + load_fresh(&p.pair_slot[pair]);
        const uint4 packed = reinterpret_cast<const uint4*>(comb_y + index * p.hidden)[v];
        const __half2* h = reinterpret_cast<const __half2*>(&packed);
        const float w = p.weights[pair];
        for (int j = 0; j < 4; ++j) {
          const float2 f = __half22float2(h[j]);
          acc[2 * j] += w * f.x;
          acc[2 * j + 1] += w * f.y;
        }
      }
      uint4 packed;
      __half2* h = reinterpret_cast<__half2*>(&packed);
      for (int j = 0; j < 4; ++j) h[j] = __floats2half2_rn(acc[2 * j], acc[2 * j + 1]);
      reinterpret_cast<uint4*>(p.out + (int64_t)token * p.hidden)[v] = packed;
    }
    TRACE_WARP(PH_REDUCE, t_reduce);
  }
  TRACE_BLOCK_END(PH_KERNEL, t_kernel);
}

// Host side of the heap and the launches: plain runtime calls, no torch. Return 0 or a runtime error code.
int heap_alloc(void** base, size_t bytes) {
  cudaError_t err = alloc_remote_buffer(base, bytes);
  if (err == cudaSuccess) err = cudaMemset(*base, 0, bytes);  // epochs start at 1: zeroed flags mean "not yet"
  return (int)err;
}
int heap_export(void* base, cudaIpcMemHandle_t* handle) { return (int)cudaIpcGetMemHandle(handle, base); }
int heap_import(void** base, cudaIpcMemHandle_t handle) {
  return (int)cudaIpcOpenMemHandle(base, handle, cudaIpcMemLazyEnablePeerAccess);
}
int heap_unimport(void* base) { return (int)cudaIpcCloseMemHandle(base); }
// One zeroed 64-bit word of pinned host memory, mapped for every device; *device is its address on the GPU.
int report_alloc(uint64_t** host, uint64_t** device) {
  cudaError_t err = cudaHostAlloc((void**)host, sizeof(uint64_t), cudaHostAllocMapped | cudaHostAllocPortable);
  if (err != cudaSuccess) return (int)err;
  **host = 0;
  return (int)cudaHostGetDevicePointer((void**)device, *host, 0);
}
int heap_release(void* base) { return (int)cudaFree(base); }

int launch_all2all(const A2AParams& p, int grid, int threads, cudaStream_t stream) {
  all2all_kernel<<<grid, threads, 0, stream>>>(p);
  return (int)cudaGetLastError();
}

// Blocks of `threads` that can be resident at once on the whole device: the grid must not exceed it.
int max_resident_blocks(int threads, int* blocks) {
  int per_multiprocessor = 0, device = 0, multiprocessors = 0;
  cudaError_t err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_multiprocessor, all2all_kernel, threads, 0);
  if (err == cudaSuccess) err = cudaGetDevice(&device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&multiprocessors, cudaDevAttrMultiProcessorCount, device);
  *blocks = per_multiprocessor * multiprocessors;
  return (int)err;
}

// The graph path: the launch captured once (on a side stream: the legacy default stream cannot capture), then per
// call the kernel node's parameter block is patched and the graph launched on the caller's stream.
// NOTES: the captured graph lives as long as its instance: the node handle that the per-call patch names belongs to
// it (destroying it after instantiation made every patch fail with "invalid argument", seen on H200).
struct GraphLaunch {
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  cudaGraphNode_t node;
  kernel_node_params_t params;
};
int graph_prepare(GraphLaunch* g, const A2AParams& p, int grid, int threads) {
  cudaStream_t side;
  cudaError_t err = cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking);
  if (err != cudaSuccess) return (int)err;
  err = cudaStreamBeginCapture(side, cudaStreamCaptureModeRelaxed);
  if (err == cudaSuccess) {
    all2all_kernel<<<grid, threads, 0, side>>>(p);
    err = cudaStreamEndCapture(side, &g->graph);
  }
  size_t nodes = 1;
  if (err == cudaSuccess) err = cudaGraphGetNodes(g->graph, &g->node, &nodes);
  if (err == cudaSuccess) err = cudaGraphKernelNodeGetParams(g->node, &g->params);
  if (err == cudaSuccess) err = instantiate_graph(&g->exec, g->graph);
  cudaStreamDestroy(side);
  return (int)err;
}
int graph_launch(GraphLaunch* g, const A2AParams& p, cudaStream_t stream) {
  void* args[] = {const_cast<A2AParams*>(&p)};
  g->params.kernelParams = args;
  g->params.extra = nullptr;
  cudaError_t err = cudaGraphExecKernelNodeSetParams(g->exec, g->node, &g->params);
  if (err == cudaSuccess) err = cudaGraphLaunch(g->exec, stream);
  return (int)err;
}
int graph_release(GraphLaunch* g) {
  cudaError_t err = cudaGraphExecDestroy(g->exec);
  if (err == cudaSuccess) err = cudaGraphDestroy(g->graph);
  return (int)err;
}
"""

BINDING = r"""
// Only the headers this layer uses, not torch/extension.h: under the runner this file is compiled inside the first
// case's 60 s, and torch/extension.h made it the slowest part of a 45-49 s cold build (WORKLOG, cold starts).
#include <cstring>
#include <map>
#include <string>
#include <vector>
#include <ATen/core/Tensor.h>
#include <ATen/DeviceGuard.h>
#include <ATen/ops/empty.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

// NOTES: the runner never sets the current device (it stays cuda:0 in every worker process), so every entry point
// that allocates, maps, queries or launches first binds the device it is given: the input's, for the hot path.
static c10::Device on_device(int64_t index) { return c10::Device(c10::DeviceType::CUDA, (c10::DeviceIndex)index); }

static void check(int err, const char* what) {
  TORCH_CHECK(err == 0, "a2a v4: ", what, " failed: ", cudaGetErrorString((cudaError_t)err));
}

// The fixed part of the parameter block arrives once per group and shape, by name (a dict).
using Dims = std::map<std::string, int64_t>;
static int64_t dim(const Dims& dims, const char* name) {
  auto found = dims.find(name);
  TORCH_CHECK(found != dims.end(), "a2a v4: the parameter block lacks '", name, "'");
  return found->second;
}
static HeapLayout heap_of(const Dims& d) { return heap_layout(dim(d, "world"), dim(d, "slots"), dim(d, "hidden")); }
static ScratchLayout scratch_of(const Dims& d) {
  return scratch_layout(dim(d, "world"), dim(d, "num_local_experts"), dim(d, "slots"));
}

Dims heap_regions(Dims dims) {
  const HeapLayout l = heap_of(dims);
  return {{"disp_x", l.disp_x}, {"comb_y", l.comb_y}, {"disp_meta", l.disp_meta}, {"disp_flag", l.disp_flag},
          {"comb_flag", l.comb_flag}, {"disp_count", l.disp_count}, {"total", l.total}};
}

Dims scratch_regions(Dims dims) {
  const ScratchLayout l = scratch_of(dims);
  return {{"send_counter", l.send_counter}, {"blocks_done", l.blocks_done}, {"expert_count", l.expert_count},
          {"pair_slot", l.pair_slot}, {"pair_dst", l.pair_dst}, {"abandon", l.abandon}, {"total", l.total}};
}

// Everything a call needs but its inputs: built once per group and shape; the tensors it holds stay alive with it.
// NOTES: `out` is returned as a view of its first num_tokens rows: the next call overwrites it.
struct CallState {
  A2AParams params;  // complete but for x, indices, weights, num_tokens and epoch
  at::Tensor heap_bases, scratch, expert_x, expert_meta, out;
  int grid = 1, threads = 1024;
  bool use_graph = false, graph_ready = false;
  GraphLaunch graph;
};

int64_t state_create(Dims dims, at::Tensor heap_bases, at::Tensor scratch, at::Tensor expert_x,
                     at::Tensor expert_meta, at::Tensor out, int64_t report) {
  auto* s = new CallState();
  s->heap_bases = heap_bases; s->scratch = scratch; s->expert_x = expert_x; s->expert_meta = expert_meta; s->out = out;
  A2AParams& p = s->params;
  p.heap_bases = heap_bases.data_ptr<int64_t>();
  p.heap = heap_of(dims);
  p.out = reinterpret_cast<__half*>(out.data_ptr());
  p.topk = dim(dims, "topk"); p.hidden = dim(dims, "hidden"); p.num_local_experts = dim(dims, "num_local_experts");
  p.rank = dim(dims, "rank"); p.world = dim(dims, "world"); p.slots = dim(dims, "slots");
  p.capacity = dim(dims, "capacity"); p.timeout_ns = dim(dims, "timeout_ns");
  const ScratchLayout l = scratch_of(dims);
  TORCH_CHECK(scratch.numel() >= l.total, "a2a v4: scratch is smaller than its layout");
  int* words = scratch.data_ptr<int>();
  p.send_counter = words + l.send_counter;
  p.blocks_done = words + l.blocks_done;
  p.expert_count = words + l.expert_count;
  p.pair_slot = words + l.pair_slot;
  p.pair_dst = words + l.pair_dst;
  p.abandon = words + l.abandon;
  p.expert_x = reinterpret_cast<__half*>(expert_x.data_ptr());
  p.expert_meta = reinterpret_cast<int4*>(expert_meta.data_ptr());
  p.report = reinterpret_cast<uint64_t*>(report);
  p.epoch = 0;
  return reinterpret_cast<int64_t>(s);
}

void state_destroy(int64_t handle) {
  auto* s = reinterpret_cast<CallState*>(handle);
  if (s->graph_ready) graph_release(&s->graph);
  delete s;
}

int64_t resident_blocks(int64_t device, int64_t threads) {
  const at::cuda::OptionalCUDAGuard guard(on_device(device));
  int blocks = 0;
  check(max_resident_blocks((int)threads, &blocks), "querying occupancy");
  return blocks;
}

// grid must not exceed resident_blocks(threads): every block of the kernel must run at once.
void set_launch(int64_t handle, int64_t grid, int64_t threads, bool use_graph) {
  auto* s = reinterpret_cast<CallState*>(handle);
  TORCH_CHECK(threads % A2A_WARP_SIZE == 0 && threads >= 64 && threads <= A2A_MAX_THREADS && grid >= 1,
              "a2a v4: bad launch shape");
  if (s->graph_ready) check(graph_release(&s->graph), "releasing the graph");
  s->grid = (int)grid; s->threads = (int)threads; s->use_graph = use_graph; s->graph_ready = false;
}

// The hot path: three input tensors and the token count in, a view of the output out.
at::Tensor run(int64_t handle, const at::Tensor& x, const at::Tensor& indices, const at::Tensor& weights,
                  int64_t num_tokens) {
  const at::cuda::OptionalCUDAGuard guard(device_of(x));
  auto* s = reinterpret_cast<CallState*>(handle);
  TORCH_CHECK(x.is_contiguous() && indices.is_contiguous() && weights.is_contiguous(),
              "a2a v4: inputs must be contiguous");
  A2AParams p = s->params;
  p.x = reinterpret_cast<const __half*>(x.data_ptr());
  p.indices = indices.data_ptr<int>();
  p.weights = weights.data_ptr<float>();
  p.num_tokens = (int)num_tokens;
  p.epoch = ++s->params.epoch;
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  if (!s->use_graph) {
    check(launch_all2all(p, s->grid, s->threads, stream), "launching the all2all kernel");
  } else {
    if (!s->graph_ready) {
      check(graph_prepare(&s->graph, p, s->grid, s->threads), "capturing the graph");
      s->graph_ready = true;
    }
    check(graph_launch(&s->graph, p, stream), "launching the graph");
  }
  return s->out.narrow(0, 0, num_tokens);
}

// Returns (host address, device address) of the give-up report word.
std::vector<int64_t> report_create(int64_t device_index) {
  const at::cuda::OptionalCUDAGuard guard(on_device(device_index));
  uint64_t *host = nullptr, *device = nullptr;
  check(report_alloc(&host, &device), "allocating the give-up report");
  return {reinterpret_cast<int64_t>(host), reinterpret_cast<int64_t>(device)};
}

int64_t heap_create(int64_t device, int64_t bytes) {
  const at::cuda::OptionalCUDAGuard guard(on_device(device));
  void* base = nullptr;
  check(heap_alloc(&base, (size_t)bytes), "allocating the symmetric heap");
  return reinterpret_cast<int64_t>(base);
}

at::Tensor heap_handle(int64_t device, int64_t base) {
  const at::cuda::OptionalCUDAGuard guard(on_device(device));
  cudaIpcMemHandle_t handle;
  check(heap_export(reinterpret_cast<void*>(base), &handle), "cudaIpcGetMemHandle");
  auto out = at::empty({(int64_t)sizeof(handle)}, at::kByte);
  memcpy(out.data_ptr(), &handle, sizeof(handle));
  return out;
}

int64_t heap_open(int64_t device, at::Tensor handle_bytes) {
  const at::cuda::OptionalCUDAGuard guard(on_device(device));
  cudaIpcMemHandle_t handle;
  TORCH_CHECK(handle_bytes.numel() == (int64_t)sizeof(handle), "a2a v4: bad IPC handle size");
  memcpy(&handle, handle_bytes.cpu().data_ptr(), sizeof(handle));
  void* base = nullptr;
  check(heap_import(&base, handle), "cudaIpcOpenMemHandle");
  return reinterpret_cast<int64_t>(base);
}

// Teardown reports its error code instead of raising: a peer of a finished group may already have freed its heap.
int64_t heap_close(int64_t base) { return heap_unimport(reinterpret_cast<void*>(base)); }
int64_t heap_free(int64_t base) { return heap_release(reinterpret_cast<void*>(base)); }

#if defined(A2A_TRACE)
void trace_attach(at::Tensor buffer) {
  const at::cuda::OptionalCUDAGuard guard(device_of(buffer));
  check(trace_attach_buffer(buffer.data_ptr<int64_t>(), (int)((buffer.numel() - 1) / 4)), "attaching the trace buffer");
}
#endif
"""

CPP_DECLS = """
#include <map>
#include <string>
#include <vector>
#include <pybind11/stl.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/utils/pybind.h>
int64_t heap_create(int64_t device, int64_t bytes);
at::Tensor heap_handle(int64_t device, int64_t base);
int64_t heap_open(int64_t device, at::Tensor handle_bytes);
int64_t heap_close(int64_t base);
int64_t heap_free(int64_t base);
std::map<std::string, int64_t> heap_regions(std::map<std::string, int64_t> dims);
std::map<std::string, int64_t> scratch_regions(std::map<std::string, int64_t> dims);
int64_t state_create(std::map<std::string, int64_t> dims, at::Tensor heap_bases, at::Tensor scratch,
                     at::Tensor expert_x, at::Tensor expert_meta, at::Tensor out, int64_t report);
void state_destroy(int64_t handle);
int64_t resident_blocks(int64_t device, int64_t threads);
void set_launch(int64_t handle, int64_t grid, int64_t threads, bool use_graph);
at::Tensor run(int64_t handle, const at::Tensor& x, const at::Tensor& indices, const at::Tensor& weights,
                  int64_t num_tokens);
std::vector<int64_t> report_create(int64_t device_index);
"""

TRACE = os.environ.get("A2A_TRACE") == "1"
TRACE_PHASES = ("all2all", "all2all.send_row", "all2all.publish_counts", "all2all.wait_counts",
                "all2all.wait_row_flag", "all2all.row_in_and_home", "all2all.wait_combined", "all2all.reduce")
TRACE_CAPACITY = 1 << 20  # records per rank between two trace_take() calls

# Each source includes the few headers it needs: the ones load_inline adds by default (torch/extension.h,
# torch/types.h) were most of a 45-49 s cold build on H200, inside the runner's 60 s first case (WORKLOG). A torch
# without the switch adds them anyway, which costs time, not correctness.
_ONLY_NAMED_HEADERS = ({"no_implicit_headers": True}
                       if "no_implicit_headers" in inspect.signature(load_inline).parameters else {})
# Built at import: under the runner, in every worker during the first case (torch lets one build, the rest wait).
_ext = load_inline(
    name="a2a_v4_low_overhead" + ("_trace" if TRACE else ""),
    cpp_sources=CPP_DECLS + ("void trace_attach(at::Tensor buffer);" if TRACE else ""),
    cuda_sources=[KERNELS, BINDING],
    functions=["heap_create", "heap_handle", "heap_open", "heap_close", "heap_free", "heap_regions", "scratch_regions",
               "state_create", "state_destroy", "resident_blocks", "set_launch", "run", "report_create"]
    + (["trace_attach"] if TRACE else []),
    extra_cuda_cflags=["-O3"] + ([] if torch.version.hip else ["-arch=sm_90"]) + (["-DA2A_TRACE"] if TRACE else []),
    verbose=False,
    **_ONLY_NAMED_HEADERS,
)

SPIN_TIMEOUT_NS = int(float(os.environ.get("A2A_SPIN_TIMEOUT_S", "10")) * 1e9)
# Launch shape of the one kernel: (blocks per multiprocessor, threads per block), scaled by the multiprocessor count
# read from the device and capped at what can be resident at once. Many warps in flight: v3's sweep found more
# outstanding peer stores the one change that paid (dispatch_send); the other parts did not care.
LAUNCH_SHAPE = (1, 1024)
USE_GRAPH = False  # measured against the plain launch: WORKLOG, v4
WAIT_KINDS = {1: "the row count", 2: "a dispatched row", 3: "a combined row"}


class GiveUpReport:
    """The mapped host word a kernel writes when a spin-wait gives up, and a daemon thread that prints it at once.
    The kernels themselves finish (with wrong data, which the check then reports)."""

    def __init__(self, device: torch.device):
        self.host, self.device = _ext.report_create(device.index)
        self.rank = -1
        self.word = ctypes.c_uint64.from_address(self.host)
        threading.Thread(target=self._watch, name="a2a-give-up-report", daemon=True).start()

    def _watch(self):
        while not self.word.value:
            time.sleep(0.02)
        record = self.word.value
        kind, peer, slot, epoch = record >> 60, (record >> 52) & 0xFF, ((record >> 28) & 0xFFFFFF) - 1, record & 0xFFFFFFF
        where = "" if slot < 0 else f", slot {slot}"
        print(f"[a2a v4] rank {self.rank}: gave up after {SPIN_TIMEOUT_NS // 1_000_000} ms waiting for "
              f"{WAIT_KINDS.get(kind, kind)} from rank {peer}{where} (call {epoch})", file=sys.stderr, flush=True)


_report = None


class P2PState:
    """One process group's symmetric heap, scratch, output buffer and the C++ state of the hot path. Built on the
    first call in a group (a collective: every rank builds at the same call); closed when the group is destroyed (the
    next group may put this process on another GPU) or when the shape changes.

    NOTES: it must hold no reference to the process group: a live group object keeps its TCP store listening on
    the rendezvous port, and the runner's next group, whose rank 0 may be another process, then fails with
    EADDRINUSE (seen on H200x4 with the fixed port the runner uses)."""

    def __init__(self, key: tuple, cfg, rank: int, world_size: int, device: torch.device):
        if cfg.hidden_dim % 8:
            raise ValueError(f"v4 moves rows in 16-byte pieces: hidden_dim must be a multiple of 8, not "
                             f"{cfg.hidden_dim}")
        self.key = key
        self.device = device
        self.num_local_experts = cfg.num_experts // world_size
        self.capacity = cfg.max_num_tokens * world_size  # a source token reaches an expert at most once
        self.dims = {"topk": cfg.experts_per_token, "hidden": cfg.hidden_dim, "num_local_experts": self.num_local_experts,
                     "rank": rank, "world": world_size, "slots": cfg.max_num_tokens * cfg.experts_per_token,
                     "capacity": self.capacity, "timeout_ns": SPIN_TIMEOUT_NS}
        self.base = _ext.heap_create(device.index, _ext.heap_regions(self.dims)["total"])
        mine = _ext.heap_handle(device.index, self.base).to(device)
        handles = torch.empty(world_size, mine.numel(), dtype=torch.uint8, device=device)
        dist.all_gather_into_tensor(handles, mine)
        handles = handles.cpu()
        self.peers = {r: _ext.heap_open(device.index, handles[r]) for r in range(world_size) if r != rank}
        bases = [self.base if r == rank else self.peers[r] for r in range(world_size)]
        self.heap_bases = torch.tensor(bases, dtype=torch.int64, device=device)
        self.scratch = torch.zeros(_ext.scratch_regions(self.dims)["total"], dtype=torch.int32, device=device)
        self.expert_x = torch.empty(self.num_local_experts * self.capacity, cfg.hidden_dim, dtype=torch.float16,
                                    device=device)
        self.expert_meta = torch.empty(self.num_local_experts * self.capacity, 4, dtype=torch.int32, device=device)
        self.out = torch.empty(cfg.max_num_tokens, cfg.hidden_dim, dtype=cfg.out_dtype, device=device)
        self.multiprocessors = torch.cuda.get_device_properties(device).multi_processor_count
        self.handle = _ext.state_create(self.dims, self.heap_bases, self.scratch, self.expert_x, self.expert_meta,
                                        self.out, _report.device)
        self.configure()
        if TRACE:
            self.trace = torch.zeros(1 + 4 * TRACE_CAPACITY, dtype=torch.int64, device=device)
            _ext.trace_attach(self.trace)
        dist.barrier()  # every peer has mapped every heap before anyone writes

    def configure(self) -> None:
        """Applies LAUNCH_SHAPE and USE_GRAPH (the grid capped at what can be resident at once)."""
        per_multiprocessor, threads = LAUNCH_SHAPE
        grid = min(max(1, round(per_multiprocessor * self.multiprocessors)),
                   _ext.resident_blocks(self.device.index, threads))
        _ext.set_launch(self.handle, grid, threads, USE_GRAPH)

    def close(self):
        """Unmaps the peers' heaps and frees ours; error codes are ignored (the group is over)."""
        with torch.cuda.device(self.device):
            torch.cuda.synchronize()
            _ext.state_destroy(self.handle)
            for base in self.peers.values():
                _ext.heap_close(base)
            _ext.heap_free(self.base)


_state = None
_state_key = None


def _close_state() -> None:
    global _state, _state_key
    if _state is not None:
        _state.close()
        _state = _state_key = None


def _new_state(key: tuple, cfg, rank: int, world_size: int, device: torch.device) -> P2PState:
    global _state, _state_key, _report
    _close_state()
    if _report is None:
        _report = GiveUpReport(device)
    _report.rank = rank
    _state = P2PState(key, cfg, rank, world_size, device)
    _state_key = key
    return _state


def configure(launch_shape=None, use_graph=None) -> None:
    """Changes the launch shape or the graph path, for this group's state too (tools/sweep_launch.py)."""
    global LAUNCH_SHAPE, USE_GRAPH
    LAUNCH_SHAPE = launch_shape if launch_shape is not None else LAUNCH_SHAPE
    USE_GRAPH = use_graph if use_graph is not None else USE_GRAPH
    if _state is not None:
        _state.configure()


def trace_take() -> torch.Tensor:
    """Trace build only: the records since the last take, int64 [n, 4] (phase index into TRACE_PHASES,
    block << 16 | warp, start ns, end ns on this GPU's clock); empties the buffer."""
    buffer = _state.trace
    count = min(int(buffer[0].item()), TRACE_CAPACITY)
    records = buffer[1:1 + 4 * count].view(count, 4).cpu()
    buffer[0].zero_()
    return records


def _destroy_process_group_and_heap(*args, **kwargs):
    _close_state()
    return _destroy_process_group(*args, **kwargs)


# The runner reuses processes across groups: a group's heap must go with the group.
_destroy_process_group = dist.destroy_process_group
dist.destroy_process_group = _destroy_process_group_and_heap


def custom_kernel(data: input_t) -> output_t:
    cfg, rank_data, rank, world_size = data
    key = (rank, world_size, rank_data.x.device, cfg.num_experts, cfg.experts_per_token, cfg.hidden_dim,
           cfg.max_num_tokens)
    state = _state if key == _state_key else _new_state(key, cfg, rank, world_size, rank_data.x.device)
    return _ext.run(state.handle, rank_data.x, rank_data.indices, rank_data.weights, rank_data.num_tokens)
