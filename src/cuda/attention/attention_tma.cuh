// TMA tensor maps over [B, T, H, D] tensors for the Hopper attention kernels
// (attention_hopper.cu, attention_hopper_bwd.cu), and over the backward's dq
// accumulator.
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "cuda/attention/attention_params.cuh"

namespace flashgla::cuda::attn {

inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 encoder = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found) !=
            cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      cudaGetLastError();
      return PFN_cuTensorMapEncodeTiled_v12000(nullptr);
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  return encoder;
}

// A 4-D map over a [B, T, H, D] tensor (dims innermost first: D, H, T, B)
// whose box is 64 elements of D (one 128-byte swizzle row) x `rows` tokens.
template <class T>
inline bool make_tensor_map(CUtensorMap& map, const Strided& t, int64_t batch, int64_t tokens, int64_t heads, int64_t dim,
                     int rows) {
  const auto encode = tensor_map_encoder();
  const cuuint64_t dims[4] = {cuuint64_t(dim), cuuint64_t(heads), cuuint64_t(tokens), cuuint64_t(batch)};
  // Byte strides of H, T, B; a dimension of size 1 is never stepped, any valid stride does.
  const int64_t strides_in[3] = {t.head, t.token, t.batch};
  cuuint64_t strides[3];
  for (int i = 0; i < 3; ++i) strides[i] = dims[i + 1] > 1 ? cuuint64_t(strides_in[i]) * sizeof(T) : 16;
  const cuuint32_t box[4] = {64, 1, cuuint32_t(rows), 1};
  const cuuint32_t element_strides[4] = {1, 1, 1, 1};
  const CUtensorMapDataType type =
      std::is_same_v<T, __nv_bfloat16> ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  return encode(&map, type, 4, t.data, dims, strides, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// A 2-D map over the backward's fp32 dq accumulator, [rows][dim] with rows = B · Hq · Tq, whose box is 32
// columns (one 128-byte swizzle row) x 64 rows: half of a warpgroup's staged 64 x 64 dQ block.
inline bool make_dq_accum_map(CUtensorMap& map, float* dq_accum, int64_t rows, int64_t dim) {
  const auto encode = tensor_map_encoder();
  const cuuint64_t dims[2] = {cuuint64_t(dim), cuuint64_t(rows)};
  const cuuint64_t strides[1] = {cuuint64_t(dim) * sizeof(float)};
  const cuuint32_t box[2] = {32, 64};
  const cuuint32_t element_strides[2] = {1, 1};
  return encode(&map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2, dq_accum, dims, strides, box, element_strides,
                CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

}  // namespace flashgla::cuda::attn
