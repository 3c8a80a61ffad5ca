"""v6 ideas - the scratch copy of v5 in which each of v6's ideas is a switch, to measure each one alone.

Not a version: tools/compare_ideas.py loads it beside v5 and times v5, this copy with no idea on (v5's algorithm,
to show the switches cost nothing), each idea alone and chosen sets, in one run. The frozen v6 keeps what paid,
with no switches. The ideas (the kernel's Idea bits; IDEAS below):
- dedup: a token's row crosses to a rank once, however many of its k experts live there; the meta carries the
  mask of those k with each one's expert and weight; the expert's rank sums its experts' weighted outputs and sends
  one row home, so combine also moves one row per (token, rank) and the token's reduce adds at most `world` rows;
- index (with dedup): the per-expert dispatch layout is a list of (source, slot) rows of the receive buffer (what a
  gather-GEMM reads) instead of a copy of each row per local expert;
- pull: the expert's rank leaves the combined rows in its own heap and the token's rank reads them (push: the
  expert's rank writes them into the token rank's heap);
- relaxed_spin: polls are relaxed loads and one acquire fence follows the loop (on AMD an acquire load at system
  scope invalidates the L2 on every iteration); on AMD every poll also backs off with s_sleep;
- streaming: rows are written with streaming (non-temporal) 16-byte stores;
- plain_launch: an ordinary launch instead of a cooperative one (the host path).

The rest is v5: route table per block, counts first, even flat shares, flags carrying the call's epoch.
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
__device__ __forceinline__ int warp_shuffle(int value, int lane) { return __shfl(value, lane); }
__device__ __forceinline__ uint64_t warp_ballot(bool predicate) { return __ballot(predicate); }
__device__ __forceinline__ int load_acquire_sys(const int* p) {
  return __hip_atomic_load(p, __ATOMIC_ACQUIRE, __HIP_MEMORY_SCOPE_SYSTEM);
}
__device__ __forceinline__ uint64_t load_acquire_sys(const uint64_t* p) {
  return __hip_atomic_load(p, __ATOMIC_ACQUIRE, __HIP_MEMORY_SCOPE_SYSTEM);
}
// Polling loads: relaxed (no cache invalidation per iteration; an acquire load at system scope invalidates the L2
// each time on MI300X), followed by one acquire fence once the value is seen.
__device__ __forceinline__ int load_relaxed_sys(const int* p) {
  return __hip_atomic_load(p, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_SYSTEM);
}
__device__ __forceinline__ uint64_t load_relaxed_sys(const uint64_t* p) {
  return __hip_atomic_load(p, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_SYSTEM);
}
__device__ __forceinline__ void fence_acquire_sys() { __atomic_thread_fence(__ATOMIC_ACQUIRE); }
// Back-off between polls: a tight spin over xGMI livelocked MORI's kernels (facts file). s_sleep 1 = 64 clocks.
__device__ __forceinline__ void spin_pause() { __builtin_amdgcn_s_sleep(1); }
__device__ __forceinline__ void store_release_sys(int* p, int v) {
  __hip_atomic_store(p, v, __ATOMIC_RELEASE, __HIP_MEMORY_SCOPE_SYSTEM);
}
__device__ __forceinline__ void store_release_sys(uint64_t* p, uint64_t v) {
  __hip_atomic_store(p, v, __ATOMIC_RELEASE, __HIP_MEMORY_SCOPE_SYSTEM);
}
// A 16-byte store that does not keep the line in this GPU's caches (rows written once, read by another agent).
typedef unsigned int a2a_u32x4 __attribute__((ext_vector_type(4)));
__device__ __forceinline__ void store_streaming(uint4* p, uint4 v) {
  __builtin_nontemporal_store(*reinterpret_cast<const a2a_u32x4*>(&v), reinterpret_cast<a2a_u32x4*>(p));
}
// s_memrealtime runs at a constant 100 MHz on MI300X.
__device__ __forceinline__ uint64_t realtime_ns() { return __builtin_amdgcn_s_memrealtime() * 10ull; }
// Remotely accessed memory is fine-grained on AMD: coherent across devices, so peers' stores are seen.
static inline cudaError_t alloc_remote_buffer(void** ptr, size_t bytes) {
  return hipExtMallocWithFlags(ptr, bytes, hipDeviceMallocFinegrained);
}
static inline cudaError_t launch_cooperative(const void* kernel, int grid, int threads, void** args, size_t shared,
                                             cudaStream_t stream) {
  return hipLaunchCooperativeKernel(kernel, dim3(grid), dim3(threads), args, (unsigned int)shared, stream);
}
#else
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#define A2A_WARP_SIZE 32
__device__ __forceinline__ void warp_sync() { __syncwarp(); }
__device__ __forceinline__ int warp_shuffle(int value, int lane) { return __shfl_sync(0xffffffffu, value, lane); }
__device__ __forceinline__ uint64_t warp_ballot(bool predicate) { return __ballot_sync(0xffffffffu, predicate); }
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
__device__ __forceinline__ int load_relaxed_sys(const int* p) {
  int v;
  asm volatile("ld.relaxed.sys.global.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ uint64_t load_relaxed_sys(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.relaxed.sys.global.b64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void fence_acquire_sys() { asm volatile("fence.acq_rel.sys;" ::: "memory"); }
__device__ __forceinline__ void spin_pause() {}
__device__ __forceinline__ void store_release_sys(int* p, int v) {
  asm volatile("st.release.sys.global.b32 [%0], %1;" :: "l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ void store_release_sys(uint64_t* p, uint64_t v) {
  asm volatile("st.release.sys.global.b64 [%0], %1;" :: "l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ void store_streaming(uint4* p, uint4 v) { __stcs(p, v); }
__device__ __forceinline__ uint64_t realtime_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
static inline cudaError_t alloc_remote_buffer(void** ptr, size_t bytes) { return cudaMalloc(ptr, bytes); }
static inline cudaError_t launch_cooperative(const void* kernel, int grid, int threads, void** args, size_t shared,
                                             cudaStream_t stream) {
  return cudaLaunchCooperativeKernel(kernel, dim3(grid), dim3(threads), args, shared, stream);
}
#endif
// ---------------------------------------------------------------------------------------------------------------

// Generated by a2a/contract.py from TRACE_PHASES and GIVE_UP_FIELDS; do not edit by hand.
enum TracePhase { PH_ALL2ALL, PH_ALL2ALL_ROUTE, PH_ALL2ALL_PUBLISH_COUNTS, PH_ALL2ALL_SEND_ROW, PH_ALL2ALL_WAIT_COUNTS, PH_ALL2ALL_WAIT_ROW_FLAG, PH_ALL2ALL_ROW_IN_AND_HOME, PH_ALL2ALL_WAIT_COMBINED, PH_ALL2ALL_REDUCE, PH_COUNT };
#if defined(__CUDACC__) || defined(__HIPCC__)
#define A2A_HOST_DEVICE __host__ __device__
#else
#define A2A_HOST_DEVICE
#endif
A2A_HOST_DEVICE inline uint64_t pack_give_up(uint64_t kind, uint64_t peer, uint64_t slot_plus_one, uint64_t epoch) {
  return ((uint64_t)(kind & 0xfull) << 60) | ((uint64_t)(peer & 0xffull) << 52) | ((uint64_t)(slot_plus_one & 0xffffffull) << 28) | ((uint64_t)(epoch & 0xfffffffull) << 0);
}

// The ideas this scratch copy can switch on, one bit each, per call (every rank must use the same set).
enum Idea {
  IDEA_DEDUP = 1,         // one row per (token, destination rank) both ways; the expert's rank reduces its part
  IDEA_INDEX = 2,         // with DEDUP: the per-expert dispatch layout is a list of receive-buffer rows, not copies
  IDEA_PULL = 4,          // combine: the token's rank reads the returned rows from the expert's rank
  IDEA_RELAXED_SPIN = 8,  // polls with relaxed loads, one acquire fence after the loop
  IDEA_STREAMING = 16,    // rows stored with streaming (non-temporal) 16-byte stores
  IDEA_PLAIN_LAUNCH = 32  // a plain launch instead of a cooperative one (host path)
};

// 512 threads and one block per multiprocessor at least (8 loads in flight).
#define A2A_MAX_THREADS 512
#define A2A_MAX_WARPS (A2A_MAX_THREADS / A2A_WARP_SIZE)
// One lane per destination while routing: at most a warp's worth of ranks (the leaderboard runs 8).
#define A2A_MAX_WORLD 32
// 16-byte loads each lane keeps in flight while copying; k-way loads in flight while reducing, per pass.
#define A2A_UNROLL 4
#define A2A_REDUCE_BATCH 8
// dst_of's top bit: the pair is the first of its token for that destination (the one whose row moves).
#define A2A_FIRST_OF_ROW 0x80

// Heap layout, identical on every rank (offsets in bytes from the heap base), defined here once: Python sizes the
// heap with heap_regions(); the kernels find each region through it. `slots` = max_tokens * topk: the most rows one
// source can send to one destination. Rows are `hidden` halves.
//   disp_x    [world][slots] rows    written by the source (send), read by this rank
//   comb_y    [world][slots] rows    push: written by the expert's rank, read here; pull: written here, read by the
//                                    token's rank
//   disp_meta [world][slots] records of meta_bytes: int4 header (token, k or pair mask, expert, 0) then, with DEDUP,
//                                    one (global expert, weight bits) int2 per k of the mask
//   disp_flag [world][slots] int     = epoch once the slot's row and meta are in place
//   comb_flag [world][slots] int     = epoch once comb_y's row is in place
//   disp_count[world]        uint64  = (epoch << 32) | rows that source sends here this call
struct HeapLayout {
  int64_t disp_x, comb_y, disp_meta, disp_flag, comb_flag, disp_count, total;
};
static inline int meta_bytes(int topk) { return (16 + 8 * topk + 15) / 16 * 16; }
static inline HeapLayout heap_layout(int world, int slots, int hidden, int topk) {
  HeapLayout l;
  int64_t at = 0;
  auto take = [&at](int64_t bytes) { const int64_t here = at; at += (bytes + 255) / 256 * 256; return here; };
  const int64_t region = (int64_t)world * slots;
  l.disp_x = take(region * hidden * 2);
  l.comb_y = take(region * hidden * 2);
  l.disp_meta = take(region * meta_bytes(topk));
  l.disp_flag = take(region * 4);
  l.comb_flag = take(region * 4);
  l.disp_count = take((int64_t)world * 8);
  l.total = at;
  return l;
}

// Local scratch (int32 words, zeroed once when the group's state is built).
//   expert_count [2][local experts]  rows laid out per local expert, by call parity (epoch & 1)
//   abandon      [1]                 set by the first wait that gives up
struct ScratchLayout {
  int64_t expert_count, abandon, total;
};
static inline ScratchLayout scratch_layout(int num_local_experts) {
  ScratchLayout l;
  int64_t at = 0;
  auto take = [&at](int64_t words) { const int64_t here = at; at += words; return here; };
  l.expert_count = take(2 * (int64_t)num_local_experts);
  l.abandon = take(1);
  l.total = at;
  return l;
}

// Dynamic shared memory per block: each pair's slot (uint16) and destination (uint8), for up to `slots` pairs, and
// the token of each (destination, slot) row (uint16, world * max_tokens; DEDUP's send walks it).
static inline size_t route_table_bytes(int slots, int world, int max_tokens) {
  return ((size_t)slots * 3 + 15) / 16 * 16 + (size_t)world * max_tokens * 2;
}

struct A2AParams {
  const __half* x;
  const int* indices;
  const float* weights;
  __half* out;
  const int64_t* heap_bases;
  HeapLayout heap;
  int* expert_count;   // [2][local experts] local; NOTES: this call counts in parity epoch & 1; block 0 zeroes
                       // parity (epoch + 1) & 1 for the next call (the previous call, complete, used it last)
  __half* expert_x;    // [local experts][capacity] rows: the dispatch output a grouped GEMM would read (not with INDEX)
  int4* expert_meta;   // [local experts][capacity] (src rank, slot, token, k)
  uint64_t* report;    // mapped pinned host word: the first wait that gives up writes its record here
  int* abandon;        // [1] local; NOTES: set once by the first wait that gives up, never reset: every later wait
                       // of this group returns at once (the group's data is no longer trustworthy)
  int num_tokens, topk, hidden, num_local_experts, rank, world, slots, capacity, max_tokens, meta_bytes, epoch;
  int ideas;
  int64_t timeout_ns;
};

template <typename T>
__device__ __forceinline__ T* on_rank(const A2AParams& p, int rank, int64_t offset) {
  return reinterpret_cast<T*>(p.heap_bases[rank] + offset);
}

__device__ __forceinline__ bool idea(const A2AParams& p, int which) { return (p.ideas & which) != 0; }
__device__ __forceinline__ int lane_id() { return threadIdx.x % A2A_WARP_SIZE; }
__device__ __forceinline__ int warp_in_block() { return threadIdx.x / A2A_WARP_SIZE; }
__device__ __forceinline__ int warps_per_block() { return blockDim.x / A2A_WARP_SIZE; }
__device__ __forceinline__ int global_warp() { return blockIdx.x * warps_per_block() + warp_in_block(); }
__device__ __forceinline__ int total_warps() { return gridDim.x * warps_per_block(); }
__device__ __forceinline__ uint64_t lanes_below() { return (1ull << lane_id()) - 1ull; }
__device__ __forceinline__ float shuffle_float(float value, int lane) {
  return __int_as_float(warp_shuffle(__float_as_int(value), lane));
}

// This warp's even share [begin, end) of `n` work items: contiguous, sizes differ by at most one across the grid.
struct Share { int begin, end; };
__device__ __forceinline__ Share share_of(int n) {
  const int64_t warps = total_warps(), warp = global_warp();
  return {(int)(warp * n / warps), (int)((warp + 1) * n / warps)};
}

// Timeline probes: compiled only with -DA2A_TRACE. A record is (phase, block << 16 | warp, start ns, end ns) in a
// per-rank buffer whose first word counts the records.
#if defined(A2A_TRACE)
__device__ int64_t* a2a_trace_buffer;
__device__ int a2a_trace_capacity;
__device__ __forceinline__ void trace_record(int phase, uint64_t start) {
  const uint64_t end = realtime_ns();
  const unsigned long long i = atomicAdd(reinterpret_cast<unsigned long long*>(a2a_trace_buffer), 1ull);
  if (i < (unsigned long long)a2a_trace_capacity) {
    int64_t* record = a2a_trace_buffer + 1 + 4 * i;
    record[0] = phase;
    record[1] = ((int64_t)blockIdx.x << 16) | warp_in_block();
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
// stores one packed record (pack_give_up) of what it waited for into mapped host memory, where a host thread reads
// it; every other wait then returns at once, the kernel finishes (with wrong data) and the context stays usable.
enum WaitKind { WAIT_COUNT = 1, WAIT_DISPATCHED_ROW = 2, WAIT_COMBINED_ROW = 3 };

__device__ bool abandoned(const A2AParams& p) { return *(volatile int*)p.abandon != 0; }

__device__ void give_up(const A2AParams& p, int kind, int peer, int slot) {
  if (atomicExch(p.abandon, 1) == 0) {
    store_release_sys(p.report, pack_give_up(kind, peer, slot + 1, p.epoch));
    __threadfence_system();
  }
}

template <typename T>
__device__ __forceinline__ T poll(const A2AParams& p, const T* word) {
  return idea(p, IDEA_RELAXED_SPIN) ? load_relaxed_sys(word) : load_acquire_sys(word);
}
// With relaxed polls, the fence that orders the waiter's later loads after the value it saw.
__device__ __forceinline__ void after_poll(const A2AParams& p) {
  if (idea(p, IDEA_RELAXED_SPIN)) fence_acquire_sys();
}

// Waited on by every lane that calls it (each lane may wait on its own flag); `leader`: the lane that reports.
__device__ void wait_flag(const A2AParams& p, const int* flag, int kind, int peer, int slot, bool leader) {
  if (poll(p, flag) != p.epoch) {
    const uint64_t start = realtime_ns();
    while (poll(p, flag) != p.epoch) {
      if (abandoned(p)) return;
      if (realtime_ns() - start > (uint64_t)p.timeout_ns) {
        if (leader) give_up(p, kind, peer, slot);
        return;
      }
      spin_pause();
    }
  }
  after_poll(p);
}

// Waited on by single threads (one per source rank).
__device__ int wait_count(const A2AParams& p, const uint64_t* word, int peer) {
  uint64_t seen = poll(p, word);
  const uint64_t start = realtime_ns();
  while ((int)(seen >> 32) != p.epoch) {
    if (abandoned(p)) return 0;
    if (realtime_ns() - start > (uint64_t)p.timeout_ns) {
      give_up(p, WAIT_COUNT, peer, -1);
      return 0;
    }
    spin_pause();
    seen = poll(p, word);
  }
  after_poll(p);
  return (int)(seen & 0xffffffffu);
}

__device__ __forceinline__ void store16(uint4* p, uint4 v, bool streaming) {
  if (streaming) store_streaming(p, v); else *p = v;
}

// Copies one row (hidden halves, a multiple of 8) with 16-byte accesses over the warp's lanes, A2A_UNROLL loads in
// flight per lane before the stores.
__device__ __forceinline__ void copy_row(__half* dst, const __half* src, int hidden, bool streaming) {
  const uint4* s = reinterpret_cast<const uint4*>(src);
  uint4* d = reinterpret_cast<uint4*>(dst);
  const int n = hidden / 8;
  for (int base = lane_id(); base < n; base += A2A_UNROLL * A2A_WARP_SIZE) {
    uint4 v[A2A_UNROLL];
#pragma unroll
    for (int u = 0; u < A2A_UNROLL; ++u) {
      const int i = base + u * A2A_WARP_SIZE;
      if (i < n) v[u] = s[i];
    }
#pragma unroll
    for (int u = 0; u < A2A_UNROLL; ++u) {
      const int i = base + u * A2A_WARP_SIZE;
      if (i < n) store16(d + i, v[u], streaming);
    }
  }
}

__device__ __forceinline__ uint4 scaled(uint4 packed, float scale) {
  __half2* halves = reinterpret_cast<__half2*>(&packed);
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const float2 f = __half22float2(halves[j]);
    halves[j] = __floats2half2_rn(f.x * scale, f.y * scale);
  }
  return packed;
}

// One pass over a received row. Without DEDUP (one pair): the dispatch layout gets the row as is and the expert's
// output fp16(src * scale) goes home (v2's separate pass, bit for bit). With DEDUP (the row's local pairs): home
// gets fp16(fp16(src * scale) * weight_sum): every local expert of this rank is the same simulated function, so
// the weighted sum of their outputs is one output times the summed weights (a real MoE would sum per expert here).
// `layout` may be null (INDEX, or DEDUP's separate fan-out). A2A_UNROLL loads in flight per lane.
__device__ __forceinline__ void lay_out_and_send_home(__half* layout, __half* home, const __half* src, int hidden,
                                                      float scale, float weight_sum, bool weighted, bool streaming) {
  const uint4* s = reinterpret_cast<const uint4*>(src);
  uint4* l = reinterpret_cast<uint4*>(layout);
  uint4* h = reinterpret_cast<uint4*>(home);
  const int n = hidden / 8;
  for (int base = lane_id(); base < n; base += A2A_UNROLL * A2A_WARP_SIZE) {
    uint4 v[A2A_UNROLL];
#pragma unroll
    for (int u = 0; u < A2A_UNROLL; ++u) {
      const int i = base + u * A2A_WARP_SIZE;
      if (i < n) v[u] = s[i];
    }
#pragma unroll
    for (int u = 0; u < A2A_UNROLL; ++u) {
      const int i = base + u * A2A_WARP_SIZE;
      if (i < n) {
        if (l) l[i] = v[u];
        const uint4 y = scaled(v[u], scale);
        store16(h + i, weighted ? scaled(y, weight_sum) : y, streaming);
      }
    }
  }
}

// Makes the warp's row writes visible system-wide, then raises the flag (one lane, release).
__device__ __forceinline__ void publish(int* flag, int epoch) {
  __threadfence_system();
  warp_sync();
  if (lane_id() == 0) store_release_sys(flag, epoch);
}

// Where the row of (this rank's slot `slot` on `expert_rank`) comes home, and its flag. Push: the expert's rank
// writes into the token rank's comb_y[expert_rank][slot]; pull: into its own comb_y[token_rank][slot], which the
// token's rank reads.
__device__ __forceinline__ int64_t combined_index(const A2AParams& p, int other, int slot) {
  return (int64_t)other * p.slots + slot;
}
__device__ __forceinline__ __half* home_row(const A2AParams& p, int src, int slot) {
  return idea(p, IDEA_PULL) ? on_rank<__half>(p, p.rank, p.heap.comb_y) + combined_index(p, src, slot) * p.hidden
                            : on_rank<__half>(p, src, p.heap.comb_y) + combined_index(p, p.rank, slot) * p.hidden;
}
__device__ __forceinline__ int* home_flag(const A2AParams& p, int src, int slot) {
  return idea(p, IDEA_PULL) ? on_rank<int>(p, p.rank, p.heap.comb_flag) + combined_index(p, src, slot)
                            : on_rank<int>(p, src, p.heap.comb_flag) + combined_index(p, p.rank, slot);
}
__device__ __forceinline__ const __half* combined_row(const A2AParams& p, int expert_rank, int slot) {
  return idea(p, IDEA_PULL)
             ? on_rank<__half>(p, expert_rank, p.heap.comb_y) + combined_index(p, p.rank, slot) * p.hidden
             : on_rank<__half>(p, p.rank, p.heap.comb_y) + combined_index(p, expert_rank, slot) * p.hidden;
}
__device__ __forceinline__ const int* combined_flag(const A2AParams& p, int expert_rank, int slot) {
  return idea(p, IDEA_PULL) ? on_rank<int>(p, expert_rank, p.heap.comb_flag) + combined_index(p, p.rank, slot)
                            : on_rank<int>(p, p.rank, p.heap.comb_flag) + combined_index(p, expert_rank, slot);
}

__device__ __forceinline__ int rank_of_pair(const A2AParams& p, int pair) {
  return p.indices[pair] / p.num_local_experts;
}
// Whether no earlier k of the pair's token goes to the same rank (the pair whose row moves, with DEDUP).
__device__ __forceinline__ bool first_of_row(const A2AParams& p, int pair, int dst) {
  for (int j = pair % p.topk; j > 0; --j)
    if (rank_of_pair(p, pair - j) == dst) return false;
  return true;
}

// Route: fills the block's table of every pair's slot and destination, and `totals[dst]` (rows this rank sends to
// each rank). Each warp takes a contiguous range of pairs; lane d of a warp counts the rows for destination d (one
// ballot per destination per 32 or 64 pairs); a prefix over the warps' counts gives each warp's first slot per
// destination; a second walk hands out the slots. Without DEDUP every pair is a row; with DEDUP only the first pair
// of a token for each rank is, the others take its slot (third walk), and token_of[dst][slot] names each row's
// token. Every block computes the same table: no block waits on another.
__device__ void route(const A2AParams& p, uint16_t* slot_of, uint8_t* dst_of, uint16_t* token_of, int* totals,
                      int (*warp_first)[A2A_MAX_WORLD]) {
  const bool dedup = idea(p, IDEA_DEDUP);
  const int pairs = p.num_tokens * p.topk;
  const int per_warp = (pairs + warps_per_block() - 1) / warps_per_block();
  const int begin = min(pairs, warp_in_block() * per_warp), end = min(pairs, begin + per_warp);
  int mine = 0;  // lane d: this warp's rows for destination d
  for (int base = begin; base < end; base += A2A_WARP_SIZE) {
    const int pair = base + lane_id();
    int dst = pair < end ? rank_of_pair(p, pair) : -1;
    if (dedup && dst >= 0 && !first_of_row(p, pair, dst)) dst = -1;
    for (int d = 0; d < p.world; ++d) {
      const int n = __popcll(warp_ballot(dst == d));
      if (lane_id() == d) mine += n;
    }
  }
  if (lane_id() < p.world) warp_first[warp_in_block()][lane_id()] = mine;
  __syncthreads();
  if ((int)threadIdx.x < p.world) {
    int running = 0;
    for (int w = 0; w < warps_per_block(); ++w) {
      const int n = warp_first[w][threadIdx.x];
      warp_first[w][threadIdx.x] = running;
      running += n;
    }
    totals[threadIdx.x] = running;
  }
  __syncthreads();
  int next = lane_id() < p.world ? warp_first[warp_in_block()][lane_id()] : 0;  // lane d: next slot for d
  for (int base = begin; base < end; base += A2A_WARP_SIZE) {
    const int pair = base + lane_id();
    const int target = pair < end ? rank_of_pair(p, pair) : -1;
    const bool first = target >= 0 && (!dedup || first_of_row(p, pair, target));
    const int dst = first ? target : -1;
    int before = 0, taken = 0;
    for (int d = 0; d < p.world; ++d) {
      const uint64_t same = warp_ballot(dst == d);
      if (dst == d) before = __popcll(same & lanes_below());
      if (lane_id() == d) taken = __popcll(same);
    }
    const int row_start = warp_shuffle(next, dst < 0 ? 0 : dst);
    if (target >= 0) dst_of[pair] = (uint8_t)(target | (first ? A2A_FIRST_OF_ROW : 0));
    if (first) {
      slot_of[pair] = (uint16_t)(row_start + before);
      if (dedup) token_of[target * p.max_tokens + row_start + before] = (uint16_t)(pair / p.topk);
    }
    next += taken;
  }
  __syncthreads();
  if (dedup) {
    for (int pair = begin + lane_id(); pair < end; pair += A2A_WARP_SIZE) {
      if (dst_of[pair] & A2A_FIRST_OF_ROW) continue;
      const int dst = dst_of[pair];
      int first = pair - pair % p.topk;
      while ((dst_of[first] & ~A2A_FIRST_OF_ROW) != dst) ++first;
      slot_of[pair] = slot_of[first];
    }
    __syncthreads();
  }
}

// Reads the per-source counts into shared memory (waiting for this call's epoch); `starts` gets their prefix and
// starts[world] the total rows arriving.
__device__ void gather_counts(const A2AParams& p, int* counts, int* starts) {
  if ((int)threadIdx.x < p.world)
    counts[threadIdx.x] = wait_count(p, on_rank<uint64_t>(p, p.rank, p.heap.disp_count) + threadIdx.x, threadIdx.x);
  __syncthreads();
  if (threadIdx.x == 0) {
    int total = 0;
    for (int r = 0; r < p.world; ++r) { starts[r] = total; total += counts[r]; }
    starts[p.world] = total;
  }
  __syncthreads();
}

// Send, without DEDUP: this warp's share of the num_tokens * topk pairs, each row into its destination's slot.
__device__ void send_pairs(const A2AParams& p, const uint16_t* slot_of, const uint8_t* dst_of, bool streaming) {
  const Share sends = share_of(p.num_tokens * p.topk);
  for (int pair = sends.begin; pair < sends.end; ++pair) {
    TRACE_NOW(t_row);
    const int dst = dst_of[pair] & ~A2A_FIRST_OF_ROW;
    const int64_t index = (int64_t)p.rank * p.slots + slot_of[pair];  // this rank's region on dst
    copy_row(on_rank<__half>(p, dst, p.heap.disp_x) + index * p.hidden, p.x + (int64_t)(pair / p.topk) * p.hidden,
             p.hidden, streaming);
    if (lane_id() == 0)
      *reinterpret_cast<int4*>(on_rank<uint8_t>(p, dst, p.heap.disp_meta) + index * p.meta_bytes) =
          make_int4(pair / p.topk, pair % p.topk, p.indices[pair], 0);
    publish(on_rank<int>(p, dst, p.heap.disp_flag) + index, p.epoch);
    TRACE_WARP(PH_ALL2ALL_SEND_ROW, t_row);
  }
}

// Send, with DEDUP: rows in destination-major order (row_start[] from the totals), one per (token, destination);
// the meta carries the mask of the token's k that go there and each one's expert and weight.
__device__ void send_rows(const A2AParams& p, const uint8_t* dst_of, const uint16_t* token_of, const int* row_start,
                          bool streaming) {
  const Share sends = share_of(row_start[p.world]);
  int dst = 0;
  for (int row = sends.begin; row < sends.end; ++row) {
    TRACE_NOW(t_row);
    while (row >= row_start[dst + 1]) ++dst;
    const int slot = row - row_start[dst];
    const int token = token_of[dst * p.max_tokens + slot];
    const int64_t index = (int64_t)p.rank * p.slots + slot;
    copy_row(on_rank<__half>(p, dst, p.heap.disp_x) + index * p.hidden, p.x + (int64_t)token * p.hidden, p.hidden,
             streaming);
    uint8_t* meta = on_rank<uint8_t>(p, dst, p.heap.disp_meta) + index * p.meta_bytes;
    const int k = lane_id(), pair = token * p.topk + k;
    const bool here = k < p.topk && (dst_of[pair] & ~A2A_FIRST_OF_ROW) == dst;
    const uint32_t mask = (uint32_t)warp_ballot(here);
    if (here) reinterpret_cast<int2*>(meta + 16)[k] = make_int2(p.indices[pair], __float_as_int(p.weights[pair]));
    if (lane_id() == 0) *reinterpret_cast<int4*>(meta) = make_int4(token, (int)mask, 0, 0);
    publish(on_rank<int>(p, dst, p.heap.disp_flag) + index, p.epoch);
    TRACE_WARP(PH_ALL2ALL_SEND_ROW, t_row);
  }
}

// One received pair (without DEDUP): laid out for its expert and its expert output sent home.
__device__ void receive_pair(const A2AParams& p, int src, int slot, const __half* row, const uint8_t* meta,
                             int* expert_count, bool streaming) {
  const int4 header = *reinterpret_cast<const int4*>(meta);
  const int local = header.z - p.rank * p.num_local_experts;
  int position = 0;
  if (lane_id() == 0) position = atomicAdd(&expert_count[local], 1);
  position = warp_shuffle(position, 0);
  const int64_t at = (int64_t)local * p.capacity + position;
  lay_out_and_send_home(p.expert_x + at * p.hidden, home_row(p, src, slot), row, p.hidden, 1.0f + p.rank, 1.0f,
                        false, streaming);
  if (lane_id() == 0) p.expert_meta[at] = make_int4(src, slot, header.x, header.y);
}

// One received row (DEDUP): each of its local pairs gets a place in its expert's layout (lane k handles pair k),
// the row is copied there unless INDEX, and one weighted row goes home.
__device__ void receive_row(const A2AParams& p, int src, int slot, const __half* row, const uint8_t* meta,
                            int* expert_count, bool streaming) {
  const int4 header = *reinterpret_cast<const int4*>(meta);
  const uint32_t mask = (uint32_t)header.y;
  const int k = lane_id();
  const bool mine = k < p.topk && ((mask >> k) & 1u);
  float weight = 0.f;
  int64_t at = 0;
  if (mine) {
    const int2 entry = reinterpret_cast<const int2*>(meta + 16)[k];
    const int local = entry.x - p.rank * p.num_local_experts;
    weight = __int_as_float(entry.y);
    at = (int64_t)local * p.capacity + atomicAdd(&expert_count[local], 1);
    p.expert_meta[at] = make_int4(src, slot, header.x, k);
  }
  float weight_sum = 0.f;  // in k order, the same on every lane
  for (uint32_t rest = mask; rest; rest &= rest - 1) weight_sum += shuffle_float(weight, __ffs(rest) - 1);
  if (!idea(p, IDEA_INDEX)) {
    for (uint32_t rest = mask; rest; rest &= rest - 1) {
      const int from = __ffs(rest) - 1;
      const int64_t place = ((int64_t)warp_shuffle((int)(at >> 32), from) << 32) |
                            (uint32_t)warp_shuffle((int)(at & 0xffffffff), from);
      copy_row(p.expert_x + place * p.hidden, row, p.hidden, false);
    }
  }
  lay_out_and_send_home(nullptr, home_row(p, src, slot), row, p.hidden, 1.0f + p.rank, weight_sum, true, streaming);
}

// One call, one kernel, four parts that meet only through flags (no grid-wide barrier).
// NOTES: per call, every flag a part waits on carries this call's epoch; nothing is reset but expert_count (above).
__global__ void __launch_bounds__(A2A_MAX_THREADS, 1) all2all_kernel(A2AParams p) {
  TRACE_NOW(t_kernel);
  extern __shared__ uint8_t route_table[];
  uint16_t* slot_of = reinterpret_cast<uint16_t*>(route_table);
  uint8_t* dst_of = route_table + 2 * (size_t)p.slots;
  uint16_t* token_of = reinterpret_cast<uint16_t*>(route_table + ((size_t)p.slots * 3 + 15) / 16 * 16);
  __shared__ int totals[A2A_MAX_WORLD], row_start[A2A_MAX_WORLD + 1];
  __shared__ int warp_first[A2A_MAX_WARPS][A2A_MAX_WORLD];
  __shared__ int counts[A2A_MAX_WORLD], starts[A2A_MAX_WORLD + 1];
  const bool dedup = idea(p, IDEA_DEDUP), streaming = idea(p, IDEA_STREAMING);

  // Part 0, route; block 0 publishes the counts before any row moves, and zeroes the next call's expert counters.
  TRACE_NOW(t_route);
  route(p, slot_of, dst_of, token_of, totals, warp_first);
  if (threadIdx.x == 0) {
    int total = 0;
    for (int d = 0; d < p.world; ++d) { row_start[d] = total; total += totals[d]; }
    row_start[p.world] = total;
  }
  __syncthreads();
  TRACE_BLOCK(PH_ALL2ALL_ROUTE, t_route);
  if (blockIdx.x == 0) {
    TRACE_NOW(t_publish);
    if ((int)threadIdx.x < p.world)
      store_release_sys(on_rank<uint64_t>(p, threadIdx.x, p.heap.disp_count) + p.rank,
                        ((uint64_t)p.epoch << 32) | (uint32_t)totals[threadIdx.x]);
    int* next_counts = p.expert_count + ((p.epoch + 1) & 1) * p.num_local_experts;
    for (int e = threadIdx.x; e < p.num_local_experts; e += blockDim.x) next_counts[e] = 0;
    TRACE_BLOCK(PH_ALL2ALL_PUBLISH_COUNTS, t_publish);
  }

  // Part 1, send, flagged per row.
  if (dedup) send_rows(p, dst_of, token_of, row_start, streaming);
  else send_pairs(p, slot_of, dst_of, streaming);

  // Part 2, receive + expert + send home: the rows arriving from all sources are one index space (source-major,
  // starts[] from the counts). Its size is known only once every source's count is in: each block waits for the
  // counts (published first thing by every source), then each warp takes its share and waits per row on its flag.
  TRACE_NOW(t_counts);
  gather_counts(p, counts, starts);
  TRACE_BLOCK(PH_ALL2ALL_WAIT_COUNTS, t_counts);
  int* expert_count = p.expert_count + (p.epoch & 1) * p.num_local_experts;
  const Share arrivals = share_of(starts[p.world]);
  int src = 0;
  for (int arrival = arrivals.begin; arrival < arrivals.end; ++arrival) {
    while (arrival >= starts[src + 1]) ++src;
    const int slot = arrival - starts[src];
    const int64_t index = (int64_t)src * p.slots + slot;
    TRACE_NOW(t_wait);
    wait_flag(p, on_rank<int>(p, p.rank, p.heap.disp_flag) + index, WAIT_DISPATCHED_ROW, src, slot, lane_id() == 0);
    TRACE_WARP(PH_ALL2ALL_WAIT_ROW_FLAG, t_wait);
    TRACE_NOW(t_row);
    const __half* row = on_rank<__half>(p, p.rank, p.heap.disp_x) + index * p.hidden;
    const uint8_t* meta = on_rank<uint8_t>(p, p.rank, p.heap.disp_meta) + index * p.meta_bytes;
    if (dedup) receive_row(p, src, slot, row, meta, expert_count, streaming);
    else receive_pair(p, src, slot, row, meta, expert_count, streaming);
    publish(home_flag(p, src, slot), p.epoch);
    TRACE_WARP(PH_ALL2ALL_ROW_IN_AND_HOME, t_row);
  }

  // Part 3, reduce: units of (token, one warp-width of 16-byte columns), this warp's share in a contiguous range.
  // When the unit's token changes, lanes j < topk wait in parallel on the flag of each pair whose row moved; the
  // warp barrier then orders every lane's loads after those acquires. Each lane issues up to A2A_REDUCE_BATCH loads
  // before adding. With DEDUP a returned row is already weighted and covers every pair of its rank.
  const int columns = p.hidden / 8;
  const int chunks = (columns + A2A_WARP_SIZE - 1) / A2A_WARP_SIZE;
  const Share units = share_of(p.num_tokens * chunks);
  int ready_token = -1;
  for (int unit = units.begin; unit < units.end; ++unit) {
    const int token = unit / chunks;
    if (token != ready_token) {
      TRACE_NOW(t_wait);
      for (int k = lane_id(); k < p.topk; k += A2A_WARP_SIZE) {
        const int pair = token * p.topk + k;
        const int dst = dst_of[pair] & ~A2A_FIRST_OF_ROW;
        if (dst_of[pair] & A2A_FIRST_OF_ROW)
          wait_flag(p, combined_flag(p, dst, slot_of[pair]), WAIT_COMBINED_ROW, dst, slot_of[pair], true);
      }
      warp_sync();
      ready_token = token;
      TRACE_WARP(PH_ALL2ALL_WAIT_COMBINED, t_wait);
    }
    TRACE_NOW(t_reduce);
    const int column = (unit % chunks) * A2A_WARP_SIZE + lane_id();
    if (column < columns) {
      float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
      for (int k0 = 0; k0 < p.topk; k0 += A2A_REDUCE_BATCH) {
        uint4 rows[A2A_REDUCE_BATCH];
        float w[A2A_REDUCE_BATCH];
        bool taken[A2A_REDUCE_BATCH];
#pragma unroll
        for (int j = 0; j < A2A_REDUCE_BATCH; ++j) {
          const int pair = token * p.topk + k0 + j;
          taken[j] = k0 + j < p.topk && (dst_of[pair] & A2A_FIRST_OF_ROW);
          if (taken[j]) {
            rows[j] = reinterpret_cast<const uint4*>(
                combined_row(p, dst_of[pair] & ~A2A_FIRST_OF_ROW, slot_of[pair]))[column];
            w[j] = dedup ? 1.0f : __ldg(p.weights + pair);
          }
        }
#pragma unroll
        for (int j = 0; j < A2A_REDUCE_BATCH; ++j) {
          if (taken[j]) {
            const __half2* h = reinterpret_cast<const __half2*>(&rows[j]);
#pragma unroll
            for (int q = 0; q < 4; ++q) {
              const float2 f = __half22float2(h[q]);
              acc[2 * q] += w[j] * f.x;
              acc[2 * q + 1] += w[j] * f.y;
            }
          }
        }
      }
      uint4 packed;
      __half2* h = reinterpret_cast<__half2*>(&packed);
#pragma unroll
      for (int q = 0; q < 4; ++q) h[q] = __floats2half2_rn(acc[2 * q], acc[2 * q + 1]);
      reinterpret_cast<uint4*>(p.out + (int64_t)token * p.hidden)[column] = packed;
    }
    TRACE_WARP(PH_ALL2ALL_REDUCE, t_reduce);
  }
  TRACE_BLOCK_END(PH_ALL2ALL, t_kernel);
}

// What the host path costs, piece by piece (compare_ideas' host probes): a kernel that does nothing.
__global__ void __launch_bounds__(A2A_MAX_THREADS, 1) empty_kernel(A2AParams p) {}

// Host side of the heap and the launch: plain runtime calls, no torch. Return 0 or a runtime error code.
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

static size_t shared_bytes(const A2AParams& p) { return route_table_bytes(p.slots, p.world, p.max_tokens); }

// Cooperative: every block resident at once, or an error instead of a possible deadlock. PLAIN_LAUNCH: an ordinary
// launch of the same grid (resident at once only while nothing else occupies the GPU).
int launch_all2all(const A2AParams& p, int grid, int threads, cudaStream_t stream) {
  if (p.ideas & IDEA_PLAIN_LAUNCH) {
    all2all_kernel<<<grid, threads, shared_bytes(p), stream>>>(p);
    return (int)cudaGetLastError();
  }
  void* args[] = {const_cast<A2AParams*>(&p)};
  return (int)launch_cooperative((const void*)all2all_kernel, grid, threads, args, shared_bytes(p), stream);
}

int launch_empty(const A2AParams& p, int grid, int threads, bool cooperative, cudaStream_t stream) {
  if (!cooperative) {
    empty_kernel<<<grid, threads, shared_bytes(p), stream>>>(p);
    return (int)cudaGetLastError();
  }
  void* args[] = {const_cast<A2AParams*>(&p)};
  return (int)launch_cooperative((const void*)empty_kernel, grid, threads, args, shared_bytes(p), stream);
}

// Blocks of `threads` that can be resident at once on the whole device, with the route table's shared memory.
int max_resident_blocks(int threads, size_t shared, int* blocks) {
  int per_multiprocessor = 0, device = 0, multiprocessors = 0;
  cudaError_t err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_multiprocessor, all2all_kernel, threads,
                                                                  shared);
  if (err == cudaSuccess) err = cudaGetDevice(&device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&multiprocessors, cudaDevAttrMultiProcessorCount, device);
  *blocks = per_multiprocessor * multiprocessors;
  return (int)err;
}
"""

BINDING = r"""
// Only the headers this layer uses, not torch/extension.h: under the runner this file is compiled inside the first
// case's 60 s (WORKLOG, cold starts).
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
  TORCH_CHECK(err == 0, "a2a v6 ideas: ", what, " failed: ", cudaGetErrorString((cudaError_t)err));
}

// The fixed part of the parameter block arrives once per group and shape, by name (a dict).
using Dims = std::map<std::string, int64_t>;
static int64_t dim(const Dims& dims, const char* name) {
  auto found = dims.find(name);
  TORCH_CHECK(found != dims.end(), "a2a v6 ideas: the parameter block lacks '", name, "'");
  return found->second;
}
static HeapLayout heap_of(const Dims& d) {
  return heap_layout(dim(d, "world"), dim(d, "slots"), dim(d, "hidden"), dim(d, "topk"));
}

Dims heap_regions(Dims dims) {
  const HeapLayout l = heap_of(dims);
  return {{"disp_x", l.disp_x}, {"comb_y", l.comb_y}, {"disp_meta", l.disp_meta}, {"disp_flag", l.disp_flag},
          {"comb_flag", l.comb_flag}, {"disp_count", l.disp_count}, {"total", l.total}};
}

Dims scratch_regions(Dims dims) {
  const ScratchLayout l = scratch_layout(dim(dims, "num_local_experts"));
  return {{"expert_count", l.expert_count}, {"abandon", l.abandon}, {"total", l.total}};
}

int64_t route_table_size(int64_t slots, int64_t world, int64_t max_tokens) {
  return (int64_t)route_table_bytes((int)slots, (int)world, (int)max_tokens);
}

// Everything a call needs but its inputs: built once per group and shape; the tensors it holds stay alive with it.
// NOTES: the output is a cached view of `out`'s first num_tokens rows: the next call overwrites it.
struct CallState {
  A2AParams params;  // complete but for x, indices, weights, num_tokens and epoch
  at::Tensor heap_bases, scratch, expert_x, expert_meta, out;
  std::vector<at::Tensor> views;  // [num_tokens]: out.narrow(0, 0, num_tokens), made on first use
  int grid = 1, threads = 512;
};

int64_t state_create(Dims dims, at::Tensor heap_bases, at::Tensor scratch, at::Tensor expert_x,
                     at::Tensor expert_meta, at::Tensor out, int64_t report) {
  auto* s = new CallState();
  s->heap_bases = heap_bases; s->scratch = scratch; s->expert_x = expert_x; s->expert_meta = expert_meta; s->out = out;
  s->views.resize(out.size(0) + 1);
  A2AParams& p = s->params;
  p.heap_bases = heap_bases.data_ptr<int64_t>();
  p.heap = heap_of(dims);
  p.out = reinterpret_cast<__half*>(out.data_ptr());
  p.topk = dim(dims, "topk"); p.hidden = dim(dims, "hidden"); p.num_local_experts = dim(dims, "num_local_experts");
  p.rank = dim(dims, "rank"); p.world = dim(dims, "world"); p.slots = dim(dims, "slots");
  p.capacity = dim(dims, "capacity"); p.timeout_ns = dim(dims, "timeout_ns");
  p.max_tokens = dim(dims, "max_tokens"); p.meta_bytes = meta_bytes(p.topk); p.ideas = 0;
  const ScratchLayout l = scratch_layout(p.num_local_experts);
  TORCH_CHECK(scratch.numel() >= l.total, "a2a v6 ideas: scratch is smaller than its layout");
  int* words = scratch.data_ptr<int>();
  p.expert_count = words + l.expert_count;
  p.abandon = words + l.abandon;
  p.expert_x = reinterpret_cast<__half*>(expert_x.data_ptr());
  p.expert_meta = reinterpret_cast<int4*>(expert_meta.data_ptr());
  p.report = reinterpret_cast<uint64_t*>(report);
  p.epoch = 0;
  return reinterpret_cast<int64_t>(s);
}

void state_destroy(int64_t handle) { delete reinterpret_cast<CallState*>(handle); }

// The last call's sequence number (its parity picks the expert counters it used).
int64_t state_epoch(int64_t handle) { return reinterpret_cast<CallState*>(handle)->params.epoch; }

int64_t resident_blocks(int64_t handle, int64_t device, int64_t threads) {
  const at::cuda::OptionalCUDAGuard guard(on_device(device));
  int blocks = 0;
  check(max_resident_blocks((int)threads, shared_bytes(reinterpret_cast<CallState*>(handle)->params), &blocks),
        "querying occupancy");
  return blocks;
}

// The ideas of the calls that follow (every rank sets the same ones between the same two calls).
void set_ideas(int64_t handle, int64_t ideas) { reinterpret_cast<CallState*>(handle)->params.ideas = (int)ideas; }

// The host path piece by piece: 0 returns at once (the pybind call), 1 also binds the input's device and reads the
// current stream, 2 also launches an empty kernel of the same grid, 3 launches it cooperatively.
void host_probe(int64_t handle, int64_t mode, const at::Tensor& x) {
  if (mode == 0) return;
  const at::cuda::OptionalCUDAGuard guard(device_of(x));
  auto* s = reinterpret_cast<CallState*>(handle);
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  if (mode == 1) return;
  check(launch_empty(s->params, s->grid, s->threads, mode == 3, stream), "launching the empty kernel");
}

void set_launch(int64_t handle, int64_t grid, int64_t threads) {
  auto* s = reinterpret_cast<CallState*>(handle);
  TORCH_CHECK(threads % A2A_WARP_SIZE == 0 && threads >= 64 && threads <= A2A_MAX_THREADS && grid >= 1,
              "a2a v6 ideas: bad launch shape");
  s->grid = (int)grid; s->threads = (int)threads;
}

// The hot path: three input tensors in, a cached view of the output out.
at::Tensor run(int64_t handle, const at::Tensor& x, const at::Tensor& indices, const at::Tensor& weights) {
  const at::cuda::OptionalCUDAGuard guard(device_of(x));
  auto* s = reinterpret_cast<CallState*>(handle);
  TORCH_CHECK(x.is_contiguous() && indices.is_contiguous() && weights.is_contiguous(),
              "a2a v6 ideas: inputs must be contiguous");
  const int64_t num_tokens = x.size(0);
  TORCH_CHECK(num_tokens < (int64_t)s->views.size(), "a2a v6 ideas: more tokens than max_num_tokens");
  A2AParams p = s->params;
  p.x = reinterpret_cast<const __half*>(x.data_ptr());
  p.indices = indices.data_ptr<int>();
  p.weights = weights.data_ptr<float>();
  p.num_tokens = (int)num_tokens;
  p.epoch = ++s->params.epoch;
  check(launch_all2all(p, s->grid, s->threads, at::cuda::getCurrentCUDAStream()), "launching the all2all kernel");
  at::Tensor& view = s->views[num_tokens];
  if (!view.defined()) view = s->out.narrow(0, 0, num_tokens);
  return view;
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
  TORCH_CHECK(handle_bytes.numel() == (int64_t)sizeof(handle), "a2a v6 ideas: bad IPC handle size");
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
int64_t route_table_size(int64_t slots, int64_t world, int64_t max_tokens);
int64_t state_create(std::map<std::string, int64_t> dims, at::Tensor heap_bases, at::Tensor scratch,
                     at::Tensor expert_x, at::Tensor expert_meta, at::Tensor out, int64_t report);
void state_destroy(int64_t handle);
int64_t state_epoch(int64_t handle);
int64_t resident_blocks(int64_t handle, int64_t device, int64_t threads);
void set_ideas(int64_t handle, int64_t ideas);
void host_probe(int64_t handle, int64_t mode, const at::Tensor& x);
void set_launch(int64_t handle, int64_t grid, int64_t threads);
at::Tensor run(int64_t handle, const at::Tensor& x, const at::Tensor& indices, const at::Tensor& weights);
std::vector<int64_t> report_create(int64_t device_index);
"""

TRACE = os.environ.get("A2A_TRACE") == "1"
TRACE_PHASES = ("all2all", "all2all.route", "all2all.publish_counts", "all2all.send_row", "all2all.wait_counts",
                "all2all.wait_row_flag", "all2all.row_in_and_home", "all2all.wait_combined", "all2all.reduce")
TRACE_CAPACITY = 1 << 20  # records per rank between two trace_take() calls

# Each source includes the few headers it needs (WORKLOG, cold starts); a torch without the switch adds the default
# ones anyway, which costs build time, not correctness.
_ONLY_NAMED_HEADERS = ({"no_implicit_headers": True}
                       if "no_implicit_headers" in inspect.signature(load_inline).parameters else {})
# Built at import: under the runner, in every worker during the first case (torch lets one build, the rest wait).
_ext = load_inline(
    name="a2a_v6_ideas" + ("_trace" if TRACE else ""),
    cpp_sources=CPP_DECLS + ("void trace_attach(at::Tensor buffer);" if TRACE else ""),
    cuda_sources=[KERNELS, BINDING],
    functions=["heap_create", "heap_handle", "heap_open", "heap_close", "heap_free", "heap_regions", "scratch_regions",
               "route_table_size", "state_create", "state_destroy", "state_epoch", "resident_blocks", "set_launch",
               "run", "report_create", "set_ideas", "host_probe"]
    + (["trace_attach"] if TRACE else []),
    extra_cuda_cflags=["-O3"] + ([] if torch.version.hip else ["-arch=sm_90"]) + (["-DA2A_TRACE"] if TRACE else []),
    verbose=False,
    **_ONLY_NAMED_HEADERS,
)

SPIN_TIMEOUT_NS = int(float(os.environ.get("A2A_SPIN_TIMEOUT_S", "10")) * 1e9)
# Launch shape: (blocks per multiprocessor, threads per block), scaled by the multiprocessor count read from the
# device and capped at what can be resident at once (the cooperative launch requires it).
LAUNCH_SHAPE = (1, 512)
MAX_THREADS = 512  # A2A_MAX_THREADS
MAX_WORLD = 32  # A2A_MAX_WORLD: one lane per destination while routing
ROUTE_TABLE_BYTES_MAX = 48 * 1024  # dynamic shared memory any launch may use without opting in
MAX_TOPK = 32  # a row's pairs travel as a 32-bit mask
WAIT_KINDS = {1: "the row count", 2: "a dispatched row", 3: "a combined row"}
# The kernel's Idea bits, and what an idea needs switched on with it.
IDEAS = {"dedup": 1, "index": 2, "pull": 4, "relaxed_spin": 8, "streaming": 16, "plain_launch": 32}
REQUIRES = {"index": ("dedup",)}
# The host path piece by piece (host_probe modes), for tools/compare_ideas.py.
HOST_PROBES = {"pybind call only": 0, "+ device guard and stream": 1, "+ plain launch, empty kernel": 2,
               "+ cooperative launch, empty kernel": 3}


def ideas_mask(names) -> int:
    """The Idea bits of `names` and of what they require; ValueError naming an unknown one."""
    mask = 0
    for name in names:
        if name not in IDEAS:
            raise ValueError(f"unknown idea '{name}' (known: {', '.join(IDEAS)})")
        mask |= IDEAS[name] | ideas_mask(REQUIRES.get(name, ()))
    return mask


# As a submission, the scratch copy runs the ideas named in A2A_IDEAS (comma-separated; none: v5's algorithm).
IDEAS_ON = ideas_mask([n for n in os.environ.get("A2A_IDEAS", "").split(",") if n])
# (field, lowest bit, width) of the give-up word, as a2a/contract.py's GIVE_UP_FIELDS (pasted with the enum).
GIVE_UP_FIELDS = (("kind", 60, 4), ("peer", 52, 8), ("slot_plus_one", 28, 24), ("epoch", 0, 28))


class GiveUpReport:
    """The mapped host word a kernel writes when a spin-wait gives up, and a daemon thread that prints it at once.
    The kernel itself finishes (with wrong data, which the check then reports)."""

    def __init__(self, device: torch.device):
        self.host, self.device = _ext.report_create(device.index)
        self.rank = -1
        self.word = ctypes.c_uint64.from_address(self.host)
        threading.Thread(target=self._watch, name="a2a-give-up-report", daemon=True).start()

    def _watch(self):
        while not self.word.value:
            time.sleep(0.02)
        record = self.word.value
        field = {name: (record >> low) & ((1 << width) - 1) for name, low, width in GIVE_UP_FIELDS}
        slot = field["slot_plus_one"] - 1
        where = "" if slot < 0 else f", slot {slot}"
        print(f"[a2a v6_ideas] rank {self.rank}: gave up after {SPIN_TIMEOUT_NS // 1_000_000} ms waiting for "
              f"{WAIT_KINDS.get(field['kind'], field['kind'])} from rank {field['peer']}{where} "
              f"(call {field['epoch']})", file=sys.stderr, flush=True)


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
            raise ValueError(f"v6 moves rows in 16-byte pieces: hidden_dim must be a multiple of 8, not "
                             f"{cfg.hidden_dim}")
        if world_size > MAX_WORLD:
            raise ValueError(f"v6 routes with one lane per destination: at most {MAX_WORLD} ranks, not {world_size}")
        if cfg.experts_per_token > MAX_TOPK:
            raise ValueError(f"v6 sends a row's pairs as a 32-bit mask: at most {MAX_TOPK} experts per token, not "
                             f"{cfg.experts_per_token}")
        slots = cfg.max_num_tokens * cfg.experts_per_token
        if _ext.route_table_size(slots, world_size, cfg.max_num_tokens) > ROUTE_TABLE_BYTES_MAX:
            raise ValueError(f"v6 keeps its route table in shared memory ({ROUTE_TABLE_BYTES_MAX} bytes): "
                             f"max_num_tokens={cfg.max_num_tokens} x experts_per_token={cfg.experts_per_token} at "
                             f"world size {world_size} needs more")
        self.key = key
        self.device = device
        self.num_local_experts = cfg.num_experts // world_size
        self.capacity = cfg.max_num_tokens * world_size  # a source token reaches an expert at most once
        self.dims = {"topk": cfg.experts_per_token, "hidden": cfg.hidden_dim, "num_local_experts": self.num_local_experts,
                     "rank": rank, "world": world_size, "slots": slots, "capacity": self.capacity,
                     "max_tokens": cfg.max_num_tokens,
                     "timeout_ns": SPIN_TIMEOUT_NS}
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
        _ext.set_ideas(self.handle, IDEAS_ON)
        if TRACE:
            self.trace = torch.zeros(1 + 4 * TRACE_CAPACITY, dtype=torch.int64, device=device)
            _ext.trace_attach(self.trace)
        dist.barrier()  # every peer has mapped every heap before anyone writes

    def configure(self) -> None:
        """Applies LAUNCH_SHAPE (the grid capped at what can be resident at once)."""
        per_multiprocessor, threads = LAUNCH_SHAPE
        grid = min(max(1, round(per_multiprocessor * self.multiprocessors)),
                   _ext.resident_blocks(self.handle, self.device.index, threads))
        _ext.set_launch(self.handle, grid, threads)

    def expert_counts(self) -> torch.Tensor:
        """Rows the last call laid out per local expert (its counters, by call parity)."""
        start = _ext.scratch_regions(self.dims)["expert_count"]
        start += (_ext.state_epoch(self.handle) & 1) * self.num_local_experts
        return self.scratch[start:start + self.num_local_experts].cpu()

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


def configure(launch_shape=None) -> None:
    """Changes the launch shape, for this group's state too (tools/sweep_launch.py)."""
    global LAUNCH_SHAPE
    LAUNCH_SHAPE = launch_shape if launch_shape is not None else LAUNCH_SHAPE
    if _state is not None:
        _state.configure()


def configure_ideas(names) -> None:
    """Switches the ideas of the calls that follow (tools/compare_ideas.py); every rank must switch alike."""
    global IDEAS_ON
    IDEAS_ON = ideas_mask(names)
    if _state is not None:
        _ext.set_ideas(_state.handle, IDEAS_ON)


def host_probe(data, mode: int) -> None:
    """One call of the host path cut short at `mode` (HOST_PROBES); the state must exist (one full call first)."""
    _ext.host_probe(_state.handle, mode, data[1].x)


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
    x = rank_data.x
    key = (rank, world_size, x.get_device(), cfg.num_experts, cfg.experts_per_token, cfg.hidden_dim,
           cfg.max_num_tokens)
    state = _state if key == _state_key else _new_state(key, cfg, rank, world_size, x.device)
    return _ext.run(state.handle, x, rank_data.indices, rank_data.weights)
