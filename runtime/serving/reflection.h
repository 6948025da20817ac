// Server reflection, in both versions generic clients speak
// (grpc.reflection.v1.ServerReflection, which grpcurl, Postman and newer gRPC
// libraries ask first, and grpc.reflection.v1alpha.ServerReflection, the
// older one), from one service: the same answers from the same sources, the
// services the server was built with and the descriptors compiled into
// this binary.
//
// Reflection needs no credentials, so its streams hold no thread (gRPC's
// callback API, as the health service does; gRPC's own v1alpha plugin held
// a thread per stream for as long as the stream lasted) and are bounded:
// at most `max_streams` open at once (a new one past it gets
// RESOURCE_EXHAUSTED), and a stream whose client sends no request, or takes
// no answer, for `idle_timeout` is cancelled.
#pragma once

#include <grpcpp/server_builder.h>

#include <chrono>
#include <memory>

namespace deltaserve {

struct ReflectionLimits {
  int max_streams = 256;
  std::chrono::milliseconds idle_timeout{10000};
};

// An option for a grpc::ServerBuilder that adds both reflection services to
// the server it builds. They list every service of that server, themselves
// and the health service included.
std::unique_ptr<grpc::ServerBuilderOption> ReflectionOption(const ReflectionLimits& limits = {});

}  // namespace deltaserve
