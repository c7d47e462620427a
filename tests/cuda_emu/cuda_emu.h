// A CPU emulation of the small part of CUDA that ndfuse's emitted kernels use, so that
// their *semantics* (indexing, row programs, tree combines, split reductions, half
// conversions, tensor-core fragments) are tested on machines without a GPU.
// Force-included (`-include`) before an emitted source, with `mma.h` after it (the
// `nvcuda::wmma` subset); `cuda_fp16.h` / `cuda_bf16.h` in this folder are empty.
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

// The calling thread's warp's barrier (every block size here is a multiple of 32).
static inline std::barrier<>& nd_emu_warp_barrier() {
  return *nd_emu_warp_barriers[(threadIdx.x + threadIdx.y * blockDim.x) / 32];
}
static inline unsigned nd_emu_lane() { return (threadIdx.x + threadIdx.y * blockDim.x) % 32; }
static inline void __syncwarp(unsigned = 0xffffffffu) { nd_emu_warp_barrier().arrive_and_wait(); }

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
// The fast intrinsics, at full precision here (the GPU's are within a few f32 ulp).
// (glibc declares a __expf of its own, so a macro, after <cmath>.)
#define __expf(x) expf(x)
static inline float __fdividef(float a, float b) { return a / b; }
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
  switch (n) {
  case 1: ((void (*)(void*))fn)(a[0]); break;
  case 2: ((void (*)(void*, void*))fn)(a[0], a[1]); break;
  case 3: ((void (*)(void*, void*, void*))fn)(a[0], a[1], a[2]); break;
  case 4: ((void (*)(void*, void*, void*, void*))fn)(a[0], a[1], a[2], a[3]); break;
  case 5: ((void (*)(void*, void*, void*, void*, void*))fn)(a[0], a[1], a[2], a[3], a[4]); break;
  case 6: ((void (*)(void*, void*, void*, void*, void*, void*))fn)(a[0], a[1], a[2], a[3], a[4], a[5]); break;
  case 7: ((void (*)(void*, void*, void*, void*, void*, void*, void*))fn)(a[0], a[1], a[2], a[3], a[4], a[5], a[6]); break;
  case 8: ((void (*)(void*, void*, void*, void*, void*, void*, void*, void*))fn)(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7]); break;
  case 9: ((void (*)(void*, void*, void*, void*, void*, void*, void*, void*, void*))fn)(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8]); break;
  case 10: ((void (*)(void*, void*, void*, void*, void*, void*, void*, void*, void*, void*))fn)(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9]); break;
  case 11: ((void (*)(void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*))fn)(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10]); break;
  case 12: ((void (*)(void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*))fn)(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11]); break;
  case 13: ((void (*)(void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*))fn)(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11], a[12]); break;
  case 14: ((void (*)(void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*))fn)(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11], a[12], a[13]); break;
  case 15: ((void (*)(void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*))fn)(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11], a[12], a[13], a[14]); break;
  case 16: ((void (*)(void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*))fn)(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11], a[12], a[13], a[14], a[15]); break;
  case 17: ((void (*)(void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*))fn)(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11], a[12], a[13], a[14], a[15], a[16]); break;
  case 18: ((void (*)(void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*))fn)(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11], a[12], a[13], a[14], a[15], a[16], a[17]); break;
  case 19: ((void (*)(void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*))fn)(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11], a[12], a[13], a[14], a[15], a[16], a[17], a[18]); break;
  case 20: ((void (*)(void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*))fn)(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11], a[12], a[13], a[14], a[15], a[16], a[17], a[18], a[19]); break;
  case 21: ((void (*)(void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*))fn)(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11], a[12], a[13], a[14], a[15], a[16], a[17], a[18], a[19], a[20]); break;
  case 22: ((void (*)(void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*))fn)(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11], a[12], a[13], a[14], a[15], a[16], a[17], a[18], a[19], a[20], a[21]); break;
  case 23: ((void (*)(void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*))fn)(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11], a[12], a[13], a[14], a[15], a[16], a[17], a[18], a[19], a[20], a[21], a[22]); break;
  case 24: ((void (*)(void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*))fn)(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11], a[12], a[13], a[14], a[15], a[16], a[17], a[18], a[19], a[20], a[21], a[22], a[23]); break;
  case 25: ((void (*)(void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*))fn)(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11], a[12], a[13], a[14], a[15], a[16], a[17], a[18], a[19], a[20], a[21], a[22], a[23], a[24]); break;
  case 26: ((void (*)(void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*))fn)(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11], a[12], a[13], a[14], a[15], a[16], a[17], a[18], a[19], a[20], a[21], a[22], a[23], a[24], a[25]); break;
  case 27: ((void (*)(void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*))fn)(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11], a[12], a[13], a[14], a[15], a[16], a[17], a[18], a[19], a[20], a[21], a[22], a[23], a[24], a[25], a[26]); break;
  case 28: ((void (*)(void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*))fn)(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11], a[12], a[13], a[14], a[15], a[16], a[17], a[18], a[19], a[20], a[21], a[22], a[23], a[24], a[25], a[26], a[27]); break;
  case 29: ((void (*)(void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*))fn)(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11], a[12], a[13], a[14], a[15], a[16], a[17], a[18], a[19], a[20], a[21], a[22], a[23], a[24], a[25], a[26], a[27], a[28]); break;
  case 30: ((void (*)(void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*))fn)(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11], a[12], a[13], a[14], a[15], a[16], a[17], a[18], a[19], a[20], a[21], a[22], a[23], a[24], a[25], a[26], a[27], a[28], a[29]); break;
  case 31: ((void (*)(void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*))fn)(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11], a[12], a[13], a[14], a[15], a[16], a[17], a[18], a[19], a[20], a[21], a[22], a[23], a[24], a[25], a[26], a[27], a[28], a[29], a[30]); break;
  case 32: ((void (*)(void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*, void*))fn)(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11], a[12], a[13], a[14], a[15], a[16], a[17], a[18], a[19], a[20], a[21], a[22], a[23], a[24], a[25], a[26], a[27], a[28], a[29], a[30], a[31]); break;
  default: std::abort();
  }
}

// Runs `fn` over `grid` blocks of (bx, by) threads with `n` pointer arguments.
extern "C" int nd_emu_launch(void* fn, unsigned grid, unsigned bx, unsigned by, int n, void** args) {
  if ((bx * by) % 32 != 0 || bx * by > 1024 || n < 1 || n > 32) return 1;
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
