// Server reflection version 1 (grpc.reflection.v1.ServerReflection) next to
// the v1alpha one gRPC ships: generic clients (grpcurl, Postman, newer gRPC
// libraries) ask v1 first. Both versions answer the same way from the same
// sources: the services the server was built with, and the descriptors
// compiled into this binary.
#pragma once

#include <grpcpp/server_builder.h>

#include <memory>

namespace deltaserve {

// An option for a grpc::ServerBuilder that adds the v1 reflection service to
// the server it builds. It lists every service of that server, itself and
// the health service included, as v1alpha's plugin does.
std::unique_ptr<grpc::ServerBuilderOption> ReflectionV1Option();

}  // namespace deltaserve
