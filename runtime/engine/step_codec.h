// Steps and their outputs as bytes, for the messages between the ranks of a
// replica: the leader sends each step to its ranks, the output rank sends its
// results back. A little-endian length-prefixed layout of the plain values of
// runtime/engine/step.h (no protobuf below runtime/serving). Decoding treats
// the bytes as hostile: every count is checked against the bytes left before
// anything is allocated, and a short, long or garbled message is a DataLoss
// error naming what did not fit, never a crash.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/engine/step.h"

namespace deltaserve {

std::string EncodeStep(const Step& step);
absl::StatusOr<Step> DecodeStep(std::string_view bytes);

std::string EncodeResults(const std::vector<SequenceResult>& results);
absl::StatusOr<std::vector<SequenceResult>> DecodeResults(std::string_view bytes);

}  // namespace deltaserve
