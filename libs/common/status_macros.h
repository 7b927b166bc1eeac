#pragma once

// Abseil 20220623 ships no status macros; these are Shoal's.

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define SHOAL_STATUS_CONCAT_INNER_(a, b) a##b
#define SHOAL_STATUS_CONCAT_(a, b) SHOAL_STATUS_CONCAT_INNER_(a, b)

// Returns the status from the enclosing function when `expr` is not OK.
#define SHOAL_RETURN_IF_ERROR(expr)                \
  do {                                             \
    ::absl::Status shoal_status_ = (expr);         \
    if (!shoal_status_.ok()) return shoal_status_; \
  } while (0)

// `SHOAL_ASSIGN_OR_RETURN(auto x, MakeX());` declares x from an OK StatusOr, or returns its
// status from the enclosing function.
#define SHOAL_ASSIGN_OR_RETURN(lhs, expr) \
  SHOAL_ASSIGN_OR_RETURN_IMPL_(SHOAL_STATUS_CONCAT_(shoal_statusor_, __LINE__), lhs, expr)

#define SHOAL_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, expr)  \
  auto statusor = (expr);                                  \
  if (!statusor.ok()) return std::move(statusor).status(); \
  lhs = *std::move(statusor)
