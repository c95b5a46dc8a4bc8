// Fused RMSNorm for CPU tensors, loaded by normlab/norms/_fused_rms.py.
//
// Rows (R, D), the rms from the first k features of each row:
//   inv_rms = 1 / sqrt(mean(x[:k]^2) + eps),  y = x * inv_rms * w
// Backward, with s = sum_j dy_j * w_j * x_j over the whole row:
//   dx_i = inv_rms * dy_i * w_i - [i < k] * x_i * inv_rms^3 * s / k,   dw = sum_rows dy * x * inv_rms
// Each row is read once from memory and written once (the second pass over a row hits the
// cache); dw is summed in one partial row per task, added up at the end.

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <tuple>

namespace {

// rows per parallel task: about 16k elements, so small inputs are not split into tiny tasks
int64_t grain(int64_t d) { return std::max<int64_t>(1, 16384 / std::max<int64_t>(d, 1)); }

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

template <typename T>
void backward_rows(const T* dy, const T* x, const T* w, const at::opmath_type<T>* inv_rms, T* dx,
                   at::opmath_type<T>* dw_parts, int64_t tasks, int64_t rows, int64_t d,
                   int64_t k) {
  using acc_t = at::opmath_type<T>;
  at::parallel_for(0, tasks, 1, [&](int64_t task_begin, int64_t task_end) {
    for (int64_t t = task_begin; t < task_end; ++t) {
      acc_t* dw = dw_parts != nullptr ? dw_parts + t * d : nullptr;
      for (int64_t r = rows * t / tasks; r < rows * (t + 1) / tasks; ++r) {
        const T* dyr = dy + r * d;
        const T* xr = x + r * d;
        const acc_t inv = inv_rms[r];
        acc_t s = 0;  // sum over the row of dy * w * x
        if (w != nullptr) {
#pragma omp simd reduction(+ : s)
          for (int64_t j = 0; j < d; ++j) s += acc_t(dyr[j]) * acc_t(w[j]) * acc_t(xr[j]);
        } else {
#pragma omp simd reduction(+ : s)
          for (int64_t j = 0; j < d; ++j) s += acc_t(dyr[j]) * acc_t(xr[j]);
        }
        if (dw != nullptr) {
#pragma omp simd
          for (int64_t j = 0; j < d; ++j) dw[j] += acc_t(dyr[j]) * acc_t(xr[j]) * inv;
        }
        if (dx == nullptr) continue;
        T* dxr = dx + r * d;
        const acc_t coef = inv * inv * inv * s / acc_t(k);
#pragma omp simd
        for (int64_t j = 0; j < d; ++j) {
          const acc_t dyw = w != nullptr ? acc_t(dyr[j]) * acc_t(w[j]) : acc_t(dyr[j]);
          dxr[j] = T(inv * dyw - (j < k ? coef * acc_t(xr[j]) : acc_t(0)));
        }
      }
    }
  });
}

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
  at::Tensor y = at::empty_like(x);
  at::Tensor inv_rms = at::empty({rows, 1}, x.options().dtype(at::toOpMathType(x.scalar_type())));
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
  const at::Tensor dy = dy_in.contiguous();
  const int64_t rows = x.size(0), d = x.size(1);
  TORCH_CHECK(dy.sizes() == x.sizes(), "rms: dy and x must have the same shape");
  TORCH_CHECK(inv_rms.is_contiguous() && inv_rms.numel() == rows, "rms: inv_rms must be (R, 1)");
  need_dw = need_dw && weight.has_value();
  at::Tensor dx = need_dx ? at::empty_like(x) : at::empty({0}, x.options());
  const int64_t tasks = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), rows));
  const auto acc_type = at::toOpMathType(x.scalar_type());
  at::Tensor dw_parts =
      need_dw ? at::zeros({tasks, d}, x.options().dtype(acc_type)) : at::empty({0}, x.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "rms_backward", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const scalar_t* w = weight.has_value() ? weight->const_data_ptr<scalar_t>() : nullptr;
    backward_rows<scalar_t>(dy.const_data_ptr<scalar_t>(), x.const_data_ptr<scalar_t>(), w,
                            inv_rms.const_data_ptr<acc_t>(),
                            need_dx ? dx.mutable_data_ptr<scalar_t>() : nullptr,
                            need_dw ? dw_parts.mutable_data_ptr<acc_t>() : nullptr, tasks, rows, d,
                            k);
  });
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
