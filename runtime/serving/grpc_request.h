// The Generation API's messages as the one request model (request.h): what
// the gRPC service hands the validator. The proto's `prompt` (or `input`)
// oneof becomes a PromptInput; the sampling message's fields sit flat.
#pragma once

#include "deltaserve/v1/generation.pb.h"
#include "runtime/serving/request.h"

namespace deltaserve {

GenerateInput FromProto(const v1::GenerateRequest& req);
ScoreInput FromProto(const v1::ScoreRequest& req);

}  // namespace deltaserve
