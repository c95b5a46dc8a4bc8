// Fused RMSNorm for CPU tensors, loaded by normlab/norms/_fused_rms.py.
//
// Rows (R, D), the rms from the first k features of each row:
//   inv_rms = 1 / sqrt(mean(x[:k]^2) + eps),  y = x * inv_rms * w
// Backward, with s = sum_j dy_j * w_j * x_j over the whole row:
//   dx_i = inv_rms * dy_i * w_i - [i < k] * x_i * inv_rms^3 * s / k,   dw = sum_rows dy * x * inv_rms
//
// One reduction per row in each direction (LayerNorm needs two: the mean and the variance
// forward, sum dy*w and sum dy*w*xhat backward). Each row is read from memory once and written
// once: forward, one pass for the sum of squares and one writing y (the row is in L1 by then);
// backward, one pass computing s and adding dy * x * inv_rms into this thread's dw row, and one
// writing dx. dw is summed in one partial row per task, added up at the end. float32 rows use
// 16-lane vectors (GCC/Clang vector extensions: AVX-512 under -march=native where the CPU has
// it, two AVX2 registers otherwise) with 4 accumulators; other dtypes plain loops the compiler
// vectorizes.
//
// The upstream gradient dy may be a (R, D) view with any row stride (0 included) and a column
// stride of 1, or of 0 (one value per row, as `.sum().backward()`'s expanded gradient gives):
// both are read in place, with no full-size copy. Other layouts are copied to contiguous.
//
// Fresh outputs (y, dx) are advised to Linux as transparent huge pages (fresh_output): at the
// sizes where this kernel matters, their page faults otherwise cost as much as the arithmetic.

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <tuple>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace {

// rows per parallel task: about 16k elements, so small inputs are not split into tiny tasks
int64_t grain(int64_t d) { return std::max<int64_t>(1, 16384 / std::max<int64_t>(d, 1)); }

// ------------------------------------------------------------------ float32: 16-lane vectors

typedef float vec16 __attribute__((vector_size(64)));
constexpr int64_t kLanes = 16;

inline vec16 load(const float* p) {
  vec16 v;
  std::memcpy(&v, p, sizeof v);  // an unaligned vector load
  return v;
}
inline void store(float* p, vec16 v) { std::memcpy(p, &v, sizeof v); }
inline vec16 splat(float a) { return vec16{} + a; }
inline float hsum(vec16 v) {
  float s = 0.0f;
  for (int64_t i = 0; i < kLanes; ++i) s += v[i];
  return s;
}

// sum of x[j]^2 for j < n
inline float sum_squares(const float* x, int64_t n) {
  vec16 a0{}, a1{}, a2{}, a3{};
  int64_t j = 0;
  for (; j + 4 * kLanes <= n; j += 4 * kLanes) {
    const vec16 x0 = load(x + j), x1 = load(x + j + kLanes);
    const vec16 x2 = load(x + j + 2 * kLanes), x3 = load(x + j + 3 * kLanes);
    a0 += x0 * x0;
    a1 += x1 * x1;
    a2 += x2 * x2;
    a3 += x3 * x3;
  }
  for (; j + kLanes <= n; j += kLanes) {
    const vec16 x0 = load(x + j);
    a0 += x0 * x0;
  }
  float s = hsum((a0 + a1) + (a2 + a3));
  for (; j < n; ++j) s += x[j] * x[j];
  return s;
}

// Write one float per 4 KiB page of a fresh output before computing into it: the page faults
// then come in one run, not interleaved with the streaming reads and writes (measured ~1 ms
// less per 32 MiB output at (64, 256, 512)); a no-op cost on pages already mapped.
void touch(float* p, int64_t n) {
  for (int64_t i = 0; i < n; i += 1024) p[i] = 0.0f;
}

// A fresh output like x, its 2 MiB-aligned interior advised to Linux as transparent huge pages
// (MADV_HUGEPAGE; honoured where /sys/kernel/mm/transparent_hugepage/enabled is `madvise` or
// `always`, a no-op elsewhere). At these sizes most of a layer's time is the page faults of its
// fresh output (4 KiB each, zero-filled by the kernel): a 2 MiB page is one fault for 512 of
// them. Outputs under 4 MiB have no such interior worth it and are left alone.
at::Tensor fresh_output(const at::Tensor& x) {
  at::Tensor out = at::empty_like(x);
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  constexpr uintptr_t kHuge = uintptr_t(2) << 20;
  const uintptr_t begin = reinterpret_cast<uintptr_t>(out.data_ptr());
  const uintptr_t end = begin + uintptr_t(out.nbytes());
  const uintptr_t first = (begin + kHuge - 1) & ~(kHuge - 1), last = end & ~(kHuge - 1);
  if (out.nbytes() >= (size_t(4) << 20) && last > first) {
    madvise(reinterpret_cast<void*>(first), last - first, MADV_HUGEPAGE);  // advice: errors ignored
  }
#endif
  return out;
}

void forward_rows_f32(const float* x, const float* w, float* y, float* inv_rms, int64_t rows,
                      int64_t d, int64_t k, double eps) {
  at::parallel_for(0, rows, grain(d), [&](int64_t begin, int64_t end) {
    touch(y + begin * d, (end - begin) * d);  // this task's rows
    for (int64_t r = begin; r < end; ++r) {
      const float* xr = x + r * d;
      float* yr = y + r * d;
      const float inv = 1.0f / std::sqrt(sum_squares(xr, k) / float(k) + float(eps));
      inv_rms[r] = inv;
      const vec16 iv = splat(inv);
      int64_t j = 0;
      if (w != nullptr) {
        for (; j + kLanes <= d; j += kLanes) store(yr + j, load(xr + j) * iv * load(w + j));
        for (; j < d; ++j) yr[j] = xr[j] * inv * w[j];
      } else {
        for (; j + kLanes <= d; j += kLanes) store(yr + j, load(xr + j) * iv);
        for (; j < d; ++j) yr[j] = xr[j] * inv;
      }
    }
  });
}

// One row of the backward. kScalarDy: dy is one value per row (*dyr), else a contiguous row.
template <bool kScalarDy, bool kWeight, bool kDw, bool kDx>
inline void backward_row_f32(const float* dyr, const float* xr, const float* w, float inv,
                             float* dw, float* dxr, int64_t d, int64_t k) {
  const vec16 iv = splat(inv);
  const float c = kScalarDy ? *dyr : 0.0f;
  auto dy_at = [&](int64_t j) { return kScalarDy ? splat(c) : load(dyr + j); };
  auto dy_one = [&](int64_t j) { return kScalarDy ? c : dyr[j]; };
  auto w_at = [&](int64_t j) { return kWeight ? load(w + j) : splat(1.0f); };
  auto w_one = [&](int64_t j) { return kWeight ? w[j] : 1.0f; };
  // pass 1: s = sum dy * w * x, and dw += dy * x * inv_rms
  vec16 s0{}, s1{};
  int64_t j = 0;
  for (; j + 2 * kLanes <= d; j += 2 * kLanes) {
    const vec16 dx0 = dy_at(j) * load(xr + j), dx1 = dy_at(j + kLanes) * load(xr + j + kLanes);
    s0 += dx0 * w_at(j);
    s1 += dx1 * w_at(j + kLanes);
    if (kDw) {
      store(dw + j, load(dw + j) + dx0 * iv);
      store(dw + j + kLanes, load(dw + j + kLanes) + dx1 * iv);
    }
  }
  for (; j + kLanes <= d; j += kLanes) {
    const vec16 dx0 = dy_at(j) * load(xr + j);
    s0 += dx0 * w_at(j);
    if (kDw) store(dw + j, load(dw + j) + dx0 * iv);
  }
  float s = hsum(s0 + s1);
  for (; j < d; ++j) {
    const float p = dy_one(j) * xr[j];
    s += p * w_one(j);
    if (kDw) dw[j] += p * inv;
  }
  if (!kDx) return;
  // pass 2 (the row is in L1): dx = inv * dy * w - coef * x for j < k, inv * dy * w after
  const float coef = inv * inv * inv * s / float(k);
  const vec16 cv = splat(coef);
  j = 0;
  for (; j + kLanes <= k; j += kLanes) {
    store(dxr + j, iv * dy_at(j) * w_at(j) - cv * load(xr + j));
  }
  for (; j < k; ++j) dxr[j] = inv * dy_one(j) * w_one(j) - coef * xr[j];
  for (; j + kLanes <= d; j += kLanes) store(dxr + j, iv * dy_at(j) * w_at(j));
  for (; j < d; ++j) dxr[j] = inv * dy_one(j) * w_one(j);
}

template <bool kScalarDy, bool kWeight, bool kDw, bool kDx>
void backward_rows_f32(const float* dy, int64_t dy_row_stride, const float* x, const float* w,
                       const float* inv_rms, float* dx, float* dw_parts, int64_t tasks,
                       int64_t rows, int64_t d, int64_t k) {
  at::parallel_for(0, tasks, 1, [&](int64_t task_begin, int64_t task_end) {
    for (int64_t t = task_begin; t < task_end; ++t) {
      float* dw = kDw ? dw_parts + t * d : nullptr;
      if (kDx) {  // this task's rows of dx
        const int64_t r0 = rows * t / tasks, r1 = rows * (t + 1) / tasks;
        touch(dx + r0 * d, (r1 - r0) * d);
      }
      for (int64_t r = rows * t / tasks; r < rows * (t + 1) / tasks; ++r) {
        backward_row_f32<kScalarDy, kWeight, kDw, kDx>(dy + r * dy_row_stride, x + r * d, w,
                                                       inv_rms[r], dw,
                                                       kDx ? dx + r * d : nullptr, d, k);
      }
    }
  });
}

template <bool kScalarDy, bool kWeight>
void backward_f32_dispatch(bool need_dw, bool need_dx, const float* dy, int64_t dy_row_stride,
                           const float* x, const float* w, const float* inv_rms, float* dx,
                           float* dw_parts, int64_t tasks, int64_t rows, int64_t d, int64_t k) {
#define NORMLAB_RMS_BWD(DW, DX)                                                                \
  backward_rows_f32<kScalarDy, kWeight, DW, DX>(dy, dy_row_stride, x, w, inv_rms, dx, dw_parts, \
                                                tasks, rows, d, k)
  if (need_dw && need_dx) {
    NORMLAB_RMS_BWD(true, true);
  } else if (need_dw) {
    NORMLAB_RMS_BWD(true, false);
  } else if (need_dx) {
    NORMLAB_RMS_BWD(false, true);
  }
#undef NORMLAB_RMS_BWD
}

// ------------------------------------------------------------------ other dtypes: plain loops

template <typename T>
void forward_rows(const T* x, const T* w, T* y, at::opmath_type<T>* inv_rms, int64_t rows,
                  int64_t d, int64_t k, double eps) {
  using acc_t = at::opmath_type<T>;
  at::parallel_for(0, rows, grain(d), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* xr = x + r * d;
      T* yr = y + r * d;
      acc_t sum_sq = 0;
#pragma omp simd reduction(+ : sum_sq)
      for (int64_t j = 0; j < k; ++j) sum_sq += acc_t(xr[j]) * acc_t(xr[j]);
      const acc_t inv = acc_t(1) / std::sqrt(sum_sq / acc_t(k) + acc_t(eps));
      inv_rms[r] = inv;
      if (w != nullptr) {
#pragma omp simd
        for (int64_t j = 0; j < d; ++j) yr[j] = T(acc_t(xr[j]) * inv * acc_t(w[j]));
      } else {
#pragma omp simd
        for (int64_t j = 0; j < d; ++j) yr[j] = T(acc_t(xr[j]) * inv);
      }
    }
  });
}

// dy: rows of d contiguous values, dy_row_stride apart; kScalarDy: one value per row
template <typename T, bool kScalarDy>
void backward_rows(const T* dy, int64_t dy_row_stride, const T* x, const T* w,
                   const at::opmath_type<T>* inv_rms, T* dx, at::opmath_type<T>* dw_parts,
                   int64_t tasks, int64_t rows, int64_t d, int64_t k) {
  using acc_t = at::opmath_type<T>;
  at::parallel_for(0, tasks, 1, [&](int64_t task_begin, int64_t task_end) {
    for (int64_t t = task_begin; t < task_end; ++t) {
      acc_t* dw = dw_parts != nullptr ? dw_parts + t * d : nullptr;
      for (int64_t r = rows * t / tasks; r < rows * (t + 1) / tasks; ++r) {
        const T* dyr = dy + r * dy_row_stride;
        const T* xr = x + r * d;
        const acc_t inv = inv_rms[r];
        const acc_t c = kScalarDy ? acc_t(dyr[0]) : acc_t(0);
        acc_t s = 0;  // sum over the row of dy * w * x; with it dw += dy * x * inv
#pragma omp simd reduction(+ : s)
        for (int64_t j = 0; j < d; ++j) {
          const acc_t p = (kScalarDy ? c : acc_t(dyr[j])) * acc_t(xr[j]);
          s += w != nullptr ? p * acc_t(w[j]) : p;
          if (dw != nullptr) dw[j] += p * inv;
        }
        if (dx == nullptr) continue;
        T* dxr = dx + r * d;
        const acc_t coef = inv * inv * inv * s / acc_t(k);
#pragma omp simd
        for (int64_t j = 0; j < d; ++j) {
          const acc_t dyj = kScalarDy ? c : acc_t(dyr[j]);
          const acc_t dyw = w != nullptr ? dyj * acc_t(w[j]) : dyj;
          dxr[j] = T(inv * dyw - (j < k ? coef * acc_t(xr[j]) : acc_t(0)));
        }
      }
    }
  });
}

// ------------------------------------------------------------------ ops

void check_rows(const at::Tensor& x, const std::optional<at::Tensor>& weight, int64_t k) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous(), "rms: x must be a contiguous (R, D) tensor");
  TORCH_CHECK(k >= 1 && k <= x.size(1), "rms: k must be in [1, D], got ", k);
  if (weight.has_value()) {
    TORCH_CHECK(weight->is_contiguous() && weight->numel() == x.size(1) &&
                    weight->scalar_type() == x.scalar_type(),
                "rms: weight must be a contiguous (D,) tensor of x's dtype");
  }
}

// (y, inv_rms): inv_rms is (R, 1) in the accumulation dtype (float for half/bfloat16)
std::tuple<at::Tensor, at::Tensor> rms_forward(const at::Tensor& x,
                                               const std::optional<at::Tensor>& weight, double eps,
                                               int64_t k) {
  check_rows(x, weight, k);
  const int64_t rows = x.size(0), d = x.size(1);
  at::Tensor y = fresh_output(x);
  at::Tensor inv_rms = at::empty({rows, 1}, x.options().dtype(at::toOpMathType(x.scalar_type())));
  if (x.scalar_type() == at::kFloat) {
    const float* w = weight.has_value() ? weight->const_data_ptr<float>() : nullptr;
    forward_rows_f32(x.const_data_ptr<float>(), w, y.mutable_data_ptr<float>(),
                     inv_rms.mutable_data_ptr<float>(), rows, d, k, eps);
    return {y, inv_rms};
  }
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "rms_forward", [&] {
    const scalar_t* w = weight.has_value() ? weight->const_data_ptr<scalar_t>() : nullptr;
    forward_rows<scalar_t>(x.const_data_ptr<scalar_t>(), w, y.mutable_data_ptr<scalar_t>(),
                           inv_rms.mutable_data_ptr<at::opmath_type<scalar_t>>(), rows, d, k, eps);
  });
  return {y, inv_rms};
}

// (dx, dw); an output not asked for is an empty tensor
std::tuple<at::Tensor, at::Tensor> rms_backward(const at::Tensor& dy_in, const at::Tensor& x,
                                                const std::optional<at::Tensor>& weight,
                                                const at::Tensor& inv_rms, int64_t k, bool need_dx,
                                                bool need_dw) {
  check_rows(x, weight, k);
  const int64_t rows = x.size(0), d = x.size(1);
  TORCH_CHECK(dy_in.sizes() == x.sizes(), "rms: dy and x must have the same shape");
  TORCH_CHECK(dy_in.scalar_type() == x.scalar_type(), "rms: dy must have x's dtype");
  TORCH_CHECK(inv_rms.is_contiguous() && inv_rms.numel() == rows, "rms: inv_rms must be (R, 1)");
  // dy read in place when each row is contiguous (any row stride, 0 included) or one value
  // repeated (column stride 0); otherwise a contiguous copy
  const bool scalar_rows = d > 1 && dy_in.stride(1) == 0;
  const bool in_place = scalar_rows || d == 1 || dy_in.stride(1) == 1;
  const at::Tensor dy = in_place ? dy_in : dy_in.contiguous();
  const int64_t dy_row_stride = rows > 1 ? dy.stride(0) : d;
  need_dw = need_dw && weight.has_value();
  at::Tensor dx = need_dx ? fresh_output(x) : at::empty({0}, x.options());
  const int64_t tasks = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), rows));
  const auto acc_type = at::toOpMathType(x.scalar_type());
  at::Tensor dw_parts =
      need_dw ? at::zeros({tasks, d}, x.options().dtype(acc_type)) : at::empty({0}, x.options());
  if (x.scalar_type() == at::kFloat && (need_dx || need_dw)) {
    const float* w = weight.has_value() ? weight->const_data_ptr<float>() : nullptr;
    auto run = [&](auto scalar_dy, auto has_weight) {
      backward_f32_dispatch<decltype(scalar_dy)::value, decltype(has_weight)::value>(
          need_dw, need_dx, dy.const_data_ptr<float>(), dy_row_stride, x.const_data_ptr<float>(),
          w, inv_rms.const_data_ptr<float>(), need_dx ? dx.mutable_data_ptr<float>() : nullptr,
          need_dw ? dw_parts.mutable_data_ptr<float>() : nullptr, tasks, rows, d, k);
    };
    using yes = std::true_type;
    using no = std::false_type;
    if (scalar_rows) {
      w != nullptr ? run(yes{}, yes{}) : run(yes{}, no{});
    } else {
      w != nullptr ? run(no{}, yes{}) : run(no{}, no{});
    }
  } else if (need_dx || need_dw) {
    AT_DISPATCH_FLOATING_TYPES_AND2(
        at::kBFloat16, at::kHalf, x.scalar_type(), "rms_backward", [&] {
          using acc_t = at::opmath_type<scalar_t>;
          const scalar_t* w = weight.has_value() ? weight->const_data_ptr<scalar_t>() : nullptr;
          auto run = [&](auto scalar_dy) {
            backward_rows<scalar_t, decltype(scalar_dy)::value>(
                dy.const_data_ptr<scalar_t>(), dy_row_stride, x.const_data_ptr<scalar_t>(), w,
                inv_rms.const_data_ptr<acc_t>(),
                need_dx ? dx.mutable_data_ptr<scalar_t>() : nullptr,
                need_dw ? dw_parts.mutable_data_ptr<acc_t>() : nullptr, tasks, rows, d, k);
          };
          scalar_rows ? run(std::true_type{}) : run(std::false_type{});
        });
  }
  at::Tensor dw = need_dw ? dw_parts.sum(0).to(x.scalar_type()) : at::empty({0}, x.options());
  return {dx, dw};
}

}  // namespace

TORCH_LIBRARY(normlab_rms, m) {
  m.def("forward(Tensor x, Tensor? weight, float eps, int k) -> (Tensor, Tensor)");
  m.def(
      "backward(Tensor dy, Tensor x, Tensor? weight, Tensor inv_rms, int k, bool need_dx, "
      "bool need_dw) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(normlab_rms, CPU, m) {
  m.impl("forward", &rms_forward);
  m.impl("backward", &rms_backward);
}
