// The few status helpers Debian's abseil (20220623) lacks: early return on an
// error Status and on an error StatusOr.
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define DELTASERVE_CONCAT_INNER_(a, b) a##b
#define DELTASERVE_CONCAT_(a, b) DELTASERVE_CONCAT_INNER_(a, b)

// Returns the Status of `expr` from the enclosing function if it is not OK.
#define DELTASERVE_RETURN_IF_ERROR(expr)                     \
  do {                                                       \
    ::absl::Status deltaserve_status_ = (expr);              \
    if (!deltaserve_status_.ok()) return deltaserve_status_; \
  } while (0)

// `lhs = value of expr`, or returns its error Status. lhs may declare a
// variable: DELTASERVE_ASSIGN_OR_RETURN(auto file, OpenFile(path));
#define DELTASERVE_ASSIGN_OR_RETURN(lhs, expr) \
  DELTASERVE_ASSIGN_OR_RETURN_IMPL_(DELTASERVE_CONCAT_(deltaserve_or_, __LINE__), lhs, expr)
#define DELTASERVE_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                      \
  if (!tmp.ok()) return std::move(tmp).status();          \
  lhs = std::move(tmp).value()
