// A CPU emulation of the small part of CUDA that ndfuse's emitted kernels use, so that
// their *semantics* (indexing, row programs, tree combines, split reductions, half
// conversions) are tested on machines without a GPU. Force-included (`-include`) before
// an emitted source; `cuda_fp16.h` / `cuda_bf16.h` in this folder are empty.
//
// A launch runs its blocks one after another; the threads of a block are real OS
// threads, so `__syncthreads()` is a barrier over the block and `__shfl_xor_sync` a
// barrier-separated exchange within each warp of 32. `__shared__` variables become
// function statics: shared by the threads of the one block running at a time.
// Timing, occupancy and memory coalescing are not emulated: this checks values only.
#pragma once
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <math.h>
#include <memory>
#include <thread>
#include <vector>

struct dim3 {
  unsigned x = 1, y = 1, z = 1;
};
static thread_local dim3 threadIdx, blockIdx;
static dim3 blockDim, gridDim;

#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(n)
#define __shared__ static
#define __align__(n) alignas(n)

static std::barrier<>* nd_emu_block_barrier;
static std::vector<std::unique_ptr<std::barrier<>>> nd_emu_warp_barriers;
static uint64_t nd_emu_slots[1024];

static inline void __syncthreads() { nd_emu_block_barrier->arrive_and_wait(); }

template <typename T>
static inline T __shfl_xor_sync(unsigned, T v, int o) {
  unsigned tid = threadIdx.x + threadIdx.y * blockDim.x;
  unsigned warp = tid / 32, lane = tid % 32;
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  nd_emu_slots[tid] = bits;
  nd_emu_warp_barriers[warp]->arrive_and_wait();
  uint64_t other = nd_emu_slots[warp * 32 + (lane ^ (unsigned)o)];
  nd_emu_warp_barriers[warp]->arrive_and_wait();
  T r;
  std::memcpy(&r, &other, sizeof(T));
  return r;
}

template <typename T>
static inline T min(T a, T b) { return a < b ? a : b; }

static inline float __int_as_float(int x) { float f; std::memcpy(&f, &x, 4); return f; }
static inline double __longlong_as_double(long long x) { double d; std::memcpy(&d, &x, 8); return d; }
using std::signbit;

// f16: the compiler's _Float16 (IEEE binary16, conversions rounded to nearest even).
struct __half { _Float16 v; };
static inline float __half2float(__half h) { return (float)h.v; }
static inline __half __float2half_rn(float f) { return __half{(_Float16)f}; }
static inline __half __double2half(double d) { return __half{(_Float16)d}; }
static inline __half __ll2half_rn(long long v) { return __half{(_Float16)v}; }

// bf16: the upper half of an f32, rounded to nearest even; from f64 through f32 with
// round-to-odd so that it rounds once.
struct __nv_bfloat16 { uint16_t bits; };
static inline float __bfloat162float(__nv_bfloat16 b) {
  uint32_t u = (uint32_t)b.bits << 16; float f; std::memcpy(&f, &u, 4); return f;
}
static inline __nv_bfloat16 __float2bfloat16_rn(float f) {
  uint32_t u; std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return __nv_bfloat16{(uint16_t)((u >> 16) | 0x40)};
  u += 0x7fffu + ((u >> 16) & 1u);
  return __nv_bfloat16{(uint16_t)(u >> 16)};
}
static inline float nd_emu_f32_round_to_odd(double d) {
  float f = (float)d;
  if (std::isnan(d) || (double)f == d || std::isinf(f)) return f;
  if (std::fabs((double)f) > std::fabs(d)) f = std::nextafter(f, 0.0f);
  uint32_t u; std::memcpy(&u, &f, 4); u |= 1u; std::memcpy(&f, &u, 4);
  return f;
}
static inline __nv_bfloat16 __double2bfloat16(double d) { return __float2bfloat16_rn(nd_emu_f32_round_to_odd(d)); }
static inline __nv_bfloat16 __ll2bfloat16_rn(long long v) { return __double2bfloat16((double)v); }

typedef void (*nd_emu_fn)();

static void nd_emu_call(void* fn, int n, void** a) {
#define A(i) a[i]
  switch (n) {
  case 1: ((void (*)(void*))fn)(A(0)); break;
  case 2: ((void (*)(void*, void*))fn)(A(0), A(1)); break;
  case 3: ((void (*)(void*, void*, void*))fn)(A(0), A(1), A(2)); break;
  case 4: ((void (*)(void*, void*, void*, void*))fn)(A(0), A(1), A(2), A(3)); break;
  case 5: ((void (*)(void*, void*, void*, void*, void*))fn)(A(0), A(1), A(2), A(3), A(4)); break;
  case 6: ((void (*)(void*, void*, void*, void*, void*, void*))fn)(A(0), A(1), A(2), A(3), A(4), A(5)); break;
  case 7: ((void (*)(void*, void*, void*, void*, void*, void*, void*))fn)(A(0), A(1), A(2), A(3), A(4), A(5), A(6)); break;
  case 8: ((void (*)(void*, void*, void*, void*, void*, void*, void*, void*))fn)(A(0), A(1), A(2), A(3), A(4), A(5), A(6), A(7)); break;
  case 9: ((void (*)(void*, void*, void*, void*, void*, void*, void*, void*, void*))fn)(A(0), A(1), A(2), A(3), A(4), A(5), A(6), A(7), A(8)); break;
  case 10: ((void (*)(void*, void*, void*, void*, void*, void*, void*, void*, void*, void*))fn)(A(0), A(1), A(2), A(3), A(4), A(5), A(6), A(7), A(8), A(9)); break;
  case 11: ((void (*)(void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*))fn)(A(0), A(1), A(2), A(3), A(4), A(5), A(6), A(7), A(8), A(9), A(10)); break;
  case 12: ((void (*)(void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*))fn)(A(0), A(1), A(2), A(3), A(4), A(5), A(6), A(7), A(8), A(9), A(10), A(11)); break;
  default: std::abort();
  }
#undef A
}

// Runs `fn` over `grid` blocks of (bx, by) threads with `n` pointer arguments.
extern "C" int nd_emu_launch(void* fn, unsigned grid, unsigned bx, unsigned by, int n, void** args) {
  if ((bx * by) % 32 != 0 || bx * by > 1024 || n < 1 || n > 12) return 1;
  blockDim = dim3{bx, by, 1};
  gridDim = dim3{grid, 1, 1};
  unsigned threads = bx * by;
  for (unsigned b = 0; b < grid; ++b) {
    std::barrier<> block(threads);
    nd_emu_block_barrier = &block;
    nd_emu_warp_barriers.clear();
    for (unsigned w = 0; w < threads / 32; ++w) nd_emu_warp_barriers.emplace_back(new std::barrier<>(32));
    std::vector<std::thread> ts;
    ts.reserve(threads);
    for (unsigned ty = 0; ty < by; ++ty)
      for (unsigned tx = 0; tx < bx; ++tx)
        ts.emplace_back([=] {
          blockIdx = dim3{b, 0, 0};
          threadIdx = dim3{tx, ty, 0};
          nd_emu_call(fn, n, args);
        });
    for (auto& t : ts) t.join();
  }
  return 0;
}
