#include "runtime/serving/reflection.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/descriptor.pb.h>
#include <grpcpp/impl/server_builder_plugin.h>
#include <grpcpp/impl/server_initializer.h>

#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "grpc/reflection/v1/reflection.grpc.pb.h"
#include "grpc/reflection/v1alpha/reflection.grpc.pb.h"
#include "runtime/serving/write_watchdog.h"

namespace deltaserve {
namespace {

namespace refl = grpc::reflection::v1;
namespace refl_alpha = grpc::reflection::v1alpha;
using google::protobuf::DescriptorPool;
using google::protobuf::FileDescriptor;

// A name a client asked for, as an answer repeats it: escaped, and cut
// short (a name may be as long as a message).
std::string Shown(const std::string& name) {
  constexpr size_t kMax = 256;
  std::string shown = absl::CHexEscape(absl::string_view(name).substr(0, kMax));
  if (name.size() > kMax) absl::StrAppend(&shown, "... (", name.size(), " bytes)");
  return shown;
}

// What both versions share: the server's services, the answers, and the
// streams' slots and idle watch.
class Reflection {
 public:
  explicit Reflection(const ReflectionLimits& limits)
      : max_streams_(limits.max_streams), watchdog_(limits.idle_timeout) {}

  // The server's services; set once it is built, before it takes calls.
  void SetServices(std::vector<std::string> services) {
    std::lock_guard<std::mutex> lock(mu_);
    services_ = std::move(services);
  }

  // A slot for a new stream: false when max_streams are open.
  bool TakeStream() {
    std::lock_guard<std::mutex> lock(mu_);
    if (open_streams_ >= max_streams_) return false;
    ++open_streams_;
    return true;
  }
  void ReleaseStream() {
    std::lock_guard<std::mutex> lock(mu_);
    --open_streams_;
  }
  int max_streams() const { return max_streams_; }
  WriteWatchdog& watchdog() { return watchdog_; }

  template <typename Request, typename Response>
  grpc::Status Answer(const Request& request, std::unordered_set<std::string>& sent,
                      Response& response) const {
    const DescriptorPool& pool = *DescriptorPool::generated_pool();
    switch (request.message_request_case()) {
      case Request::kListServices: {
        std::lock_guard<std::mutex> lock(mu_);
        for (const std::string& name : services_) {
          response.mutable_list_services_response()->add_service()->set_name(name);
        }
        return grpc::Status::OK;
      }
      case Request::kFileByFilename:
        return SendFile(pool.FindFileByName(request.file_by_filename()),
                        absl::StrCat("no file ", Shown(request.file_by_filename())), sent,
                        response);
      case Request::kFileContainingSymbol:
        return SendFile(pool.FindFileContainingSymbol(request.file_containing_symbol()),
                        absl::StrCat("no symbol ", Shown(request.file_containing_symbol())), sent,
                        response);
      case Request::kFileContainingExtension: {
        const auto& ask = request.file_containing_extension();
        const auto* type = pool.FindMessageTypeByName(ask.containing_type());
        const auto* extension =
            type == nullptr ? nullptr : pool.FindExtensionByNumber(type, ask.extension_number());
        return SendFile(extension == nullptr ? nullptr : extension->file(),
                        absl::StrCat("no extension ", ask.extension_number(), " of ",
                                     Shown(ask.containing_type())),
                        sent, response);
      }
      case Request::kAllExtensionNumbersOfType: {
        const auto* type = pool.FindMessageTypeByName(request.all_extension_numbers_of_type());
        if (type == nullptr) {
          return grpc::Status(
              grpc::StatusCode::NOT_FOUND,
              absl::StrCat("no type ", Shown(request.all_extension_numbers_of_type())));
        }
        std::vector<const google::protobuf::FieldDescriptor*> extensions;
        pool.FindAllExtensions(type, &extensions);
        auto* numbers = response.mutable_all_extension_numbers_response();
        numbers->set_base_type_name(type->full_name());
        for (const auto* extension : extensions) numbers->add_extension_number(extension->number());
        return grpc::Status::OK;
      }
      case Request::MESSAGE_REQUEST_NOT_SET:
        break;
    }
    return grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "the request asks for nothing known");
  }

  // `file` and then, depth first, each file it imports that this stream has
  // not been sent yet (a client builds its pool from them in one pass).
  template <typename Response>
  static grpc::Status SendFile(const FileDescriptor* file, const std::string& missing,
                               std::unordered_set<std::string>& sent, Response& response) {
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

 private:
  const int max_streams_;
  WriteWatchdog watchdog_;  // cancels a stream idle past the timeout
  mutable std::mutex mu_;
  std::vector<std::string> services_;  // guarded by mu_
  int open_streams_ = 0;               // guarded by mu_
};

// One stream of either version: a request read, its answer written, in
// turn, each under a watch that cancels the stream if it does not complete
// within the idle timeout (the read or write then fails, and the stream
// finishes). Deletes itself once gRPC is done with it.
template <typename Request, typename Response>
class ReflectionStream final : public grpc::ServerBidiReactor<Request, Response> {
 public:
  ReflectionStream(grpc::CallbackServerContext* context, Reflection& reflection)
      : context_(*context), reflection_(reflection), slot_(reflection.TakeStream()) {
    if (!slot_) {
      this->Finish(
          grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                       absl::StrCat("the server has ", reflection.max_streams(),
                                    " reflection streams open, its most; try again later")));
      return;
    }
    Read();
  }

  void OnReadDone(bool ok) override {
    watch_.reset();
    if (!ok) {  // the client has no more, went away, or was idle too long
      this->Finish(grpc::Status::OK);
      return;
    }
    response_.Clear();
    response_.set_valid_host(request_.host());
    *response_.mutable_original_request() = request_;
    const grpc::Status status = reflection_.Answer(request_, sent_, response_);
    if (!status.ok()) {
      response_.mutable_error_response()->set_error_code(status.error_code());
      response_.mutable_error_response()->set_error_message(status.error_message());
    }
    watch_.emplace(reflection_.watchdog(), context_);
    this->StartWrite(&response_);
  }

  void OnWriteDone(bool ok) override {
    watch_.reset();
    if (!ok) {
      this->Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the answer was not taken"));
      return;
    }
    Read();
  }

  void OnDone() override {
    watch_.reset();
    if (slot_) reflection_.ReleaseStream();
    delete this;
  }

 private:
  void Read() {
    watch_.emplace(reflection_.watchdog(), context_);
    this->StartRead(&request_);
  }

  grpc::CallbackServerContext& context_;
  Reflection& reflection_;
  const bool slot_;
  Request request_;
  Response response_;
  std::unordered_set<std::string> sent_;  // files this stream has had
  std::optional<WriteWatchdog::Watch> watch_;
};

// The service of one version (`Version` is its generated namespace's
// ServerReflection).
template <typename Version, typename Request, typename Response>
class ReflectionService final : public Version::CallbackService {
 public:
  explicit ReflectionService(std::shared_ptr<Reflection> reflection)
      : reflection_(std::move(reflection)) {}
  grpc::ServerBidiReactor<Request, Response>* ServerReflectionInfo(
      grpc::CallbackServerContext* context) override {
    return new ReflectionStream<Request, Response>(context, *reflection_);
  }

 private:
  // Shared by both versions' services, which the server holds as long as
  // it runs (the plugin goes with the builder), and so outlives every
  // stream.
  const std::shared_ptr<Reflection> reflection_;
};

using ServiceV1 = ReflectionService<refl::ServerReflection, refl::ServerReflectionRequest,
                                    refl::ServerReflectionResponse>;
using ServiceV1Alpha =
    ReflectionService<refl_alpha::ServerReflection, refl_alpha::ServerReflectionRequest,
                      refl_alpha::ServerReflectionResponse>;

// Registers the services when the server is made and gives them the
// server's service list once every service, the health service too, is on
// it.
class ReflectionPlugin final : public grpc::ServerBuilderPlugin {
 public:
  explicit ReflectionPlugin(const ReflectionLimits& limits)
      : reflection_(std::make_shared<Reflection>(limits)) {}
  std::string name() override { return "deltaserve_reflection"; }
  void InitServer(grpc::ServerInitializer* si) override {
    si->RegisterService(v1alpha_);
    si->RegisterService(v1_);
  }
  void Finish(grpc::ServerInitializer* si) override {
    reflection_->SetServices(*si->GetServiceList());
  }
  void ChangeArguments(const std::string&, void*) override {}

 private:
  const std::shared_ptr<Reflection> reflection_;
  std::shared_ptr<ServiceV1Alpha> v1alpha_ = std::make_shared<ServiceV1Alpha>(reflection_);
  std::shared_ptr<ServiceV1> v1_ = std::make_shared<ServiceV1>(reflection_);
};

class ReflectionBuilderOption final : public grpc::ServerBuilderOption {
 public:
  explicit ReflectionBuilderOption(const ReflectionLimits& limits) : limits_(limits) {}
  void UpdateArguments(grpc::ChannelArguments*) override {}
  void UpdatePlugins(std::vector<std::unique_ptr<grpc::ServerBuilderPlugin>>* plugins) override {
    plugins->push_back(std::make_unique<ReflectionPlugin>(limits_));
  }

 private:
  const ReflectionLimits limits_;
};

}  // namespace

std::unique_ptr<grpc::ServerBuilderOption> ReflectionOption(const ReflectionLimits& limits) {
  return std::make_unique<ReflectionBuilderOption>(limits);
}

}  // namespace deltaserve
