// The code predictor's single-position passes for one row, in one launch (see predictor_kernel.py).
//
// One block per multiprocessor runs every phase of passes [first, last], phases separated by grid-wide
// barriers: per layer the q/k/v projection (input norm fused); the attention (q/k norms, RoPE, every head in
// every block, so no barrier before what needs it) with the output projection and the residual; the
// gate/up projection with SwiGLU; the down projection with the residual. Per pass the codebook head (final
// norm fused) with each block's argmax, after which every block takes the greedy code and reads the next
// pass's input from a table of the embeddings already projected. That is 21 barriers a pass. A block's
// share of each projection's weights is copied into shared memory by the bulk-copy engine one weight phase
// ahead, issued once the current phase's input is loaded, so the copy runs during the current phase's dot
// products and its barrier (the per-layer launches this replaces each start their weight stream only once the
// previous one has finished); the attention's cached keys and values are copied during the q/k/v phase.
//
// Rounding follows decode_kernels.py (float32 inside, the weights' dtype at each boundary), so results
// match the per-layer kernels up to summation order.

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <vector>

#include "persistent.cuh"

namespace {

using namespace persistent;

constexpr int H = 1024;      // predictor hidden size
constexpr int NH = 16;       // query heads
constexpr int NKV = 8;       // key/value heads
constexpr int INTER = 3072;  // MLP width
constexpr int LAYERS = 5;
constexpr int VOCAB = 2048;  // codes per codebook
constexpr int MAX_GROUPS = 16;  // code groups (the attention's positions: shared memory)
constexpr int THREADS = 512;
constexpr int WARPS = THREADS / 32;
constexpr int CB = 8;      // weight rows per block of a projection (one warp computes one row at a time)
constexpr int XS = INTER;  // elements of a phase's input vector in shared memory

struct Layer {
  const T *ln, *qkv, *qn, *kn, *o, *ln2, *gu, *down;
};

struct Params {
  Layer layer[LAYERS];
  const T* norm;                 // final norm [H]
  const T* head[MAX_GROUPS];     // head[j]: codebook j+1's scores [VOCAB, H]
  const T* table[MAX_GROUPS];    // table[j]: codebook j+1's embeddings [VOCAB, HT]
  const T* next_in[MAX_GROUPS];  // next_in[j]: those embeddings projected, pass j+1's input [VOCAB, H]
  T* pk;                         // scratch caches [LAYERS, slots, NKV, positions, HD]; slot 0 is this row's
  T* pv;
  long long cache_layer, cache_head, cache_pos;  // strides in elements
  const float* inv_freq;         // [HD / 2]
  T* x;                          // [H] residual stream: holds pass `first`'s input
  T* qkv;                        // scratch [(NH + 2 NKV) HD]
  T* act;                        // scratch [INTER]
  float* part_val;               // [grid] each block's best score
  int* part_idx;                 // [grid] and its code
  long long* frames;             // this row's codes [groups]
  T* total;                      // this row's codebook-embedding sum [HT]
  unsigned* counter;             // barrier arrivals (zeroed before the launch)
  int first, last;               // passes: pass j chooses codebook j+1 at position j+1
  int ht;                        // talker hidden size (the tables' width)
  int buf_elems;                 // elements per shared-memory weight buffer
  float eps, norm_eps, scale;
};

// A weight phase: this block's blocks of CB rows of `w` (row length k), blocks blockIdx.x + i * gridDim.x
// of `blocks`; `segs` 2 for gate/up (each block's gate rows, then its up rows at + INTER rows).
struct WPhase {
  const T* w;
  int k, blocks, segs;
};

enum Step { QKV, O, GU, DOWN, HEAD };

__device__ WPhase weights_of(const Params& p, int pass, int step, int layer) {
  switch (step) {
    case QKV: return {p.layer[layer].qkv, H, (NH + 2 * NKV) * HD / CB, 1};
    case O: return {p.layer[layer].o, NH * HD, H / CB, 1};
    case GU: return {p.layer[layer].gu, H, INTER / CB, 2};
    case DOWN: return {p.layer[layer].down, INTER, H / CB, 1};
    default: return {p.head[pass], H, VOCAB / CB, 1};
  }
}

// The weight phases in order: per pass, per layer QKV, O, GU, DOWN, then HEAD. Index -> (pass, step, layer);
// false past the end.
__device__ bool phase_at(const Params& p, int idx, int& pass, int& step, int& layer) {
  constexpr int per = 4 * LAYERS + 1;
  pass = p.first + idx / per;
  const int r = idx % per;
  layer = r < 4 * LAYERS ? r / 4 : 0;
  step = r < 4 * LAYERS ? r % 4 : HEAD;
  return pass <= p.last;
}

// Start copying weight phase `idx`'s rows for this block into `buf` with the bulk-copy engine, completing on
// `bar` (nothing past the last phase). One thread issues them: thread 32, as thread 0 signals the grid barrier.
__device__ void issue(const Params& p, int idx, T* buf, uint64_t* bar) {
  int pass, step, layer;
  if (threadIdx.x != 32 || !phase_at(p, idx, pass, step, layer)) return;
  const WPhase ph = weights_of(p, pass, step, layer);
  const unsigned seg_bytes = CB * ph.k * sizeof(T);  // a block's rows of one segment: contiguous
  const int mine = (ph.blocks - static_cast<int>(blockIdx.x) + static_cast<int>(gridDim.x) - 1) / gridDim.x;
  expect_copies(bar, mine * ph.segs * seg_bytes);
  for (int n = 0; n < mine; ++n) {
    const long long b = blockIdx.x + static_cast<long long>(n) * gridDim.x;
    for (int s = 0; s < ph.segs; ++s) {
      const T* src = ph.w + (s * INTER + b * CB) * ph.k;
      bulk_copy(buf + (n * ph.segs + s) * CB * ph.k, src, seg_bytes, bar);
    }
  }
}

// Shared memory of the attention: the keys and values of every key/value head at positions [0, NPOS),
// kvs[((g * NPOS + i) * 2 + (0 key | 1 value)) * HD + d], bfloat16; the tail of the output projection's
// weight buffer (its share of the rows leaves that much free).
constexpr int NPOS = MAX_GROUPS;
constexpr int KVS_ELEMS = NKV * NPOS * 2 * HD;

// Start copying layer `layer`'s cached keys and values, positions [0, pos), into kvs (cp.async, 16 bytes a
// thread; the generic proxy, so the other blocks' stores to the cache are ordered by the grid barriers).
__device__ void prefetch_cache(const Params& p, int layer, int pos, T* kvs) {
  constexpr int per = HD / 8;  // 16-byte chunks per key or value
  const int n = NKV * pos * 2 * per;
  for (int c = threadIdx.x; c < n; c += THREADS) {
    const int g = c / (pos * 2 * per), r = c % (pos * 2 * per);
    const int i = r / (2 * per), kv = (r / per) & 1, chunk = r % per;
    const T* src = (kv ? p.pv : p.pk) + layer * p.cache_layer + g * p.cache_head + i * p.cache_pos + chunk * 8;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_addr(kvs + ((g * NPOS + i) * 2 + kv) * HD
                                                                                  + chunk * 8)),
                 "l"(src) : "memory");
  }
  asm volatile("cp.async.commit_group;" ::: "memory");
}

// One step of a transposed warp sum: each lane keeps half of its first 2 HALF partial sums, the upper half if its
// lane bit 2 HALF is set, and adds the partner lane's partial sums of that half.
template <int HALF>
__device__ __forceinline__ void halve(float (&part)[NPOS], int lane) {
  const bool upper = lane & (2 * HALF);
#pragma unroll
  for (int j = 0; j < HALF; ++j) {
    const float keep = upper ? part[j + HALF] : part[j], send = upper ? part[j] : part[j + HALF];
    part[j] = keep + __shfl_xor_sync(0xffffffffu, send, 2 * HALF);
  }
}

// Every query head's attention output at position `pos` into xb[0, NH HD) (rounded as the per-layer kernels
// store it), and the residual stream `x` into xr; xs holds the queries. Each block computes all heads, so no
// barrier separates the attention from the output projection. kvs holds positions [0, pos) (prefetch_cache);
// the new query, key and value come from p.qkv, and block 0 stores the new key and value into the cache.
// nw [2 HD]: scratch for the q/k norm weights; cs/sn: the position's RoPE table.
__device__ void attention(const Params& p, int layer, int pos, const T* x, float* xs, T* xb, float* xr, T* kvs,
                          float* nw, const float* cs, const float* sn) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const Layer& L = p.layer[layer];
  {  // one round trip to the L2: q (as floats), the new key and value (into kvs at pos), the residual, norms
    const int c = threadIdx.x;  // THREADS == (NH + 2 NKV) HD / 8: one 16-byte chunk of q/k/v each
    const uint4 raw = __ldcg(reinterpret_cast<const uint4*>(p.qkv) + c);
    float r[8], w[8];
    const bool has_x = c < H / 8, has_w = c < 2 * HD / 8;
    if (has_x) load8(r, x + 8 * c);
    if (has_w) load8(w, (c < HD / 8 ? L.qn : L.kn) + 8 * (c % (HD / 8)));
    if (c < NH * HD / 8) {
      const __nv_bfloat162* h2 = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float2 f = __bfloat1622float2(h2[i]);
        xs[8 * c + 2 * i] = f.x, xs[8 * c + 2 * i + 1] = f.y;
      }
    } else {
      const int e = c * 8 - NH * HD, kv = e / (NKV * HD), g = (e / HD) % NKV;
      *reinterpret_cast<uint4*>(kvs + ((g * NPOS + pos) * 2 + kv) * HD + e % HD) = raw;
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      if (has_x) xr[8 * c + i] = r[i];
      if (has_w) nw[8 * c + i] = w[i];
    }
  }
  __syncthreads();
  norm_rope(xs + warp * HD, nw, cs, sn, p.eps, p.scale);  // query head `warp`
  if (warp < NKV) norm_rope(kvs + (warp * NPOS + pos) * 2 * HD, nw + HD, cs, sn, p.eps, 1.f);  // key head `warp`
  asm volatile("cp.async.wait_all;" ::: "memory");
  __syncthreads();
  if (blockIdx.x == 0 && threadIdx.x < 2 * NKV * HD / 8) {  // the new keys and values into the cache
    const int c = threadIdx.x, kv = c / (NKV * HD / 8), g = (c / (HD / 8)) % NKV, d = (c % (HD / 8)) * 8;
    T* dst = (kv ? p.pv : p.pk) + layer * p.cache_layer + g * p.cache_head + pos * p.cache_pos + d;
    *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(kvs + ((g * NPOS + pos) * 2 + kv) * HD + d);
  }
  // query head h = warp against key/value head h / 2. Each lane sums its 4 of HD products (dims 4 lane ...) for
  // every position, then one transposed reduction sums them over the warp for all positions at once (16
  // shuffles, not 5 a position): four halvings (lane bits 4..1) leave lanes 2i and 2i + 1 with halves of
  // position i's sum. Lane i then holds position i's score.
  static_assert(NPOS == 16, "one position per lane pair after four halvings");
  const T* kv = kvs + (warp / 2) * NPOS * 2 * HD;
  auto four = [&](int row) {  // this lane's 4 values of kv row `row` (2 i: key i, 2 i + 1: value i)
    const uint2 raw = reinterpret_cast<const uint2*>(kv + row * HD)[lane];
    const __nv_bfloat162* h2 = reinterpret_cast<const __nv_bfloat162*>(&raw);
    const float2 a = __bfloat1622float2(h2[0]), b = __bfloat1622float2(h2[1]);
    return make_float4(a.x, a.y, b.x, b.y);
  };
  const float4 q = reinterpret_cast<const float4*>(xs + warp * HD)[lane];
  float part[NPOS];
#pragma unroll
  for (int i = 0; i < NPOS; ++i) {
    part[i] = 0.f;
    if (i <= pos) {
      const float4 k = four(2 * i);
      part[i] = q.x * k.x + q.y * k.y + q.z * k.z + q.w * k.w;
    }
  }
  halve<8>(part, lane), halve<4>(part, lane), halve<2>(part, lane), halve<1>(part, lane);
  const float pair = part[0] + __shfl_xor_sync(0xffffffffu, part[0], 1);
  const float mine = __shfl_sync(0xffffffffu, pair, 2 * (lane & (NPOS - 1)));
  const float s = lane <= pos ? mine : -INFINITY;
  float best = s;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) best = fmaxf(best, __shfl_xor_sync(0xffffffffu, best, o));
  const float e = lane <= pos ? expf(s - best) : 0.f;
  const float tot = warp_sum(e);
  float4 out = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
  for (int i = 0; i < NPOS; ++i) {
    const float ei = __shfl_sync(0xffffffffu, e, i);
    if (i <= pos) {
      const float4 v = four(2 * i + 1);
      out.x += ei * v.x, out.y += ei * v.y, out.z += ei * v.z, out.w += ei * v.w;
    }
  }
  const __nv_bfloat162 o[2] = {__floats2bfloat162_rn(out.x / tot, out.y / tot),
                               __floats2bfloat162_rn(out.z / tot, out.w / tot)};
  reinterpret_cast<uint2*>(xb + warp * HD)[lane] = *reinterpret_cast<const uint2*>(o);
  __syncthreads();
}

__device__ __forceinline__ void better(float& best, int& idx, float v, int i) {
  if (v > best || (v == best && i < idx)) best = v, idx = i;
}

// The greedy code of the last head phase: the best of the blocks' bests, the first maximum on ties (as
// torch.argmax). red_val, red_idx: [WARPS] shared scratch.
__device__ int chosen_code(const Params& p, float* red_val, int* red_idx) {
  float best = -INFINITY;
  int idx = 0x7fffffff;
  if (threadIdx.x < gridDim.x) best = __ldcg(p.part_val + threadIdx.x), idx = __ldcg(p.part_idx + threadIdx.x);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1)
    better(best, idx, __shfl_xor_sync(0xffffffffu, best, o), __shfl_xor_sync(0xffffffffu, idx, o));
  if ((threadIdx.x & 31) == 0) red_val[threadIdx.x >> 5] = best, red_idx[threadIdx.x >> 5] = idx;
  __syncthreads();
  for (int w = 0; w < WARPS; ++w) better(best, idx, red_val[w], red_idx[w]);
  __syncthreads();
  return idx < VOCAB ? idx : 0;  // no maximum (all scores NaN): stay inside the tables
}

__global__ void __launch_bounds__(THREADS, 1) predictor_passes(const __grid_constant__ Params p) {
  extern __shared__ __align__(16) unsigned char smem[];
  T* bufs[2] = {reinterpret_cast<T*>(smem), reinterpret_cast<T*>(smem) + p.buf_elems};
  T* xb = bufs[1] + p.buf_elems;                                 // [XS] a phase's input
  float* xs = reinterpret_cast<float*>(xb + XS);                 // [NH HD] the attention's queries
  float* xr = xs + NH * HD;                                      // [H] the residual stream
  float* nw = xr + H;                                            // [2 HD] q/k norm weights
  float* cs = nw + 2 * HD;                                       // [HD / 2] RoPE cosines at this pass
  float* sn = cs + HD / 2;                                       // [HD / 2] and sines
  float* red = sn + HD / 2;                                      // [WARPS] reductions
  int* red_idx = reinterpret_cast<int*>(red + WARPS);            // [WARPS]
  uint64_t* bars = reinterpret_cast<uint64_t*>(red_idx + WARPS);  // [2] a buffer's copies done
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  init_barriers(bars, 2);
  unsigned target = 0;
  int widx = 0;  // the weight phase being computed
  issue(p, 0, bufs[0], bars);

  // Start weight phase widx: wait for its weights; its shape.
  auto begin = [&]() {
    int pass, step, layer;
    phase_at(p, widx, pass, step, layer);
    wait_copies(bars + (widx & 1), (widx >> 1) & 1);
    return weights_of(p, pass, step, layer);
  };
  // Compute weight phase widx from its buffer, its input now in xb: each warp takes rows warp, warp + WARPS, ...
  // of the block's CB-row blocks; `emit(row, acc, acc_up)` (lane 0) gets each output row's sums. The next weight
  // phase's copy is issued first: not at the phase's start, as that copy traffic slowed the input's load from
  // the L2 (the launch took 1855 us against 1639).
  auto gemv = [&](const WPhase& ph, auto&& emit) {
    issue(p, widx + 1, bufs[(widx + 1) & 1], bars + ((widx + 1) & 1));
    const T* buf = bufs[widx & 1];
    const int mine = (ph.blocks - static_cast<int>(blockIdx.x) + static_cast<int>(gridDim.x) - 1) / gridDim.x;
    const int rows = mine * CB;
    auto row = [&](int it) { return buf + ((it / CB) * ph.segs * CB + it % CB) * ph.k; };
    auto out = [&](int it) { return (blockIdx.x + (it / CB) * gridDim.x) * CB + it % CB; };
    if (ph.segs == 2) {  // a row's gate and up sums together
      for (int it = warp; it < rows; it += WARPS) {
        const T* w[2] = {row(it), row(it) + CB * ph.k};
        float acc[2];
        dot_rows(w, xb, ph.k, lane, acc);
        if (lane == 0) emit(out(it), acc[0], acc[1]);
      }
    } else {  // rows it and it + WARPS together
      for (int it = warp; it < rows; it += 2 * WARPS) {
        if (it + WARPS < rows) {
          const T* w[2] = {row(it), row(it + WARPS)};
          float acc[2];
          dot_rows(w, xb, ph.k, lane, acc);
          if (lane == 0) emit(out(it), acc[0], 0.f), emit(out(it + WARPS), acc[1], 0.f);
        } else {
          const T* w[1] = {row(it)};
          float acc[1];
          dot_rows(w, xb, ph.k, lane, acc);
          if (lane == 0) emit(out(it), acc[0], 0.f);
        }
      }
    }
    ++widx;
  };
  auto residual = [&](int c, float acc, float) { p.x[c] = __float2bfloat16(rnd(acc) + xr[c]); };

  const T* in = p.x;  // the pass's input: the residual stream until the first layer has written it
  for (int pass = p.first; pass <= p.last; ++pass) {
    const int pos = pass + 1;
    rope_table(cs, sn, p.inv_freq, pos);
    for (int l = 0; l < LAYERS; ++l) {
      const Layer& L = p.layer[l];
      WPhase ph = begin();  // q/k/v; the attention's cached keys and values into the next buffer's tail
      prefetch_cache(p, l, pos, bufs[(widx + 1) & 1] + p.buf_elems - KVS_ELEMS);
      load_norm<H, THREADS>(xb, red, in, L.ln, p.eps);
      gemv(ph, [&](int c, float acc, float) { p.qkv[c] = __float2bfloat16(acc); });
      grid_sync<THREADS>(p.counter, target);

      ph = begin();  // attention, output projection
      attention(p, l, pos, in, xs, xb, xr, bufs[widx & 1] + p.buf_elems - KVS_ELEMS, nw, cs, sn);
      gemv(ph, residual);
      grid_sync<THREADS>(p.counter, target);
      in = p.x;

      ph = begin();  // gate/up, SwiGLU
      load_norm<H, THREADS>(xb, red, p.x, L.ln2, p.eps);
      gemv(ph, [&](int c, float acc, float acc2) {
        const float g = rnd(acc);
        p.act[c] = __float2bfloat16(rnd(g / (1.f + expf(-g))) * rnd(acc2));
      });
      grid_sync<THREADS>(p.counter, target);

      ph = begin();  // down
      load_vec<H, THREADS>(xb, p.act, INTER, xr, p.x);
      gemv(ph, residual);
      grid_sync<THREADS>(p.counter, target);
    }

    // head: scores rounded to the weights' dtype (as out_dtype=float32 does); the block's best to part_*
    WPhase ph = begin();
    load_norm<H, THREADS>(xb, red, p.x, p.norm, p.norm_eps);
    float best = -INFINITY;
    int idx = 0x7fffffff;
    gemv(ph, [&](int c, float acc, float) { better(best, idx, rnd(acc), c); });
    if (lane == 0) red[warp] = best, red_idx[warp] = idx;  // lane 0 holds its warp's best
    __syncthreads();
    if (threadIdx.x == 0) {
      for (int w = 0; w < WARPS; ++w) better(best, idx, red[w], red_idx[w]);
      p.part_val[blockIdx.x] = best;
      p.part_idx[blockIdx.x] = idx;
    }
    grid_sync<THREADS>(p.counter, target);

    // every block: the greedy code; block 0 records it and adds its embedding to the frame's sum
    const int tok = chosen_code(p, red, red_idx);
    if (blockIdx.x == 0) {
      const T* row = p.table[pass] + static_cast<long long>(tok) * p.ht;
      if (threadIdx.x == 0) p.frames[pass + 1] = tok;
      for (int c = threadIdx.x; c < p.ht / 8; c += THREADS) {
        float a[8], b[8];
        load8(a, p.total + 8 * c);
        load8(b, row + 8 * c);
        __nv_bfloat162 out[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) out[i] = __floats2bfloat162_rn(a[2 * i] + b[2 * i], a[2 * i + 1] + b[2 * i + 1]);
        *reinterpret_cast<uint4*>(p.total + 8 * c) = *reinterpret_cast<const uint4*>(out);
      }
    }
    if (pass < p.last) in = p.next_in[pass] + static_cast<long long>(tok) * H;
  }
}

int blocks_for(int rows, int grid) { return (rows / CB + grid - 1) / grid; }

// Shared memory per block: two weight buffers (the largest phase share; the output projection's share with
// the attention's keys and values after it), the vectors, reductions, the copies' barriers.
int shared_bytes(int grid, int& buf_elems) {
  const int o_share = blocks_for(H, grid) * CB * NH * HD;
  const int shares[] = {blocks_for((NH + 2 * NKV) * HD, grid) * CB * H, o_share + KVS_ELEMS,
                        blocks_for(INTER, grid) * 2 * CB * H, blocks_for(H, grid) * CB * INTER,
                        blocks_for(VOCAB, grid) * CB * H};
  buf_elems = 0;
  for (int s : shares) buf_elems = s > buf_elems ? s : buf_elems;
  return (2 * buf_elems + XS) * static_cast<int>(sizeof(T)) +
         (NH * HD + H + 3 * HD + 2 * WARPS) * static_cast<int>(sizeof(float)) + 2 * static_cast<int>(sizeof(uint64_t));
}

// ptrs: layer weights (LAYERS x 8: ln, qkv, qn, kn, o, ln2, gu, down), norm, pk, pv, inv_freq, x, qkv, act,
// part_val, part_idx, frames, total, counter, then heads, tables, next_in (groups - 1 each; null where unused).
// ints: cache strides (layer, head, pos), first, last, ht, grid. floats: eps, norm_eps, scale.
void launch(const std::vector<int64_t>& ptrs, const std::vector<int64_t>& ints, const std::vector<double>& floats,
            int64_t stream) {
  Params p{};
  size_t i = 0;
  auto next = [&]() { return reinterpret_cast<void*>(ptrs.at(i++)); };
  for (int l = 0; l < LAYERS; ++l) {
    Layer& L = p.layer[l];
    L.ln = static_cast<const T*>(next()), L.qkv = static_cast<const T*>(next());
    L.qn = static_cast<const T*>(next()), L.kn = static_cast<const T*>(next());
    L.o = static_cast<const T*>(next()), L.ln2 = static_cast<const T*>(next());
    L.gu = static_cast<const T*>(next()), L.down = static_cast<const T*>(next());
  }
  p.norm = static_cast<const T*>(next());
  p.pk = static_cast<T*>(next()), p.pv = static_cast<T*>(next());
  p.inv_freq = static_cast<const float*>(next());
  p.x = static_cast<T*>(next()), p.qkv = static_cast<T*>(next());
  p.act = static_cast<T*>(next());
  p.part_val = static_cast<float*>(next()), p.part_idx = static_cast<int*>(next());
  p.frames = static_cast<long long*>(next()), p.total = static_cast<T*>(next());
  p.counter = static_cast<unsigned*>(next());
  const size_t tables = (ptrs.size() - i) / 3;
  if (tables > MAX_GROUPS || ptrs.size() != i + 3 * tables) throw std::runtime_error("predictor_passes: ptrs");
  for (size_t j = 0; j < tables; ++j) p.head[j] = static_cast<const T*>(next());
  for (size_t j = 0; j < tables; ++j) p.table[j] = static_cast<const T*>(next());
  for (size_t j = 0; j < tables; ++j) p.next_in[j] = static_cast<const T*>(next());
  p.cache_layer = ints.at(0), p.cache_head = ints.at(1), p.cache_pos = ints.at(2);
  p.first = static_cast<int>(ints.at(3)), p.last = static_cast<int>(ints.at(4)), p.ht = static_cast<int>(ints.at(5));
  const int grid = static_cast<int>(ints.at(6));
  if (grid > THREADS || p.ht % 8) throw std::runtime_error("predictor_passes: grid or hidden size");
  if (p.first < 1 || p.last >= static_cast<int>(tables) || p.last + 1 >= MAX_GROUPS)
    throw std::runtime_error("predictor_passes: passes out of range");
  p.eps = static_cast<float>(floats.at(0)), p.norm_eps = static_cast<float>(floats.at(1));
  p.scale = static_cast<float>(floats.at(2));
  const int bytes = shared_bytes(grid, p.buf_elems);
  auto s = reinterpret_cast<cudaStream_t>(stream);
  check(cudaMemsetAsync(p.counter, 0, sizeof(unsigned), s), "counter reset");
  predictor_passes<<<grid, THREADS, bytes, s>>>(p);
  check(cudaGetLastError(), "predictor_passes launch");
}

// Allow the kernel its shared memory (outside any graph capture); returns the bytes, or raises.
int prepare(int grid) {
  int buf = 0;
  const int bytes = shared_bytes(grid, buf);
  check(cudaFuncSetAttribute(predictor_passes, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes), "smem limit");
  return bytes;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("launch", &launch, "The code predictor's passes [first, last] for one row, in one launch");
  m.def("prepare", &prepare, "Raise the kernel's shared-memory limit for `grid` blocks; the bytes per block");
}
