// The talker's decoder layers at one new position of one row, in one launch (see talker_kernel.py).
//
// One block per multiprocessor runs every phase of every layer, phases separated by grid-wide barriers: the
// q/k/v projection (input norm fused); the attention, each key/value head's positions split over a group of
// blocks, the last of the group to finish combining their softmax states; the output projection with the
// residual; the gate/up projection with SwiGLU; the down projection with the residual. Five barriers a layer.
//
// Each block owns a contiguous range of every projection's rows. Its weights stream through a ring of
// shared-memory slots, a chunk of rows a slot, copied by the bulk-copy engine: one more warp does nothing but
// refill each slot as soon as every computing warp has signalled that it is done with it, so the stream runs
// ahead across the phases' input loads, the attention and the barriers, by up to the ring's size, and the
// computing warps never wait for each other between chunks (only the warps that split a row do).
//
// Rounding follows decode_kernels.py (float32 inside, bfloat16 at each boundary), so results match the
// per-layer kernels up to summation order.

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <vector>

#include "persistent.cuh"

namespace {

using namespace persistent;

// The hidden and MLP sizes are set by the build (talker.py: the released 1.7B talker's, 2048 and 6144, or the
// 0.6B's, 1024 and 3072); the rest is common to both.
#ifndef TALKER_HIDDEN
#define TALKER_HIDDEN 2048
#endif
#ifndef TALKER_INTER
#define TALKER_INTER 6144
#endif
constexpr int H = TALKER_HIDDEN;  // talker hidden size
constexpr int NH = 16;       // query heads
constexpr int NKV = 8;       // key/value heads
constexpr int REP = NH / NKV;
constexpr int INTER = TALKER_INTER;  // MLP width
constexpr int LAYERS = 28;
constexpr int QKV_ROWS = (NH + 2 * NKV) * HD;
constexpr int THREADS = 512;          // the computing threads; one more warp refills the ring
constexpr int WARPS = THREADS / 32;
constexpr int SLOTS = 3;                // the ring of weight chunks
constexpr int SLOT_ELEMS = 32 * 1024;  // 64 KB a slot
constexpr int MAX_SPAN = 256;          // positions one block of the attention takes at most

struct Layer {
  const T *ln, *qkv, *qn, *kn, *o, *ln2, *gu, *down;
};

struct Params {
  Layer layer[LAYERS];
  T *kc, *vc;                                                // caches [layers, slots, NKV, positions, HD]
  long long cache_layer, cache_slot, cache_head, cache_pos;  // their strides in elements
  const long long* pos;                                      // the row's new position
  const long long* slot;                                     // and its cache slot
  int max_pos;                                               // positions the cache holds
  const float* inv_freq;                                     // [HD / 2]
  const T* in;                                               // [H] layer 0's input
  T* x;                                                      // [H] the residual stream: the output
  T* qkv;                                                    // scratch [QKV_ROWS]
  T* attn;                                                   // scratch [NH HD]
  T* act;                                                    // scratch [INTER]
  float* part;                                               // scratch [NKV, blocks a head, REP, HD + 2]
  unsigned* counters;  // [1 + NKV], zeroed before the launch: the barrier's arrivals, each head's finished blocks
  float eps, scale;
};

enum Step { QKV, O, GU, DOWN, STEPS };

// A weight phase: `rows` output rows of length k (gate/up: `segs` 2, row pairs, the up rows INTER rows after the
// gate rows), a chunk of `cr` rows (pairs) in a slot, each row computed by `ks` warps over k / ks each.
struct WPhase {
  const T* w;
  int rows, k, segs, cr, ks;
};

// A phase of `rows` rows (pairs: segs 2) of length k: as many rows a slot as fit, a power of two up to the warps,
// so that every warp computes (ks warps a row).
__device__ __forceinline__ WPhase phase(const T* w, int rows, int k, int segs) {
  int cr = 1;
  while (2 * cr * segs * k <= SLOT_ELEMS && 2 * cr <= WARPS) cr *= 2;
  return {w, rows, k, segs, cr, WARPS / cr};
}

__device__ WPhase weights_of(const Params& p, int layer, int step) {
  const Layer& L = p.layer[layer];
  switch (step) {
    case QKV: return phase(L.qkv, QKV_ROWS, H, 1);
    case O: return phase(L.o, H, NH * HD, 1);
    case GU: return phase(L.gu, INTER, H, 2);
    default: return phase(L.down, H, INTER, 1);
  }
}
static_assert(SLOT_ELEMS / INTER >= 1, "a slot holds a row");

// This block's rows of a phase: [lo, hi).
__device__ __forceinline__ void rows_of(const WPhase& ph, int& lo, int& hi) {
  lo = ph.rows * static_cast<int>(blockIdx.x) / static_cast<int>(gridDim.x);
  hi = ph.rows * static_cast<int>(blockIdx.x + 1) / static_cast<int>(gridDim.x);
}

// Chunks a phase takes in every block (the largest range's; a smaller range's last chunk may be empty).
__device__ __forceinline__ int chunks_of(const WPhase& ph) {
  const int most = (ph.rows + gridDim.x - 1) / gridDim.x;
  return (most + ph.cr - 1) / ph.cr;
}

// Chunk `ci` of this block's weight stream: its phase and rows [a, a + n); false past the last layer.
__device__ bool chunk_at(const Params& p, int ci, WPhase& ph, int& a, int& n) {
  int count[STEPS], per = 0;
  for (int s = 0; s < STEPS; ++s) per += count[s] = chunks_of(weights_of(p, 0, s));
  const int layer = ci / per;
  if (layer >= LAYERS) return false;
  int r = ci % per, step = 0;
  while (r >= count[step]) r -= count[step++];
  ph = weights_of(p, layer, step);
  int lo, hi;
  rows_of(ph, lo, hi);
  a = lo + r * ph.cr;
  n = max(0, min(ph.cr, hi - a));
  return true;
}

// Start copying chunk `ci` into its slot of the ring, completing on full[slot]; false past the last chunk.
__device__ bool issue(const Params& p, int ci, T* ring, uint64_t* full) {
  WPhase ph;
  int a, n;
  if (!chunk_at(p, ci, ph, a, n)) return false;
  const int s = ci % SLOTS;
  const unsigned bytes = n * ph.k * sizeof(T);  // a segment's rows: contiguous
  expect_copies(full + s, ph.segs * bytes);
  for (int seg = 0; seg < ph.segs && n; ++seg)
    bulk_copy(ring + s * SLOT_ELEMS + seg * n * ph.k, ph.w + (static_cast<long long>(seg) * INTER + a) * ph.k,
              bytes, full + s);
  return true;
}

// The refilling warp's one thread: every chunk of the launch in order, each into its slot once the WARPS
// computing warps have arrived on empty[slot] for the chunk before it there.
__device__ void refill(const Params& p, T* ring, uint64_t* full, uint64_t* empty) {
  for (int ci = 0;; ++ci) {
    if (ci >= SLOTS) wait_copies(empty + ci % SLOTS, (ci / SLOTS - 1) & 1);
    if (!issue(p, ci, ring, full)) return;
  }
}

// Shared memory of the attention.
struct AttnSmem {
  float *q, *k, *v, *nw, *cs, *sn, *score, *stat;
  int* last;
};

// The attention of layer `layer` at position `pos`: key/value head g's positions [0, pos] split over the group
// of blocks g * per ... (g + 1) * per - 1, each block's softmax state (output sums, max, sum) of its REP query
// heads to p.part; the last of the group to finish combines them in block order into p.attn (rounded). The block
// holding `pos` takes the new key and value from p.qkv (normed, rotated) and stores them into the cache.
__device__ void attention(const Params& p, int layer, long long pos, long long slot, const AttnSmem& m) {
  const int per = gridDim.x / NKV;
  if (static_cast<int>(blockIdx.x) >= NKV * per) return;
  const int g = blockIdx.x / per, s = blockIdx.x % per;
  const int len = static_cast<int>((pos + per) / per);  // positions a block: ceil((pos + 1) / per)
  const int lo = s * len, hi = min(lo + len, static_cast<int>(pos) + 1), used = static_cast<int>((pos + len) / len);
  if (lo >= hi) return;
  const int t = threadIdx.x, warp = t >> 5, lane = t & 31;
  const Layer& L = p.layer[layer];
  constexpr int QC = REP * HD / 8, KC = HD / 8;  // 16-byte chunks of the queries, of a key
  if (t < QC) load8(m.q + 8 * t, p.qkv + g * REP * HD + 8 * t);
  else if (t < QC + KC) load8(m.k + 8 * (t - QC), p.qkv + (NH + g) * HD + 8 * (t - QC));
  else if (t < QC + 2 * KC) load8(m.v + 8 * (t - QC - KC), p.qkv + (NH + NKV + g) * HD + 8 * (t - QC - KC));
  else if (t < QC + 4 * KC) {
    const int c = t - QC - 2 * KC;
    load8(m.nw + 8 * c, (c < KC ? L.qn : L.kn) + 8 * (c % KC));
  }
  sync_threads<THREADS>();
  if (warp < REP) norm_rope(m.q + warp * HD, m.nw, m.cs, m.sn, p.eps, p.scale);
  else if (warp == REP) norm_rope(m.k, m.nw + HD, m.cs, m.sn, p.eps, 1.f);
  sync_threads<THREADS>();

  const long long base = layer * p.cache_layer + slot * p.cache_slot + g * p.cache_head;
  T* kc = p.kc + base;
  T* vc = p.vc + base;
  for (int i = lo + warp; i < hi; i += WARPS) {  // scores: a warp a position, lane 4 of its HD values
    float kv[4];
    if (i == pos) {
#pragma unroll
      for (int r = 0; r < 4; ++r) kv[r] = m.k[4 * lane + r];
    } else {
      const uint2 raw = *reinterpret_cast<const uint2*>(kc + i * p.cache_pos + 4 * lane);
      const __nv_bfloat162* h2 = reinterpret_cast<const __nv_bfloat162*>(&raw);
      const float2 a = __bfloat1622float2(h2[0]), b = __bfloat1622float2(h2[1]);
      kv[0] = a.x, kv[1] = a.y, kv[2] = b.x, kv[3] = b.y;
    }
#pragma unroll
    for (int h = 0; h < REP; ++h) {
      const float* q = m.q + h * HD + 4 * lane;
      const float sc = warp_sum(q[0] * kv[0] + q[1] * kv[1] + q[2] * kv[2] + q[3] * kv[3]);
      if (lane == 0) m.score[h * MAX_SPAN + i - lo] = sc;
    }
  }
  sync_threads<THREADS>();
  if (warp < REP) {  // softmax over the block's positions: weights in place, max and sum to stat
    float* sc = m.score + warp * MAX_SPAN;
    float best = -INFINITY;
    for (int i = lane; i < hi - lo; i += 32) best = fmaxf(best, sc[i]);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) best = fmaxf(best, __shfl_xor_sync(0xffffffffu, best, o));
    float sum = 0.f;
    for (int i = lane; i < hi - lo; i += 32) {
      const float e = expf(sc[i] - best);
      sc[i] = e;
      sum += e;
    }
    sum = warp_sum(sum);
    if (lane == 0) m.stat[2 * warp] = best, m.stat[2 * warp + 1] = sum;
  }
  sync_threads<THREADS>();
  if (t < REP * HD) {  // output sums: a thread a (head, dim)
    const int h = t / HD, d = t % HD;
    float acc = 0.f;
    for (int i = lo; i < hi; ++i)
      acc += m.score[h * MAX_SPAN + i - lo] * (i == pos ? m.v[d] : __bfloat162float(vc[i * p.cache_pos + d]));
    float* out = p.part + ((g * per + s) * REP + h) * (HD + 2);
    out[d] = acc;
    if (d == 0) out[HD] = m.stat[2 * h], out[HD + 1] = m.stat[2 * h + 1];
  } else if (lo <= pos && pos < hi && t < REP * HD + 2 * HD) {  // the new key and value into the cache
    const int d = (t - REP * HD) % HD;
    if (t < REP * HD + HD) kc[pos * p.cache_pos + d] = __float2bfloat16(m.k[d]);
    else vc[pos * p.cache_pos + d] = __float2bfloat16(m.v[d]);
  }
  sync_threads<THREADS>();
  if (t == 0) {  // the group's finished blocks counted; the last resets the count for the next layer
    __threadfence();
    const bool last = atomicAdd(p.counters + 1 + g, 1u) == static_cast<unsigned>(used - 1);
    if (last) atomicExch(p.counters + 1 + g, 0u), __threadfence();
    *m.last = last;
  }
  sync_threads<THREADS>();
  if (*m.last && t < REP * HD) {
    const int h = t / HD, d = t % HD;
    float best = -INFINITY, total = 0.f, acc = 0.f;
    for (int b = 0; b < used; ++b) {
      const float* blk = p.part + ((g * per + b) * REP + h) * (HD + 2);
      const float mx = __ldcg(blk + HD), nb = fmaxf(best, mx);
      const float alpha = expf(best - nb), beta = expf(mx - nb);
      total = total * alpha + __ldcg(blk + HD + 1) * beta;
      acc = acc * alpha + __ldcg(blk + d) * beta;
      best = nb;
    }
    p.attn[(g * REP + h) * HD + d] = __float2bfloat16(acc / total);
  }
}

__global__ void __launch_bounds__(THREADS + 32, 1) talker_layers(const __grid_constant__ Params p) {
  extern __shared__ __align__(16) unsigned char smem[];
  T* ring = reinterpret_cast<T*>(smem);                         // [SLOTS][SLOT_ELEMS]
  T* xb = ring + SLOTS * SLOT_ELEMS;                            // [INTER] a phase's input
  float* xr = reinterpret_cast<float*>(xb + INTER);             // [H] the residual stream
  AttnSmem am;
  am.q = xr + H;                                                // [REP HD]
  am.k = am.q + REP * HD;                                       // [HD]
  am.v = am.k + HD;                                             // [HD]
  am.nw = am.v + HD;                                            // [2 HD]
  am.cs = am.nw + 2 * HD;                                       // [HD / 2]
  am.sn = am.cs + HD / 2;                                       // [HD / 2]
  am.score = am.sn + HD / 2;                                    // [REP][MAX_SPAN]
  am.stat = am.score + REP * MAX_SPAN;                          // [2 REP]
  float2* partial = reinterpret_cast<float2*>(am.stat + 2 * REP);  // [2][WARPS] split rows' sums
  float* red = reinterpret_cast<float*>(partial + 2 * WARPS);   // [WARPS]
  am.last = reinterpret_cast<int*>(red + WARPS);                // [2]
  uint64_t* full = reinterpret_cast<uint64_t*>(am.last + 2);    // [SLOTS] a slot's copies landed
  uint64_t* empty = full + SLOTS;                                // [SLOTS] every computing warp done with it
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  init_barriers(full, SLOTS);
  init_barriers(empty, SLOTS, WARPS);
  if (warp == WARPS) {
    if (lane == 0) refill(p, ring, full, empty);
    return;
  }
  const long long pos = min(*p.pos, static_cast<long long>(p.max_pos - 1)), slot = *p.slot;
  rope_table(am.cs, am.sn, p.inv_freq, pos);
  unsigned target = 0;
  int ci = 0;  // the weight chunk being computed

  // Weight phase `step` of `layer`, its input in xb: chunk after chunk from the ring, each warp signalling when
  // it is done with a slot; `emit(row, acc, acc_up)` (one lane) gets each output row's sums. A row split over
  // ks warps is summed by its first warp once the group has met at named barrier 2 + row.
  auto gemv = [&](int layer, int step, auto&& emit) {
    const WPhase ph = weights_of(p, layer, step);
    int lo, hi;
    rows_of(ph, lo, hi);
    const int row = warp / ph.ks, part = warp % ph.ks, kk = ph.k / ph.ks;
    for (int j = 0, chunks = chunks_of(ph); j < chunks; ++j, ++ci) {
      const int s = ci % SLOTS, a = lo + j * ph.cr, n = max(0, min(ph.cr, hi - a));
      wait_copies(full + s, (ci / SLOTS) & 1);
      float acc[2] = {0.f, 0.f};
      if (row < n) {
        const T* w = ring + s * SLOT_ELEMS + row * ph.k + part * kk;
        if (ph.segs == 2) {
          const T* ws[2] = {w, w + n * ph.k};
          dot_rows(ws, xb + part * kk, kk, lane, acc);
        } else {
          const T* ws[1] = {w};
          float one[1];
          dot_rows(ws, xb + part * kk, kk, lane, one);
          acc[0] = one[0];
        }
      }
      __syncwarp();
      if (lane == 0) arrive(empty + s);
      if (row >= n) continue;
      // two sets of sums: a group writes a chunk's only after its first warp has read the set two chunks back
      float2* sums = partial + (ci & 1) * WARPS;
      if (ph.ks > 1) {
        if (lane == 0) sums[warp] = make_float2(acc[0], acc[1]);
        asm volatile("bar.sync %0, %1;" ::"r"(2 + row), "r"(32 * ph.ks) : "memory");
      }
      if (part == 0 && lane == 0) {
        for (int i = 1; i < ph.ks; ++i) acc[0] += sums[warp + i].x, acc[1] += sums[warp + i].y;
        emit(a + row, acc[0], acc[1]);
      }
    }
  };
  auto residual = [&](int c, float acc, float) { p.x[c] = __float2bfloat16(rnd(acc) + xr[c]); };

  const T* in = p.in;  // the layer's input: layer 0's until its output projection has written the stream
  for (int l = 0; l < LAYERS; ++l) {
    const Layer& L = p.layer[l];
    load_norm<H, THREADS>(xb, red, in, L.ln, p.eps);
    gemv(l, QKV, [&](int c, float acc, float) { p.qkv[c] = __float2bfloat16(acc); });
    grid_sync<THREADS>(p.counters, target);

    attention(p, l, pos, slot, am);
    grid_sync<THREADS>(p.counters, target);

    load_vec<H, THREADS>(xb, p.attn, NH * HD, xr, in);
    gemv(l, O, residual);
    grid_sync<THREADS>(p.counters, target);
    in = p.x;

    load_norm<H, THREADS>(xb, red, p.x, L.ln2, p.eps);
    gemv(l, GU, [&](int c, float acc, float acc2) {
      const float g = rnd(acc);
      p.act[c] = __float2bfloat16(rnd(g / (1.f + expf(-g))) * rnd(acc2));
    });
    grid_sync<THREADS>(p.counters, target);

    load_vec<H, THREADS>(xb, p.act, INTER, xr, p.x);
    gemv(l, DOWN, residual);
    grid_sync<THREADS>(p.counters, target);
  }
}

constexpr int SHARED_BYTES = (SLOTS * SLOT_ELEMS + INTER) * sizeof(T) +
                             (H + REP * HD + 4 * HD + HD + REP * MAX_SPAN + 2 * REP + 4 * WARPS + WARPS + 2) *
                                 sizeof(float) +
                             2 * SLOTS * sizeof(uint64_t);

// ptrs: layer weights (LAYERS x 8: ln, qkv, qn, kn, o, ln2, gu, down), k cache, v cache, pos, slot, inv_freq, in,
// x, qkv, attn, act, part, counters. ints: cache strides (layer, slot, head, pos), positions the cache holds,
// grid. floats: eps, scale.
void launch(const std::vector<int64_t>& ptrs, const std::vector<int64_t>& ints, const std::vector<double>& floats,
            int64_t stream) {
  if (ptrs.size() != LAYERS * 8 + 12 || ints.size() != 6 || floats.size() != 2)
    throw std::runtime_error("talker_layers: arguments");
  Params p{};
  size_t i = 0;
  auto next = [&]() { return reinterpret_cast<void*>(ptrs[i++]); };
  for (Layer& L : p.layer) {
    L.ln = static_cast<const T*>(next()), L.qkv = static_cast<const T*>(next());
    L.qn = static_cast<const T*>(next()), L.kn = static_cast<const T*>(next());
    L.o = static_cast<const T*>(next()), L.ln2 = static_cast<const T*>(next());
    L.gu = static_cast<const T*>(next()), L.down = static_cast<const T*>(next());
  }
  p.kc = static_cast<T*>(next()), p.vc = static_cast<T*>(next());
  p.pos = static_cast<const long long*>(next()), p.slot = static_cast<const long long*>(next());
  p.inv_freq = static_cast<const float*>(next());
  p.in = static_cast<const T*>(next()), p.x = static_cast<T*>(next());
  p.qkv = static_cast<T*>(next()), p.attn = static_cast<T*>(next()), p.act = static_cast<T*>(next());
  p.part = static_cast<float*>(next()), p.counters = static_cast<unsigned*>(next());
  p.cache_layer = ints[0], p.cache_slot = ints[1], p.cache_head = ints[2], p.cache_pos = ints[3];
  p.max_pos = static_cast<int>(ints[4]);
  const int grid = static_cast<int>(ints[5]);
  if (grid < NKV || p.max_pos > grid / NKV * MAX_SPAN) throw std::runtime_error("talker_layers: grid or cache");
  p.eps = static_cast<float>(floats[0]), p.scale = static_cast<float>(floats[1]);
  auto s = reinterpret_cast<cudaStream_t>(stream);
  check(cudaMemsetAsync(p.counters, 0, (1 + NKV) * sizeof(unsigned), s), "counter reset");
  talker_layers<<<grid, THREADS + 32, SHARED_BYTES, s>>>(p);
  check(cudaGetLastError(), "talker_layers launch");
}

// Allow the kernel its shared memory (outside any graph capture); returns the bytes, or raises.
int prepare() {
  check(cudaFuncSetAttribute(talker_layers, cudaFuncAttributeMaxDynamicSharedMemorySize, SHARED_BYTES),
        "smem limit");
  return SHARED_BYTES;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("launch", &launch, "The talker's layers at one position of one row, in one launch");
  m.def("prepare", &prepare, "Raise the kernel's shared-memory limit; the bytes per block");
  m.def("max_span", []() { return MAX_SPAN; }, "Positions one attention block takes at most");
}
