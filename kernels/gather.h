// Row gather and scatter with the conversions of kernels/convert.h, for a
// paged cache: reading a sequence's rows out of the pages they sit in (and
// widening them), and writing new rows into their pages (and narrowing them).
//
// Both take f32 or bf16 on either side, converted as Convert does, at any row
// stride (RowStride() >= cols), and an I32 [1, n] list of row indices. src and
// dst must not overlap each other or the indices.
#pragma once

#include "kernels/tensor.h"

namespace deltaserve::kernels {

// dst row i = src row rows[i], for src [R, cols], rows [1, n], dst [n, cols].
// Every index must lie in [0, R): a bad index is a broken invariant of the
// caller's page table, and aborts naming it. Indices may repeat.
void GatherRows(const Tensor& src, const Tensor& rows, const MutableTensor& dst);

// dst row rows[i] = src row i, for src [n, cols], rows [1, n], dst [R, cols];
// the other rows of dst are left as they are. Every index must lie in
// [0, R) (checked, as above) and, the caller's contract, not checked: the
// indices are distinct (rows are written in parallel; a repeated index leaves
// that row's contents unspecified).
void ScatterRows(const Tensor& src, const Tensor& rows, const MutableTensor& dst);

}  // namespace deltaserve::kernels
