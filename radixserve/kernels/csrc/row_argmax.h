// Greedy sampling inside a matmul: each output row's argmax kept while the results are made,
// so the [rows, vocabulary] logits are never written (gguf_gemm_amx.cpp's LM head for a batch
// that only takes the argmax). Same answer as argmax_rows over the written results: the first
// column of the largest value, the first NaN's column where a row has one, -0.0 equal to 0.0.
//
// Each thread keeps, per row, 16 lanes of (largest value, its column): a tile row of 16 results
// updates them with one compare and two masked moves. A thread meets a row's columns in
// increasing order in every lane, so "strictly greater" keeps a lane's first column; the lanes
// and then the threads are merged largest value first, smallest column on ties.
#pragma once

#if defined(__AVX512F__)
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

namespace radixserve {

class RowArgmax {
 public:
  // Over the first `columns` results of each of `rows` rows, from up to `threads` threads
  // (at::get_thread_num() < threads).
  RowArgmax(int64_t rows, int64_t columns, int threads)
      : rows_(rows),
        columns_(columns),
        threads_(threads),
        value_(static_cast<size_t>(threads * rows * kLanes),
               -std::numeric_limits<float>::infinity()),
        column_(static_cast<size_t>(threads * rows * kLanes), kNone),
        nan_column_(static_cast<size_t>(threads * rows), kNone) {}

  // Results `v` of columns col .. col + 15 of `row` (lanes outside `valid` are not results).
  void add(int64_t row, int64_t col, __m512 v, __mmask16 valid) {
    const int64_t left = columns_ - col;
    if (left <= 0) return;
    if (left < kLanes) valid &= static_cast<__mmask16>((1u << left) - 1);
    const int64_t slot = at::get_thread_num() * rows_ + row;
    const __mmask16 nan = _mm512_mask_cmp_ps_mask(valid, v, v, _CMP_UNORD_Q);
    if (nan != 0) {
      int64_t& first = nan_column_[slot];
      first = std::min<int64_t>(first, col + __builtin_ctz(nan));
      valid &= static_cast<__mmask16>(~nan);
    }
    float* best = value_.data() + slot * kLanes;
    const __m512 held = _mm512_loadu_ps(best);
    const __mmask16 greater = _mm512_mask_cmp_ps_mask(valid, v, held, _CMP_GT_OQ);
    if (greater == 0) return;
    _mm512_storeu_ps(best, _mm512_mask_mov_ps(held, greater, v));
    const __m512i cols = _mm512_add_epi32(_mm512_set1_epi32(static_cast<int32_t>(col)),
                                          _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10,
                                                            11, 12, 13, 14, 15));
    _mm512_mask_storeu_epi32(column_.data() + slot * kLanes, greater, cols);
  }

  // Each row's answer, once every thread is done.
  void finish(int64_t* out) const {
    for (int64_t r = 0; r < rows_; ++r) {
      int64_t nan = kNone, at = kNone;
      float top = -std::numeric_limits<float>::infinity();
      for (int t = 0; t < threads_; ++t) {
        const int64_t slot = t * rows_ + r;
        nan = std::min(nan, nan_column_[slot]);
        for (int lane = 0; lane < kLanes; ++lane) {
          const float v = value_[slot * kLanes + lane];
          const int64_t c = column_[slot * kLanes + lane];
          if (c != kNone && (v > top || (v == top && c < at))) top = v, at = c;
        }
      }
      // No lane ever held more than -inf: every result is -inf (or NaN), the first is the answer.
      out[r] = nan != kNone ? nan : (at == kNone ? 0 : at);
    }
  }

 private:
  static constexpr int kLanes = 16;
  static constexpr int32_t kNone = std::numeric_limits<int32_t>::max();
  int64_t rows_, columns_;
  int threads_;
  std::vector<float> value_;
  std::vector<int32_t> column_;
  std::vector<int64_t> nan_column_;
};

}  // namespace radixserve
#endif
