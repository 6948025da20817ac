// The one place steps, results and hellos cross between the plain values of
// runtime/engine/step.h (and WorkerInfo) and the protobuf messages of the
// worker link (proto/deltaserve/v1/worker.proto).
#pragma once

#include "absl/status/statusor.h"
#include "deltaserve/v1/worker.pb.h"
#include "runtime/comm/world_layout.h"
#include "runtime/engine/step.h"
#include "runtime/model/config.h"
#include "runtime/serving/coordinator.h"

namespace deltaserve {

void StepToProto(const Step& step, v1::StepPlan* plan);
// The output kinds the link carries (not kLogits); InvalidArgument otherwise.
absl::StatusOr<Step> StepFromProto(const v1::StepPlan& plan);

void ResultToProto(const StepResult& result, v1::StepResult* proto);
StepResult ResultFromProto(const v1::StepResult& proto);

v1::WorkerHello MakeWorkerHello(const ModelConfig& config, const WorldLayout& layout,
                                const std::string& description, StatePoolSize state = {0, 0},
                                StateUnitBytes unit = {});
WorkerInfo InfoFromHello(const v1::WorkerHello& hello);

}  // namespace deltaserve
