#!POPCORN leaderboard amd-all2all
#!POPCORN gpu MI300x8
"""v2 - P2P: a symmetric heap, kernels that write straight into peers' memory, per-token flags.

Dispatch-send writes every (token, k) row into its owner's receive slots on the owner's heap, with a per-slot flag
raised by a system-scope release store; the last block to finish publishes the per-destination row counts.
Dispatch-recv waits for the counts and each slot's flag (acquire) and lays rows out per local expert. The expert
scales them in place. Combine-send writes each result back into the source rank's heap, flagged the same way;
combine-recv waits for the top-k results of each token and sums them with the weights in float32.

Flags carry the call's sequence number (epoch), so no flag is ever reset: a stale value from an earlier call never
equals the current epoch. Every rank makes the same calls in a process group, so epochs agree across ranks.

The device source is CUDA with a small portable prelude (the only place where AMD and NVIDIA differ); PyTorch
hipifies it when `load_inline` runs on ROCm. KERNELS holds no torch headers (it is what `make check-device`
compiles for sm_90, gfx940 and gfx90a); BINDING is the thin torch layer.

Trace build (A2A_TRACE=1 at import; its own extension name, so the timed build never contains probes): the kernels
record (phase, block, warp, start, end) with the device clock into a per-rank buffer that `trace_take()` reads;
`python eval.py trace v2` turns them into a timeline.
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
#endif
// ---------------------------------------------------------------------------------------------------------------

#define A2A_THREADS 256
#define A2A_WARPS (A2A_THREADS / A2A_WARP_SIZE)

// Heap layout, identical on every rank (offsets in bytes from the heap base). `slots` = max_tokens * topk: the most
// rows one source can send to one destination. Rows are hidden_dim halves.
//   disp_x    [world][slots] rows    written by the source (dispatch-send), read by this rank
//   comb_y    [world][slots] rows    written by the expert's rank (combine-send), read by this rank
//   disp_meta [world][slots] int4    (token, k, global expert, 0), written with disp_x
//   disp_flag [world][slots] int     = epoch once the slot's row and meta are in place
//   comb_flag [world][slots] int     = epoch once comb_y's row is in place
//   disp_count[world]        uint64  = (epoch << 32) | rows sent by that source this call
struct A2AParams {
  const __half* x;
  const int* indices;
  const float* weights;
  __half* out;
  const int64_t* heap_bases;
  int64_t off_disp_x, off_comb_y, off_disp_meta, off_disp_flag, off_comb_flag, off_disp_count;
  int* send_counter;   // [world] local; NOTES: zero between calls (the last dispatch-send block resets it)
  int* blocks_done;    // [1] local;     NOTES: zero between calls (the last dispatch-send block resets it)
  int* pair_slot;      // [tokens * topk] local: slot each pair got on its destination
  int* pair_dst;       // [tokens * topk] local: destination rank of each pair
  int* expert_count;   // [local experts] local; NOTES: zeroed by the host (memset) before dispatch-recv
  __half* expert_x;    // [local experts][capacity] rows
  int4* expert_meta;   // [local experts][capacity] (src rank, slot, token, k)
  int* recv_list;      // [world * slots] arrival index -> local expert * capacity + position
  int* recv_total;     // [1] rows received this call, written by dispatch-recv
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

// Timeline probes: compiled only with -DA2A_TRACE. A record is (phase, block << 16 | warp, start ns, end ns) in a
// per-rank buffer whose first word counts the records; phase names are TRACE_PHASES in Python, in this order.
#if defined(A2A_TRACE)
enum TracePhase {
  PH_DISPATCH_SEND, PH_SEND_ROW, PH_PUBLISH_COUNTS, PH_DISPATCH_RECV, PH_WAIT_COUNTS, PH_WAIT_ROW_FLAG, PH_COPY_IN,
  PH_EXPERT, PH_COMBINE_SEND, PH_COMBINE_ROW, PH_COMBINE_RECV, PH_WAIT_COMBINED, PH_REDUCE
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

// Makes the warp's row writes visible system-wide, then raises the flag (one lane, release).
__device__ __forceinline__ void publish(int* flag, int epoch) {
  __threadfence_system();
  warp_sync();
  if (lane_id() == 0) store_release_sys(flag, epoch);
}

__global__ void __launch_bounds__(A2A_THREADS) dispatch_send(A2AParams p) {
  TRACE_NOW(t_kernel);
  const int warp = blockIdx.x * A2A_WARPS + threadIdx.x / A2A_WARP_SIZE;
  const int num_warps = gridDim.x * A2A_WARPS;
  for (int pair = warp; pair < p.num_tokens * p.topk; pair += num_warps) {
    TRACE_NOW(t_row);
    const int token = pair / p.topk, k = pair % p.topk;
    const int expert = p.indices[pair];
    const int dst = expert / p.num_local_experts;
    int slot = 0;
    if (lane_id() == 0) slot = atomicAdd(&p.send_counter[dst], 1);
    slot = warp_broadcast(slot, 0);
    const int64_t index = (int64_t)p.rank * p.slots + slot;  // this rank's region on dst
    copy_row(on_rank<__half>(p, dst, p.off_disp_x) + index * p.hidden, p.x + (int64_t)token * p.hidden, p.hidden);
    if (lane_id() == 0) {
      on_rank<int4>(p, dst, p.off_disp_meta)[index] = make_int4(token, k, expert, 0);
      p.pair_slot[pair] = slot;
      p.pair_dst[pair] = dst;
    }
    publish(on_rank<int>(p, dst, p.off_disp_flag) + index, p.epoch);
    TRACE_WARP(PH_SEND_ROW, t_row);
  }
  // The last block to finish knows the final per-destination counts and publishes them.
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
    store_release_sys(on_rank<uint64_t>(p, dst, p.off_disp_count) + p.rank, ((uint64_t)p.epoch << 32) | (uint32_t)count);
    p.send_counter[dst] = 0;
    if (dst == 0) *p.blocks_done = 0;
    TRACE_BLOCK(PH_PUBLISH_COUNTS, t_counts);
  }
  TRACE_BLOCK(PH_DISPATCH_SEND, t_kernel);
}

// Reads the per-source counts into shared memory (waiting for this call's epoch); returns the total.
__device__ int gather_counts(const A2AParams& p, int* counts) {
  if (threadIdx.x < p.world)
    counts[threadIdx.x] = wait_count(p, on_rank<uint64_t>(p, p.rank, p.off_disp_count) + threadIdx.x, threadIdx.x);
  __syncthreads();
  int total = 0;
  for (int r = 0; r < p.world; ++r) total += counts[r];
  return total;
}

__global__ void __launch_bounds__(A2A_THREADS) dispatch_recv(A2AParams p) {
  TRACE_NOW(t_kernel);
  __shared__ int counts[64];
  const int total = gather_counts(p, counts);
  TRACE_BLOCK(PH_WAIT_COUNTS, t_kernel);
  if (blockIdx.x == 0 && threadIdx.x == 0) *p.recv_total = total;
  const int warp = blockIdx.x * A2A_WARPS + threadIdx.x / A2A_WARP_SIZE;
  const int num_warps = gridDim.x * A2A_WARPS;
  const int first_expert = p.rank * p.num_local_experts;
  for (int arrival = warp; arrival < total; arrival += num_warps) {
    int src = 0, slot = arrival;
    while (slot >= counts[src]) slot -= counts[src++];
    const int64_t index = (int64_t)src * p.slots + slot;
    TRACE_NOW(t_wait);
    wait_flag(p, on_rank<int>(p, p.rank, p.off_disp_flag) + index, WAIT_DISPATCHED_ROW, src, slot);
    TRACE_WARP(PH_WAIT_ROW_FLAG, t_wait);
    TRACE_NOW(t_copy);
    const int4 meta = on_rank<int4>(p, p.rank, p.off_disp_meta)[index];
    const int local = meta.z - first_expert;
    int position = 0;
    if (lane_id() == 0) position = atomicAdd(&p.expert_count[local], 1);
    position = warp_broadcast(position, 0);
    const int64_t row = (int64_t)local * p.capacity + position;
    copy_row(p.expert_x + row * p.hidden, on_rank<__half>(p, p.rank, p.off_disp_x) + index * p.hidden, p.hidden);
    if (lane_id() == 0) {
      p.expert_meta[row] = make_int4(src, slot, meta.x, meta.y);
      p.recv_list[arrival] = (int)row;
    }
    TRACE_WARP(PH_COPY_IN, t_copy);
  }
  TRACE_BLOCK_END(PH_DISPATCH_RECV, t_kernel);
}

// The simulated expert: y = x * (1 + rank), rounded to half once, in place.
__global__ void __launch_bounds__(A2A_THREADS) expert_scale(A2AParams p) {
  TRACE_NOW(t_kernel);
  const int total = *p.recv_total;
  const float scale = 1.0f + p.rank;
  const int vectors = p.hidden / 2;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < (int64_t)total * vectors;
       i += (int64_t)gridDim.x * blockDim.x) {
    __half2* row = reinterpret_cast<__half2*>(p.expert_x + (int64_t)p.recv_list[i / vectors] * p.hidden);
    float2 v = __half22float2(row[i % vectors]);
    row[i % vectors] = __floats2half2_rn(v.x * scale, v.y * scale);
  }
  TRACE_BLOCK_END(PH_EXPERT, t_kernel);
}

__global__ void __launch_bounds__(A2A_THREADS) combine_send(A2AParams p) {
  TRACE_NOW(t_kernel);
  const int total = *p.recv_total;
  const int warp = blockIdx.x * A2A_WARPS + threadIdx.x / A2A_WARP_SIZE;
  const int num_warps = gridDim.x * A2A_WARPS;
  for (int arrival = warp; arrival < total; arrival += num_warps) {
    TRACE_NOW(t_row);
    const int row = p.recv_list[arrival];
    const int4 meta = p.expert_meta[row];  // (src rank, slot, token, k)
    const int64_t index = (int64_t)p.rank * p.slots + meta.y;  // this rank's region on the source
    copy_row(on_rank<__half>(p, meta.x, p.off_comb_y) + index * p.hidden, p.expert_x + (int64_t)row * p.hidden,
             p.hidden);
    publish(on_rank<int>(p, meta.x, p.off_comb_flag) + index, p.epoch);
    TRACE_WARP(PH_COMBINE_ROW, t_row);
  }
  TRACE_BLOCK_END(PH_COMBINE_SEND, t_kernel);
}

__global__ void __launch_bounds__(A2A_THREADS) combine_recv(A2AParams p) {
  TRACE_NOW(t_kernel);
  const int warp = blockIdx.x * A2A_WARPS + threadIdx.x / A2A_WARP_SIZE;
  const int num_warps = gridDim.x * A2A_WARPS;
  const __half* comb_y = on_rank<__half>(p, p.rank, p.off_comb_y);
  const int* comb_flag = on_rank<int>(p, p.rank, p.off_comb_flag);
  for (int token = warp; token < p.num_tokens; token += num_warps) {
    TRACE_NOW(t_wait);
    for (int k = 0; k < p.topk; ++k) {
      const int pair = token * p.topk + k;
      wait_flag(p, comb_flag + (int64_t)p.pair_dst[pair] * p.slots + p.pair_slot[pair], WAIT_COMBINED_ROW,
                p.pair_dst[pair], p.pair_slot[pair]);
    }
    TRACE_WARP(PH_WAIT_COMBINED, t_wait);
    TRACE_NOW(t_reduce);
    for (int v = lane_id(); v < p.hidden / 8; v += A2A_WARP_SIZE) {
      float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
      for (int k = 0; k < p.topk; ++k) {
        const int pair = token * p.topk + k;
        const int64_t index = (int64_t)p.pair_dst[pair] * p.slots + p.pair_slot[pair];
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
  TRACE_BLOCK_END(PH_COMBINE_RECV, t_kernel);
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

int launch_all2all(const A2AParams& p, int grid, cudaStream_t stream) {
  dispatch_send<<<grid, A2A_THREADS, 0, stream>>>(p);
  cudaMemsetAsync(p.expert_count, 0, sizeof(int) * p.num_local_experts, stream);
  dispatch_recv<<<grid, A2A_THREADS, 0, stream>>>(p);
  expert_scale<<<grid, A2A_THREADS, 0, stream>>>(p);
  combine_send<<<grid, A2A_THREADS, 0, stream>>>(p);
  combine_recv<<<grid, A2A_THREADS, 0, stream>>>(p);
  return (int)cudaGetLastError();
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
  TORCH_CHECK(err == 0, "a2a v2: ", what, " failed: ", cudaGetErrorString((cudaError_t)err));
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
  TORCH_CHECK(handle_bytes.numel() == (int64_t)sizeof(handle), "a2a v2: bad IPC handle size");
  memcpy(&handle, handle_bytes.cpu().data_ptr(), sizeof(handle));
  void* base = nullptr;
  check(heap_import(&base, handle), "cudaIpcOpenMemHandle");
  return reinterpret_cast<int64_t>(base);
}

// Returns (host address, device address) of the give-up report word.
std::vector<int64_t> report_create(int64_t device_index) {
  const at::cuda::OptionalCUDAGuard guard(on_device(device_index));
  uint64_t *host = nullptr, *device = nullptr;
  check(report_alloc(&host, &device), "allocating the give-up report");
  return {reinterpret_cast<int64_t>(host), reinterpret_cast<int64_t>(device)};
}

// Teardown reports its error code instead of raising: a peer of a finished group may already have freed its heap.
int64_t heap_close(int64_t base) { return heap_unimport(reinterpret_cast<void*>(base)); }
int64_t heap_free(int64_t base) { return heap_release(reinterpret_cast<void*>(base)); }

void all2all(at::Tensor x, at::Tensor indices, at::Tensor weights, at::Tensor out,
             at::Tensor heap_bases, std::vector<int64_t> offsets, at::Tensor scratch, at::Tensor expert_x,
             at::Tensor expert_meta, std::vector<int64_t> dims, int64_t grid, int64_t report) {
  const at::cuda::OptionalCUDAGuard guard(device_of(x));
  A2AParams p;
  p.report = reinterpret_cast<uint64_t*>(report);
  p.x = reinterpret_cast<const __half*>(x.data_ptr());
  p.indices = indices.data_ptr<int>();
  p.weights = weights.data_ptr<float>();
  p.out = reinterpret_cast<__half*>(out.data_ptr());
  p.heap_bases = heap_bases.data_ptr<int64_t>();
  p.off_disp_x = offsets[0]; p.off_comb_y = offsets[1]; p.off_disp_meta = offsets[2];
  p.off_disp_flag = offsets[3]; p.off_comb_flag = offsets[4]; p.off_disp_count = offsets[5];
  p.num_tokens = dims[0]; p.topk = dims[1]; p.hidden = dims[2]; p.num_local_experts = dims[3]; p.rank = dims[4];
  p.world = dims[5]; p.slots = dims[6]; p.capacity = dims[7]; p.epoch = dims[8]; p.timeout_ns = dims[9];
  // scratch (int32): send_counter[world] | blocks_done[1] | recv_total[1] | expert_count[local] | pair_slot[slots]
  //                  | pair_dst[slots] | abandon[1] | recv_list[world * slots]
  int* s = scratch.data_ptr<int>();
  p.send_counter = s; s += p.world;
  p.blocks_done = s; s += 1;
  p.recv_total = s; s += 1;
  p.expert_count = s; s += p.num_local_experts;
  p.pair_slot = s; s += p.slots;
  p.pair_dst = s; s += p.slots;
  p.abandon = s; s += 1;
  p.recv_list = s;
  p.expert_x = reinterpret_cast<__half*>(expert_x.data_ptr());
  p.expert_meta = reinterpret_cast<int4*>(expert_meta.data_ptr());
  check(launch_all2all(p, (int)grid, at::cuda::getCurrentCUDAStream()), "launching the all2all kernels");
}

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
void all2all(at::Tensor x, at::Tensor indices, at::Tensor weights, at::Tensor out,
             at::Tensor heap_bases, std::vector<int64_t> offsets, at::Tensor scratch, at::Tensor expert_x,
             at::Tensor expert_meta, std::vector<int64_t> dims, int64_t grid, int64_t report);
std::vector<int64_t> report_create(int64_t device_index);
"""

TRACE = os.environ.get("A2A_TRACE") == "1"
TRACE_PHASES = ("dispatch_send", "dispatch_send.row_out", "dispatch_send.publish_counts", "dispatch_recv",
                "dispatch_recv.wait_counts", "dispatch_recv.wait_row_flag", "dispatch_recv.copy_in", "expert",
                "combine_send", "combine_send.row_out", "combine_recv", "combine_recv.wait_rows", "combine_recv.reduce")
TRACE_CAPACITY = 1 << 20  # records per rank between two trace_take() calls

# Each source includes the few headers it needs: the ones load_inline adds by default (torch/extension.h,
# torch/types.h) were most of a 45-49 s cold build on H200, inside the runner's 60 s first case (WORKLOG). A torch
# without the switch adds them anyway, which costs time, not correctness.
_ONLY_NAMED_HEADERS = ({"no_implicit_headers": True}
                       if "no_implicit_headers" in inspect.signature(load_inline).parameters else {})
# Built at import: under the runner, in every worker during the first case (torch lets one build, the rest wait).
_ext = load_inline(
    name="a2a_v2_p2p" + ("_trace" if TRACE else ""),
    cpp_sources=CPP_DECLS + ("void trace_attach(at::Tensor buffer);" if TRACE else ""),
    cuda_sources=[KERNELS, BINDING],
    functions=["heap_create", "heap_handle", "heap_open", "heap_close", "heap_free", "all2all", "report_create"]
    + (["trace_attach"] if TRACE else []),
    extra_cuda_cflags=["-O3"] + ([] if torch.version.hip else ["-arch=sm_90"]) + (["-DA2A_TRACE"] if TRACE else []),
    verbose=False,
    **_ONLY_NAMED_HEADERS,
)

SPIN_TIMEOUT_NS = int(float(os.environ.get("A2A_SPIN_TIMEOUT_S", "10")) * 1e9)
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
        print(f"[a2a v2] rank {self.rank}: gave up after {SPIN_TIMEOUT_NS // 1_000_000} ms waiting for "
              f"{WAIT_KINDS.get(kind, kind)} from rank {peer}{where} (call {epoch})", file=sys.stderr, flush=True)


_report = None
ALIGN = 256


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


class P2PState:
    """One process group's symmetric heap and scratch buffers. Built on the first call in a group (a collective:
    every rank builds at the same call); closed when the group is destroyed (the next group may put this process on
    another GPU) or when the shape changes.

    NOTES: it must hold no reference to the process group: a live group object keeps its TCP store listening on
    the rendezvous port, and the runner's next group, whose rank 0 may be another process, then fails with
    EADDRINUSE (seen on H200x4 with the fixed port the runner uses)."""

    def __init__(self, cfg, rank: int, world_size: int, device: torch.device):
        self.key = _state_key(cfg, rank, world_size, device)
        self.device = device
        self.slots = cfg.max_num_tokens * cfg.experts_per_token
        self.num_local_experts = cfg.num_experts // world_size
        self.capacity = cfg.max_num_tokens * world_size  # a source token reaches an expert at most once
        row_bytes = cfg.hidden_dim * 2
        region = world_size * self.slots
        sizes = [region * row_bytes, region * row_bytes, region * 16, region * 4, region * 4, world_size * 8]
        self.offsets, total = [], 0
        for size in sizes:
            self.offsets.append(total)
            total += _align(size)
        self.base = _ext.heap_create(device.index, total)
        mine = _ext.heap_handle(device.index, self.base).to(device)
        handles = torch.empty(world_size, mine.numel(), dtype=torch.uint8, device=device)
        dist.all_gather_into_tensor(handles, mine)
        handles = handles.cpu()
        self.peers = {r: _ext.heap_open(device.index, handles[r]) for r in range(world_size) if r != rank}
        bases = [self.base if r == rank else self.peers[r] for r in range(world_size)]
        self.heap_bases = torch.tensor(bases, dtype=torch.int64, device=device)
        self.scratch = torch.zeros(world_size + 2 + self.num_local_experts + 2 * self.slots + 1 + region,
                                   dtype=torch.int32, device=device)
        self.expert_x = torch.empty(self.num_local_experts * self.capacity, cfg.hidden_dim, dtype=torch.float16,
                                    device=device)
        self.expert_meta = torch.empty(self.num_local_experts * self.capacity, 4, dtype=torch.int32, device=device)
        self.grid = torch.cuda.get_device_properties(device).multi_processor_count
        self.epoch = 0
        if TRACE:
            self.trace = torch.zeros(1 + 4 * TRACE_CAPACITY, dtype=torch.int64, device=device)
            _ext.trace_attach(self.trace)
        dist.barrier()  # every peer has mapped every heap before anyone writes

    def close(self):
        """Unmaps the peers' heaps and frees ours; error codes are ignored (the group is over)."""
        with torch.cuda.device(self.device):
            torch.cuda.synchronize()
            for base in self.peers.values():
                _ext.heap_close(base)
            _ext.heap_free(self.base)


_state = None


def _state_key(cfg, rank, world_size, device):
    return (rank, world_size, device, cfg.num_experts, cfg.experts_per_token, cfg.hidden_dim, cfg.max_num_tokens)


def _close_state() -> None:
    global _state
    if _state is not None:
        _state.close()
        _state = None


def _get_state(cfg, rank: int, world_size: int, device: torch.device) -> P2PState:
    global _state
    if _state is not None and _state.key != _state_key(cfg, rank, world_size, device):
        _close_state()
    if _state is None:
        _state = P2PState(cfg, rank, world_size, device)
    return _state


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
    x = rank_data.x.contiguous()
    if cfg.hidden_dim % 8:
        raise ValueError(f"v2 moves rows in 16-byte pieces: hidden_dim must be a multiple of 8, not {cfg.hidden_dim}")
    global _report
    if _report is None:
        _report = GiveUpReport(x.device)
    _report.rank = rank
    state = _get_state(cfg, rank, world_size, x.device)
    state.epoch += 1
    out = torch.empty(rank_data.num_tokens, cfg.hidden_dim, dtype=cfg.out_dtype, device=x.device)
    dims = [rank_data.num_tokens, cfg.experts_per_token, cfg.hidden_dim, state.num_local_experts, rank, world_size,
            state.slots, state.capacity, state.epoch, SPIN_TIMEOUT_NS]
    _ext.all2all(x, rank_data.indices.contiguous(), rank_data.weights.contiguous(), out, state.heap_bases,
                 state.offsets, state.scratch, state.expert_x, state.expert_meta, dims, state.grid, _report.device)
    return out
