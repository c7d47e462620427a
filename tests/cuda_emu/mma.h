// The part of `nvcuda::wmma` (CUDA's <mma.h>) that ndfuse's tensor-core GEMM uses,
// emulated on the CPU for cuda_emu.h (force-included after it): 16x16x16 fragments of
// f16/bf16 operands with f32 accumulators, fill_fragment, load_matrix_sync, mma_sync
// and store_matrix_sync.
//
// On a GPU the tile of a fragment is spread over the 32 lanes of a warp in an order
// CUDA leaves unspecified, so correct code never indexes a fragment's elements. Here
// every lane holds the whole tile (`tile`, deliberately not CUDA's `x`, so emitted code
// that indexes `frag.x[i]` does not compile), and:
// - every operation is collective: it starts with the warp's barrier, so a warp whose
//   lanes do not all reach it hangs rather than passing by luck;
// - loads and stores check CUDA's rules: the pointer 256-bit aligned, `ldm` a multiple
//   of 16 bytes;
// - mma_sync computes each element in f32 from the half values (their products are
//   exact in f32), accumulating in order of k;
// - store_matrix_sync writes from lane 0 only: other lanes see the values after a
//   `__syncwarp()`, which the emitted code must have (as on a GPU, where each lane
//   writes its own part).
#pragma once
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <type_traits>

namespace nvcuda {
namespace wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

static inline float nd_emu_value(__half h) { return __half2float(h); }
static inline float nd_emu_value(__nv_bfloat16 b) { return __bfloat162float(b); }
static inline float nd_emu_value(float f) { return f; }

// Rows and columns of the tile a fragment holds: M x K (a), K x N (b), M x N (c).
template <typename Use, int M, int N, int K> struct nd_emu_shape;
template <int M, int N, int K> struct nd_emu_shape<matrix_a, M, N, K> {
  static constexpr int rows = M, cols = K;
};
template <int M, int N, int K> struct nd_emu_shape<matrix_b, M, N, K> {
  static constexpr int rows = K, cols = N;
};
template <int M, int N, int K> struct nd_emu_shape<accumulator, M, N, K> {
  static constexpr int rows = M, cols = N;
};

template <typename Use, int M, int N, int K, typename T, typename Layout = void>
struct fragment {
  static_assert(M == 16 && N == 16 && K == 16, "the emulator has 16x16x16 fragments only");
  static_assert(std::is_same_v<Use, accumulator> ? std::is_same_v<T, float>
                                                 : (std::is_same_v<T, __half> ||
                                                    std::is_same_v<T, __nv_bfloat16>),
                "operands are f16 or bf16, accumulators f32");
  static_assert(std::is_same_v<Use, accumulator> == std::is_same_v<Layout, void>,
                "operand fragments name their layout, accumulators do not");
  using element = T;
  using layout = Layout;
  static constexpr int rows = nd_emu_shape<Use, M, N, K>::rows;
  static constexpr int cols = nd_emu_shape<Use, M, N, K>::cols;
  // The whole tile, row-major, as f32 (which holds every f16 and bf16 value exactly).
  float tile[rows * cols];
};

// The warp's barrier: every lane of the warp must reach each collective operation.
static inline void nd_emu_collective() { nd_emu_warp_barrier().arrive_and_wait(); }

static inline void nd_emu_check(const void* p, unsigned ldm, unsigned elem_bytes, const char* what) {
  if ((uintptr_t)p % 32 != 0 || (ldm * elem_bytes) % 16 != 0) {
    std::fprintf(stderr, "wmma::%s: pointer %p must be 256-bit aligned and ldm %u a multiple of 16 bytes\n",
                 what, p, ldm);
    std::abort();
  }
}

template <typename Use, int M, int N, int K, typename T, typename L>
static inline void fill_fragment(fragment<Use, M, N, K, T, L>& f, float v) {
  nd_emu_collective();
  for (float& x : f.tile) x = v;
}

template <typename Use, int M, int N, int K, typename T, typename L>
static inline void load_matrix_sync(fragment<Use, M, N, K, T, L>& f, const T* p, unsigned ldm) {
  static_assert(!std::is_same_v<Use, accumulator>, "accumulators are not loaded by ndfuse");
  nd_emu_collective();
  nd_emu_check(p, ldm, sizeof(T), "load_matrix_sync");
  constexpr bool row = std::is_same_v<L, row_major>;
  for (int r = 0; r < f.rows; ++r)
    for (int c = 0; c < f.cols; ++c)
      f.tile[r * f.cols + c] = nd_emu_value(row ? p[(size_t)r * ldm + c] : p[(size_t)c * ldm + r]);
}

template <int M, int N, int K, typename T, typename LA, typename LB>
static inline void mma_sync(fragment<accumulator, M, N, K, float>& d,
                            const fragment<matrix_a, M, N, K, T, LA>& a,
                            const fragment<matrix_b, M, N, K, T, LB>& b,
                            const fragment<accumulator, M, N, K, float>& c) {
  nd_emu_collective();
  float out[M * N];
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) {
      float s = c.tile[i * N + j];
      for (int k = 0; k < K; ++k) s = std::fmaf(a.tile[i * K + k], b.tile[k * N + j], s);
      out[i * N + j] = s;
    }
  for (int e = 0; e < M * N; ++e) d.tile[e] = out[e];
}

template <int M, int N, int K>
static inline void store_matrix_sync(float* p, const fragment<accumulator, M, N, K, float>& f,
                                     unsigned ldm, layout_t layout) {
  nd_emu_collective();
  nd_emu_check(p, ldm, sizeof(float), "store_matrix_sync");
  if (nd_emu_lane() != 0) return;
  for (int r = 0; r < M; ++r)
    for (int c = 0; c < N; ++c) {
      float v = f.tile[r * N + c];
      if (layout == mem_row_major) p[(size_t)r * ldm + c] = v;
      else p[(size_t)c * ldm + r] = v;
    }
}

}  // namespace wmma
}  // namespace nvcuda
