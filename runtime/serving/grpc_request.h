// The Generation API's messages as the one request model (request.h): what
// the gRPC service hands the validator. The proto's `prompt` (or `input`)
// oneof becomes a PromptInput (a Chat a conversation); the sampling
// message's fields sit flat. And a chat's parsed reply, back.
#pragma once

#include "deltaserve/v1/generation.pb.h"
#include "runtime/serving/request.h"

namespace deltaserve {

GenerateInput FromProto(const v1::GenerateRequest& req);
ScoreInput FromProto(const v1::ScoreRequest& req);
// What a client sends. A number past the proto's int32 field is held at its
// range's end (refused by the server as out of range); temperature and
// top_p go as float32.
v1::GenerateRequest ToProto(const GenerateInput& in);
v1::ScoreRequest ToProto(const ScoreInput& in);
void ToProto(const ChatRequest& chat, v1::Chat* out);  // what a client sends
void ToProto(const ChatReply& reply, v1::ChatReply* out);
ChatReply FromProto(const v1::ChatReply& reply);  // what a client reads

}  // namespace deltaserve
