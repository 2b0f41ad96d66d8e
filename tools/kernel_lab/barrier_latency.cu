// How long a grid-wide barrier takes on this GPU, idle and while the blocks stream weights from HBM with the
// bulk-copy engine as the one-launch kernels do (streamvox/models/qwen3_tts/kernels/{talker,predictor}_kernel.cu).
//
// One block per multiprocessor runs N barriers back to back; before each, thread 0 writes the barrier's
// number into its own word, after it reads its neighbour's (a stale read is counted: every design here must
// report 0). While streaming, the block's last warp keeps SLOTS bulk copies of SLOT bytes in flight from a
// 4 GiB buffer (every EVERY-th block only, for the rows that say so) and the stream's rate is reported.
//
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a tools/kernel_lab/barrier_latency.cu -o /tmp/bl
//   /tmp/bl
#include <cuda_runtime.h>

#include <cstdio>

namespace {

constexpr int THREADS = 512;
constexpr int BARRIER_THREADS = THREADS - 32;  // the last warp streams
constexpr int MAX_SLOTS = 8;
constexpr int ROUNDS = 10000;

__constant__ int SLOT, SLOTS, EVERY;

__device__ __forceinline__ unsigned ld_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ unsigned ld_relaxed(const unsigned* p) {
  unsigned v;
  asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void st_release(unsigned* p, unsigned v) {
  asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ void block_sync() { asm volatile("bar.sync 1, %0;" ::"n"(BARRIER_THREADS) : "memory"); }

enum Design { COUNTER, COUNTER_RELAXED_SPIN, COUNTER_THEN_FLAG, GATHER_BY_BLOCK0, FLAGS, FLAGS_SPREAD, DESIGNS };
const char* const NAMES[DESIGNS] = {
    "counter: release add, acquire spin (the kernels')", "counter: release add, relaxed spin, fence",
    "counter, the last arrival releases a flag", "flags, block 0 gathers them and releases",
    "flags, every block polls all (4 B apart)", "flags, every block polls all (32 B apart)"};

// Barrier number `gen` (from 1) of gridDim.x blocks: `count` a zeroed word, `flags` zeroed words.
template <Design D>
__device__ __forceinline__ void barrier(unsigned* count, unsigned* flags, unsigned gen) {
  block_sync();
  const unsigned blocks = gridDim.x, t = threadIdx.x;
  if (D == COUNTER || D == COUNTER_RELAXED_SPIN) {
    if (t == 0) {
      asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(count) : "memory");
      if (D == COUNTER) {
        while (ld_acquire(count) < gen * blocks) {
        }
      } else {
        while (ld_relaxed(count) < gen * blocks) {
        }
        asm volatile("fence.acq_rel.gpu;" ::: "memory");
      }
    }
  } else if (D == COUNTER_THEN_FLAG) {
    if (t == 0) {
      unsigned old;
      asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;" : "=r"(old) : "l"(count) : "memory");
      if (old == gen * blocks - 1) {
        st_release(flags, gen);
      } else {
        while (ld_acquire(flags) < gen) {
        }
      }
    }
  } else if (D == GATHER_BY_BLOCK0) {
    if (t == 0) st_release(flags + blockIdx.x, gen);
    if (blockIdx.x == 0) {
      if (t < blocks)
        while (ld_acquire(flags + t) < gen) {
        }
      block_sync();
      if (t == 0) st_release(flags + blocks, gen);
    } else if (t == 0) {
      while (ld_acquire(flags + blocks) < gen) {
      }
    }
  } else {
    const unsigned spread = D == FLAGS ? 1 : 8;
    if (t == 0) st_release(flags + spread * blockIdx.x, gen);
    if (t < blocks)
      while (ld_acquire(flags + spread * t) < gen) {
      }
  }
  block_sync();
}

__device__ __forceinline__ unsigned smem(const void* p) { return static_cast<unsigned>(__cvta_generic_to_shared(p)); }

__device__ __forceinline__ void copy_slot(char* ring, int s, const char* src, unsigned long long* bars) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem(bars + s)), "r"(SLOT) : "memory");
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
               ::"r"(smem(ring + s * SLOT)), "l"(src), "r"(SLOT), "r"(smem(bars + s)) : "memory");
}

__device__ __forceinline__ void wait_slot(unsigned long long* bars, int s, unsigned parity) {
  asm volatile("{\n .reg .pred done;\n WAIT_%=:\n mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
               " @!done bra WAIT_%=;\n}" ::"r"(smem(bars + s)), "r"(parity) : "memory");
}

// One thread: SLOTS copies in flight, each reissued as it lands, until *stop; then the rest drained. Adds
// the bytes landed to *landed.
__device__ void stream(const char* big, size_t bytes, char* ring, unsigned long long* bars, volatile int* stop,
                       unsigned long long* landed) {
  const size_t step = static_cast<size_t>(gridDim.x) * SLOT;
  size_t off = static_cast<size_t>(blockIdx.x) * SLOT;
  unsigned parity[MAX_SLOTS] = {};
  unsigned long long done = 0;
  for (int s = 0; s < SLOTS; ++s, off = (off + step) % (bytes - SLOT)) copy_slot(ring, s, big + off, bars);
  int s = 0;
  for (;; s = (s + 1) % SLOTS, off = (off + step) % (bytes - SLOT)) {
    wait_slot(bars, s, parity[s]);
    parity[s] ^= 1;
    done += SLOT;
    if (*stop) break;
    copy_slot(ring, s, big + off, bars);
  }
  for (int k = 0; k < SLOTS; ++k)
    if (k != s) wait_slot(bars, k, parity[k]);
  atomicAdd(landed, done);
}

template <Design D>
__global__ void __launch_bounds__(THREADS, 1)
    barriers(unsigned* count, unsigned* flags, unsigned* words, unsigned* stale, const char* big, size_t bytes,
             unsigned long long* landed) {
  extern __shared__ __align__(128) char ring[];
  __shared__ unsigned long long bars[MAX_SLOTS];
  __shared__ int stop;
  if (threadIdx.x == 0) {
    for (int s = 0; s < MAX_SLOTS; ++s) asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem(bars + s)));
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    stop = 0;
  }
  __syncthreads();
  if (threadIdx.x >= BARRIER_THREADS) {
    if (big && threadIdx.x == BARRIER_THREADS && blockIdx.x % EVERY == 0) stream(big, bytes, ring, bars, &stop, landed);
    return;
  }
  unsigned bad = 0;
  for (unsigned gen = 1; gen <= ROUNDS; ++gen) {
    if (threadIdx.x == 0) words[32 * blockIdx.x] = gen;
    barrier<D>(count, flags, gen);
    if (threadIdx.x == 0 && __ldcg(words + 32 * ((blockIdx.x + 1) % gridDim.x)) < gen) ++bad;
  }
  if (threadIdx.x == 0) {
    stop = 1;
    if (bad) atomicAdd(stale, bad);
  }
}

struct Scratch {
  unsigned* words;  // count, flags, per-block words, stale count, landed bytes
  char* big;
  size_t big_bytes;
};

template <Design D>
void measure(const Scratch& m, bool streaming, int slot, int slots, int every) {
  cudaMemcpyToSymbol(SLOT, &slot, sizeof slot);
  cudaMemcpyToSymbol(SLOTS, &slots, sizeof slots);
  cudaMemcpyToSymbol(EVERY, &every, sizeof every);
  int blocks;
  cudaDeviceGetAttribute(&blocks, cudaDevAttrMultiProcessorCount, 0);
  const int shared = MAX_SLOTS * 24 * 1024;
  cudaFuncSetAttribute(barriers<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, shared);
  unsigned* count = m.words;
  unsigned* flags = m.words + 32;
  unsigned* words = m.words + 8192;
  unsigned* stale = m.words + 8192 + 32 * 1024;
  auto* landed = reinterpret_cast<unsigned long long*>(stale + 32);
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  float best_ms = 1e30f;
  unsigned long long best_bytes = 0, stale_total = 0;
  for (int rep = 0; rep < 4; ++rep) {
    cudaMemset(m.words, 0, 1 << 20);
    cudaEventRecord(a);
    barriers<D><<<blocks, THREADS, shared>>>(count, flags, words, stale, streaming ? m.big : nullptr, m.big_bytes,
                                             landed);
    cudaEventRecord(b);
    cudaEventSynchronize(b);
    float ms;
    cudaEventElapsedTime(&ms, a, b);
    unsigned bad;
    unsigned long long bytes;
    cudaMemcpy(&bad, stale, sizeof bad, cudaMemcpyDeviceToHost);
    cudaMemcpy(&bytes, landed, sizeof bytes, cudaMemcpyDeviceToHost);
    stale_total += bad;
    if (ms < best_ms) best_ms = ms, best_bytes = bytes;
  }
  const cudaError_t err = cudaGetLastError();
  char load[64] = "idle";
  if (streaming)
    snprintf(load, sizeof load, "%d x %d KB in flight, every %d block(s)", slots, slot / 1024, every);
  printf("%-50s %-38s %7.2f us a barrier  stream %.2f TB/s  stale reads %llu%s%s\n", NAMES[D], load,
         best_ms * 1e3f / ROUNDS, best_bytes / (best_ms * 1e-3) / 1e12, stale_total, err ? "  " : "",
         err ? cudaGetErrorString(err) : "");
}

}  // namespace

int main() {
  cudaDeviceProp prop;
  cudaGetDeviceProperties(&prop, 0);
  printf("# %s, %d multiprocessors, one block each, %d barriers a launch, best of 4\n", prop.name,
         prop.multiProcessorCount, ROUNDS);
  Scratch m{};
  m.big_bytes = static_cast<size_t>(4) << 30;
  cudaMalloc(&m.words, 1 << 20);
  cudaMalloc(&m.big, m.big_bytes);
  cudaMemset(m.big, 1, m.big_bytes);
  measure<COUNTER>(m, false, 0, 1, 1);
  measure<COUNTER_RELAXED_SPIN>(m, false, 0, 1, 1);
  measure<COUNTER_THEN_FLAG>(m, false, 0, 1, 1);
  measure<GATHER_BY_BLOCK0>(m, false, 0, 1, 1);
  measure<FLAGS>(m, false, 0, 1, 1);
  measure<FLAGS_SPREAD>(m, false, 0, 1, 1);
  for (int slot : {8 * 1024, 16 * 1024, 24 * 1024, 48 * 1024})
    for (int slots : {1, 2, 4, 8})
      if (slot * slots <= MAX_SLOTS * 24 * 1024) measure<COUNTER>(m, true, slot, slots, 1);
  measure<COUNTER>(m, true, 48 * 1024, 4, 2);  // the same bytes in flight as 2 x 48 KB everywhere, half the SMs
  measure<COUNTER>(m, true, 48 * 1024, 2, 2);
  measure<COUNTER>(m, true, 48 * 1024, 4, 4);
  measure<FLAGS_SPREAD>(m, true, 48 * 1024, 4, 1);
  measure<COUNTER_THEN_FLAG>(m, true, 48 * 1024, 4, 1);
  return 0;
}
