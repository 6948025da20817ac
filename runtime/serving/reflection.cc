#include "runtime/serving/reflection.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/descriptor.pb.h>
#include <grpcpp/impl/server_builder_plugin.h>
#include <grpcpp/impl/server_initializer.h>

#include <mutex>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "grpc/reflection/v1/reflection.grpc.pb.h"

namespace deltaserve {
namespace {

namespace refl = grpc::reflection::v1;
using google::protobuf::DescriptorPool;
using google::protobuf::FileDescriptor;

class ReflectionService final : public refl::ServerReflection::Service {
 public:
  // The server's services; set once it is built, before it takes calls.
  void SetServices(std::vector<std::string> services) {
    std::lock_guard<std::mutex> lock(mu_);
    services_ = std::move(services);
  }

  grpc::Status ServerReflectionInfo(
      grpc::ServerContext* context,
      grpc::ServerReaderWriter<refl::ServerReflectionResponse, refl::ServerReflectionRequest>*
          stream) override {
    std::unordered_set<std::string> sent;  // files this stream has had
    refl::ServerReflectionRequest request;
    while (!context->IsCancelled() && stream->Read(&request)) {
      refl::ServerReflectionResponse response;
      response.set_valid_host(request.host());
      *response.mutable_original_request() = request;
      const grpc::Status status = Answer(request, sent, response);
      if (!status.ok()) {
        response.mutable_error_response()->set_error_code(status.error_code());
        response.mutable_error_response()->set_error_message(status.error_message());
      }
      if (!stream->Write(response)) break;
    }
    return grpc::Status::OK;
  }

 private:
  grpc::Status Answer(const refl::ServerReflectionRequest& request,
                      std::unordered_set<std::string>& sent,
                      refl::ServerReflectionResponse& response) const {
    const DescriptorPool& pool = *DescriptorPool::generated_pool();
    switch (request.message_request_case()) {
      case refl::ServerReflectionRequest::kListServices: {
        std::lock_guard<std::mutex> lock(mu_);
        for (const std::string& name : services_) {
          response.mutable_list_services_response()->add_service()->set_name(name);
        }
        return grpc::Status::OK;
      }
      case refl::ServerReflectionRequest::kFileByFilename:
        return SendFile(pool.FindFileByName(request.file_by_filename()),
                        absl::StrCat("no file ", request.file_by_filename()), sent, response);
      case refl::ServerReflectionRequest::kFileContainingSymbol:
        return SendFile(pool.FindFileContainingSymbol(request.file_containing_symbol()),
                        absl::StrCat("no symbol ", request.file_containing_symbol()), sent,
                        response);
      case refl::ServerReflectionRequest::kFileContainingExtension: {
        const auto& ask = request.file_containing_extension();
        const auto* type = pool.FindMessageTypeByName(ask.containing_type());
        const auto* extension =
            type == nullptr ? nullptr : pool.FindExtensionByNumber(type, ask.extension_number());
        return SendFile(
            extension == nullptr ? nullptr : extension->file(),
            absl::StrCat("no extension ", ask.extension_number(), " of ", ask.containing_type()),
            sent, response);
      }
      case refl::ServerReflectionRequest::kAllExtensionNumbersOfType: {
        const auto* type = pool.FindMessageTypeByName(request.all_extension_numbers_of_type());
        if (type == nullptr) {
          return grpc::Status(grpc::StatusCode::NOT_FOUND,
                              absl::StrCat("no type ", request.all_extension_numbers_of_type()));
        }
        std::vector<const google::protobuf::FieldDescriptor*> extensions;
        pool.FindAllExtensions(type, &extensions);
        auto* numbers = response.mutable_all_extension_numbers_response();
        numbers->set_base_type_name(type->full_name());
        for (const auto* extension : extensions) numbers->add_extension_number(extension->number());
        return grpc::Status::OK;
      }
      case refl::ServerReflectionRequest::MESSAGE_REQUEST_NOT_SET:
        break;
    }
    return grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "the request asks for nothing known");
  }

  // `file` and then, depth first, each file it imports that this stream has
  // not been sent yet (a client builds its pool from them in one pass).
  static grpc::Status SendFile(const FileDescriptor* file, const std::string& missing,
                               std::unordered_set<std::string>& sent,
                               refl::ServerReflectionResponse& response) {
    if (file == nullptr) return grpc::Status(grpc::StatusCode::NOT_FOUND, missing);
    auto* files = response.mutable_file_descriptor_response();
    std::vector<const FileDescriptor*> pending = {file};
    while (!pending.empty()) {
      const FileDescriptor* next = pending.back();
      pending.pop_back();
      if (!sent.insert(next->name()).second) continue;
      google::protobuf::FileDescriptorProto proto;
      next->CopyTo(&proto);
      proto.SerializeToString(files->add_file_descriptor_proto());
      for (int i = next->dependency_count() - 1; i >= 0; --i) {
        pending.push_back(next->dependency(i));
      }
    }
    return grpc::Status::OK;
  }

  mutable std::mutex mu_;
  std::vector<std::string> services_;
};

// Registers the service when the server is made and gives it the server's
// service list once every service, the health service too, is on it.
class ReflectionPlugin final : public grpc::ServerBuilderPlugin {
 public:
  std::string name() override { return "deltaserve_reflection_v1"; }
  void InitServer(grpc::ServerInitializer* si) override { si->RegisterService(service_); }
  void Finish(grpc::ServerInitializer* si) override {
    service_->SetServices(*si->GetServiceList());
  }
  void ChangeArguments(const std::string&, void*) override {}
  bool has_sync_methods() const override { return true; }

 private:
  std::shared_ptr<ReflectionService> service_ = std::make_shared<ReflectionService>();
};

class ReflectionOption final : public grpc::ServerBuilderOption {
 public:
  void UpdateArguments(grpc::ChannelArguments*) override {}
  void UpdatePlugins(std::vector<std::unique_ptr<grpc::ServerBuilderPlugin>>* plugins) override {
    plugins->push_back(std::make_unique<ReflectionPlugin>());
  }
};

}  // namespace

std::unique_ptr<grpc::ServerBuilderOption> ReflectionV1Option() {
  return std::make_unique<ReflectionOption>();
}

}  // namespace deltaserve
