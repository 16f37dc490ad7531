// Argument checks shared by every op. Each failure throws flashgla::Error
// naming the argument and what was expected.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>

#include "core/errors.h"  // check::fail, FLASHGLA_REQUIRE
#include "flashgla/error.h"
#include "flashgla/tensor.h"

namespace flashgla::check {

// A present tensor of `ndim` dimensions, with sane strides and a data pointer.
// `dims` names the dimensions for messages, e.g. "[B, T, H, K]". Outputs must
// also not overlap themselves (two indices writing one element).
void tensor(const TensorView& t, const std::string& name, int ndim, const char* dims, bool is_output = false);

// tensor() plus an exact shape.
void shape(const TensorView& t, const std::string& name, std::initializer_list<int64_t> expected, const char* dims,
           bool is_output = false);

void dtype(const TensorView& t, const std::string& name, DType expected);
void floating(const TensorView& t, const std::string& name);  // f64, f32, bf16 or f16
void device(const TensorView& t, const std::string& name, const Device& expected, const std::string& reference);

// cu_seqlens: 1-D i32/i64 of length ≥ 2 on `dev`; when its values are readable
// on the host (a CPU tensor, or the host copy), they start at 0, never
// decrease and end at `total`. Returns the number of sequences N. `reference`
// names the tensor whose device `dev` is, for messages.
int64_t cu_seqlens(const TensorView& t, const std::string& name, const Device& dev, int64_t total,
                   const TensorView& host_copy = {}, const char* reference = "q");

std::string shape_of(std::initializer_list<int64_t> dims);

}  // namespace flashgla::check
