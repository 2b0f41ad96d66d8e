// Device helpers shared by the one-launch kernels (predictor_kernel.cu, talker_kernel.cu): one block per
// multiprocessor running phases separated by grid-wide barriers, weights staged into shared memory by the
// bulk-copy engine, vectors read from the L2 (other blocks wrote them), bfloat16 rounding as the per-layer
// Triton kernels (decode_kernels.py) round.

#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <string>

namespace persistent {

using T = __nv_bfloat16;

constexpr int HD = 128;  // head dim

__device__ __forceinline__ float rnd(float v) { return __bfloat162float(__float2bfloat16(v)); }

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Barrier of the block's first THREADS threads (a kernel may keep a warp beyond them out of its phases).
template <int THREADS>
__device__ __forceinline__ void sync_threads() {
  asm volatile("bar.sync 1, %0;" ::"n"(THREADS) : "memory");
}

// Grid-wide barrier of the blocks' first THREADS threads: block arrivals counted (release: the block's writes,
// ordered before by the block barrier, become visible with it), thread 0 spinning until all have arrived
// (acquire).
template <int THREADS>
__device__ __forceinline__ void grid_sync(unsigned* counter, unsigned& target) {
  sync_threads<THREADS>();
  target += gridDim.x;
  if (threadIdx.x == 0) {
    asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(counter) : "memory");
    unsigned v;
    do {
      asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(counter) : "memory");
    } while (v < target);
  }
  sync_threads<THREADS>();
}

__device__ __forceinline__ unsigned smem_addr(const void* ptr) {
  return static_cast<unsigned>(__cvta_generic_to_shared(ptr));
}

// One arrival on `bar` (release: this thread's reads of what it guards are done).
__device__ __forceinline__ void arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(bar)) : "memory");
}

// Initialise n mbarriers whose phases complete after `count` arrivals each, visible to the whole block.
__device__ __forceinline__ void init_barriers(uint64_t* bars, int n, unsigned count = 1) {
  if (threadIdx.x == 0) {
    for (int i = 0; i < n; ++i)
      asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bars + i)), "r"(count));
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
}

// Announce `bytes` of bulk copies completing on `bar` (the arrival of this phase of it); the buffer's last
// readers (generic proxy) came before.
__device__ __forceinline__ void expect_copies(uint64_t* bar, unsigned bytes) {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(bytes)
               : "memory");
}

// Copy `bytes` (a multiple of 16) from global `src` to shared `dst` with the bulk-copy engine, completing on `bar`.
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, unsigned bytes, uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
               ::"r"(smem_addr(dst)), "l"(src), "r"(bytes), "r"(smem_addr(bar)) : "memory");
}

// Wait until the copies completing on `bar` for its `parity`-th phase (mod 2) have landed.
__device__ __forceinline__ void wait_copies(uint64_t* bar, unsigned parity) {
  asm volatile(
      "{\n .reg .pred done;\n WAIT_%=:\n mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      " @!done bra WAIT_%=;\n}" ::"r"(smem_addr(bar)), "r"(parity) : "memory");
}

// Dot products of N weight rows w[i] with the input xb (each k elements, 16-byte aligned, shared memory), summed
// over the warp into acc: the input is read once for the N rows. It is held in bfloat16, as every input is a
// rounded value: 16 bytes a lane, like the weights, so the reads are free of bank conflicts (float inputs took
// twice the bytes, read with a two-way conflict).
template <int N>
__device__ __forceinline__ void dot_rows(const T* const (&w)[N], const T* xb, int k, int lane, float (&acc)[N]) {
  // Four sums a row, one per pair of a chunk's products: four independent chains of fused multiply-adds, so a
  // warp issues one every cycle instead of waiting on one chain of eight.
  float s[N][4];
#pragma unroll
  for (int i = 0; i < N; ++i) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.f;
#pragma unroll 2
  for (int c = lane; c < k / 8; c += 32) {
    const uint4 xr = reinterpret_cast<const uint4*>(xb)[c];
    const __nv_bfloat162* xh = reinterpret_cast<const __nv_bfloat162*>(&xr);
    float2 x[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) x[j] = __bfloat1622float2(xh[j]);
#pragma unroll
    for (int i = 0; i < N; ++i) {
      const uint4 wr = reinterpret_cast<const uint4*>(w[i])[c];
      const __nv_bfloat162* wh = reinterpret_cast<const __nv_bfloat162*>(&wr);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float2 wf = __bfloat1622float2(wh[j]);
        s[i][j] = fmaf(wf.y, x[j].y, fmaf(wf.x, x[j].x, s[i][j]));
      }
    }
  }
#pragma unroll
  for (int i = 0; i < N; ++i) acc[i] = warp_sum((s[i][0] + s[i][1]) + (s[i][2] + s[i][3]));
}

// 8 values at v (16-byte aligned; written by other blocks: read from the L2) as floats into dst.
__device__ __forceinline__ void load8(float* dst, const T* v) {
  uint4 raw = __ldcg(reinterpret_cast<const uint4*>(v));
  const __nv_bfloat162* h2 = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    float2 f = __bfloat1622float2(h2[i]);
    dst[2 * i] = f.x, dst[2 * i + 1] = f.y;
  }
}

// xb = vector v (n elements) and xr = the floats of the residual stream x (H elements), in one round trip to
// the L2 (THREADS: the block's threads).
template <int H, int THREADS>
__device__ void load_vec(T* xb, const T* v, int n, float* xr, const T* x) {
  for (int c = threadIdx.x; c < n / 8; c += THREADS)
    reinterpret_cast<uint4*>(xb)[c] = __ldcg(reinterpret_cast<const uint4*>(v) + c);
  for (int c = threadIdx.x; c < H / 8; c += THREADS) load8(xr + 8 * c, x + 8 * c);
  sync_threads<THREADS>();
}

// xb = RMSNorm(x, w) over H values (8 a thread: H / 8 <= THREADS) rounded as the torch layers round it:
// normalise in float32, round, scale by w, round. red: [THREADS / 32] scratch.
template <int H, int THREADS>
__device__ void load_norm(T* xb, float* red, const T* x, const T* w, float eps) {
  static_assert(H / 8 <= THREADS, "8 values a thread");
  float ss = 0.f, v[8], wn[8];
  const bool mine = threadIdx.x < H / 8;  // 8 values a thread, the norm weights loaded with them
  if (mine) {
    load8(v, x + 8 * threadIdx.x);
    load8(wn, w + 8 * threadIdx.x);
#pragma unroll
    for (int i = 0; i < 8; ++i) ss += v[i] * v[i];
  }
  ss = warp_sum(ss);
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = ss;
  sync_threads<THREADS>();
  float tot = 0.f;
#pragma unroll
  for (int i = 0; i < THREADS / 32; ++i) tot += red[i];
  const float inv = 1.f / sqrtf(tot / H + eps);
  if (mine) {
    __nv_bfloat162 out[4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
      out[i] = __floats2bfloat162_rn(rnd(v[2 * i] * inv) * wn[2 * i], rnd(v[2 * i + 1] * inv) * wn[2 * i + 1]);
    reinterpret_cast<uint4*>(xb)[threadIdx.x] = *reinterpret_cast<const uint4*>(out);
  }
  sync_threads<THREADS>();
}

// The rounded RoPE cosines and sines of position `pos` into cs, sn [HD / 2] (threads [0, HD / 2)).
__device__ __forceinline__ void rope_table(float* cs, float* sn, const float* inv_freq, long long pos) {
  if (threadIdx.x < HD / 2) {
    const float f = static_cast<float>(pos) * inv_freq[threadIdx.x];
    cs[threadIdx.x] = rnd(cosf(f)), sn[threadIdx.x] = rnd(sinf(f));
  }
}

__device__ __forceinline__ float as_float(float v) { return v; }
__device__ __forceinline__ float as_float(T v) { return __bfloat162float(v); }
__device__ __forceinline__ void store(float& dst, float v) { dst = v; }
__device__ __forceinline__ void store(T& dst, float v) { dst = __float2bfloat16(v); }

// Query/key head norm and RoPE of one head's HD values at v (shared memory, one warp; lane owns r = lane,
// lane + 32 of each half), in place, times `scale`: as `_norm_rope` in triton_decode/attention.py. cs/sn: the
// position's rounded cosines and sines [HD / 2]; w: the norm weights [HD] (float).
template <typename V>
__device__ void norm_rope(V* v, const float* w, const float* cs, const float* sn, float eps, float scale) {
  const int lane = threadIdx.x & 31;
  float x1[2], x2[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) x1[i] = as_float(v[lane + 32 * i]), x2[i] = as_float(v[HD / 2 + lane + 32 * i]);
  const float ss = warp_sum(x1[0] * x1[0] + x1[1] * x1[1] + x2[0] * x2[0] + x2[1] * x2[1]);
  const float inv = 1.f / sqrtf(ss / HD + eps);
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int r = lane + 32 * i;
    const float a = rnd(rnd(x1[i] * inv) * w[r]), b = rnd(rnd(x2[i] * inv) * w[HD / 2 + r]);
    store(v[r], rnd(a * cs[r] - b * sn[r]) * scale);
    store(v[HD / 2 + r], rnd(b * cs[r] + a * sn[r]) * scale);
  }
}

inline void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

}  // namespace persistent
