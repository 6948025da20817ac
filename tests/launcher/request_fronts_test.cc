// One bad request, sent through each front end: a gRPC GenerateRequest, an
// OpenAI API body and a `deltaserve batch` line, each mapped onto the
// request model by its own reader and checked by the one validator, must
// be refused with the same error. Where the fronts name the prompt
// differently (`prompt`, batch's `tokens` and `text`) the error after the
// name is the same.
#include <gtest/gtest.h>

#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <variant>

#include "launcher/batch_request.h"
#include "runtime/model/presets.h"
#include "runtime/serving/grpc_request.h"
#include "runtime/serving/openai_api.h"
#include "runtime/serving/request_validation.h"

namespace deltaserve {
namespace {

constexpr int64_t kFixtureVocab = 1024;  // the tokenizer fixture: 676 ranks + 256 special, padded

struct Fronts {
  Fronts() {
    auto preset = PresetConfig("k3-tiny");
    EXPECT_TRUE(preset.ok()) << preset.status();
    config = *preset;
    config.vocab_size = kFixtureVocab;
    config.max_position_embeddings = 1000;
    const std::string dir = std::string(DELTASERVE_SOURCE_DIR) + "/tests/data/tokenizer-k3";
    auto tokenizer_or = LoadTokenizer(dir, kFixtureVocab);
    EXPECT_TRUE(tokenizer_or.ok()) << tokenizer_or.status();
    tokenizer = std::move(*tokenizer_or);
    auto chat_or = LoadChatFormat(dir);
    EXPECT_TRUE(chat_or.ok()) << chat_or.status();
    chat = std::move(*chat_or);
    validator =
        std::make_unique<RequestValidator>(config, tokenizer.get(), RequestLimits{}, chat.get());
    batch = std::make_unique<BatchModel>(config, tokenizer.get(), chat.get());
  }

  std::string Grpc(const v1::GenerateRequest& req) const {
    auto valid = validator->Generate(FromProto(req));
    return valid.ok() ? "" : std::string(valid.status().message());
  }
  std::string Http(OpenAiEndpoint endpoint, const std::string& body) const {
    auto parsed = ParseOpenAiRequest(endpoint, body, 1, 1 << 20);
    if (!parsed.ok()) return std::string(parsed.status().message());
    auto valid = validator->Generate(parsed->input);
    return valid.ok() ? "" : std::string(valid.status().message());
  }
  std::string Batch(const std::string& line) const {
    auto parsed = ParseBatchLine(line, 1);
    if (auto* error = std::get_if<BatchLineError>(&parsed)) return error->message;
    const std::vector<BatchUnit> units = UnitsOf(std::get<BatchRequest>(parsed), batch.get());
    EXPECT_EQ(units.size(), 1u);
    return units.empty() ? "no unit" : units[0].error;
  }

  ModelConfig config;
  std::unique_ptr<Tokenizer> tokenizer;
  std::unique_ptr<ChatFormat> chat;
  std::unique_ptr<RequestValidator> validator;
  std::unique_ptr<BatchModel> batch;
};

// The error after the field's name ("prompt[1]: ..." -> "[1]: ...").
std::string AfterName(const std::string& message, const std::string& name) {
  if (message.rfind(name, 0) != 0) return "(not about " + name + ") " + message;
  return message.substr(name.size());
}

struct Case {
  std::string what;
  std::function<void(v1::GenerateRequest*)> grpc;  // on a request with tokens [1, 2]
  std::string json;                                // the same fields as JSON, after the prompt
  std::string error;                               // what each front says
};

TEST(RequestFrontsTest, TheSameBadParameterGetsTheSameErrorFromEachFront) {
  const Fronts f;
  std::string seventeen = "[";
  for (int i = 0; i < 17; ++i) seventeen += i == 0 ? "\"s\"" : ", \"s\"";
  seventeen += "]";
  const std::vector<Case> cases = {
      {"temperature", [](v1::GenerateRequest* r) { r->mutable_sampling()->set_temperature(-1); },
       R"("temperature": -1)", "temperature: -1: must be a finite number >= 0"},
      {"top_p", [](v1::GenerateRequest* r) { r->mutable_sampling()->set_top_p(1.5); },
       R"("top_p": 1.5)", "top_p: 1.5: must be in (0, 1]"},
      {"top_k", [](v1::GenerateRequest* r) { r->mutable_sampling()->set_top_k(-3); },
       R"("top_k": -3)", "top_k: -3: must be in [0, 2147483647]"},
      {"max_tokens < 0", [](v1::GenerateRequest* r) { r->set_max_tokens(-1); },
       R"("max_tokens": -1)", "max_tokens: -1: must be >= 0"},
      {"max_tokens past the context", [](v1::GenerateRequest* r) { r->set_max_tokens(999); },
       R"("max_tokens": 999)", "max_tokens: 2 prompt tokens + 999 exceed the context of 1000"},
      {"stop, too many",
       [](v1::GenerateRequest* r) {
         for (int i = 0; i < 17; ++i) r->add_stop("s");
       },
       R"("stop": )" + seventeen, "stop: 17 strings, over the limit of 16"},
      {"stop, empty",
       [](v1::GenerateRequest* r) {
         r->add_stop("a");
         r->add_stop("");
       },
       R"("stop": ["a", ""])", "stop[1]: empty"},
      {"stop_token_ids",
       [](v1::GenerateRequest* r) {
         r->add_stop_token_ids(3);
         r->add_stop_token_ids(5000);
       },
       R"("stop_token_ids": [3, 5000])",
       "stop_token_ids[1]: 5000 is outside the vocabulary [0, 1024)"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    v1::GenerateRequest req;
    req.mutable_tokens()->add_ids(1);
    req.mutable_tokens()->add_ids(2);
    c.grpc(&req);
    EXPECT_EQ(f.Grpc(req), c.error);
    EXPECT_EQ(
        f.Http(OpenAiEndpoint::kCompletions, R"({"model": "m", "prompt": [1, 2], )" + c.json + "}"),
        c.error);
    EXPECT_EQ(f.Batch(R"({"id": 1, "tokens": [1, 2], )" + c.json + "}"), c.error);
  }
}

TEST(RequestFrontsTest, TheSameBadPromptGetsTheSameErrorUnderEachFrontsName) {
  const Fronts f;
  std::string long_ids = "[1";
  for (int i = 1; i < 1001; ++i) long_ids += ", 1";
  long_ids += "]";
  const struct {
    std::string what;
    bool text;                // the prompt as text (a JSON string), else token ids
    std::string json_prompt;  // as JSON
    std::string error;        // after the prompt's name
  } cases[] = {
      {"an id outside the vocabulary", false, "[1, 5000]",
       "[1]: 5000 is outside the vocabulary [0, 1024)"},
      {"past the context", false, long_ids, ": 1001 tokens, longer than the context of 1000"},
      {"empty text", true, R"("")", ": empty"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.what);
    const nlohmann::json prompt = nlohmann::json::parse(c.json_prompt);
    v1::GenerateRequest req;
    if (c.text) {
      req.set_text(prompt.get<std::string>());
    } else {
      for (const auto& id : prompt) req.mutable_tokens()->add_ids(id.get<int32_t>());
    }
    EXPECT_EQ(AfterName(f.Grpc(req), "prompt"), c.error);
    EXPECT_EQ(AfterName(f.Http(OpenAiEndpoint::kCompletions,
                               R"({"model": "m", "prompt": )" + c.json_prompt + "}"),
                        "prompt"),
              c.error);
    const std::string field = c.text ? "text" : "tokens";
    EXPECT_EQ(AfterName(f.Batch(R"({"id": 1, ")" + field + R"(": )" + c.json_prompt + "}"), field),
              c.error);
  }
}

TEST(RequestFrontsTest, TheSameBadConversationGetsTheSameErrorFromEachFront) {
  const Fronts f;
  const struct {
    std::string what, messages_json;
    std::function<void(v1::Chat*)> grpc;
  } cases[] = {
      {"no messages", "[]", [](v1::Chat*) {}},
      {"an unknown role",
       R"([{"role": "user", "content": "a"}, {"role": "robot", "content": "b"}])",
       [](v1::Chat* c) {
         auto* m = c->add_messages();
         m->set_role("user");
         m->set_content("a");
         m = c->add_messages();
         m->set_role("robot");
         m->set_content("b");
       }},
      {"a tool call without a name",
       R"([{"role": "user", "content": "a"}, {"role": "assistant", "content": "",
           "tool_calls": [{"type": "function", "id": "c1",
                           "function": {"name": "", "arguments": "{}"}}]}])",
       [](v1::Chat* c) {
         auto* m = c->add_messages();
         m->set_role("user");
         m->set_content("a");
         m = c->add_messages();
         m->set_role("assistant");
         auto* call = m->add_tool_calls();
         call->set_id("c1");
         call->set_arguments("{}");
       }},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.what);
    v1::GenerateRequest req;
    c.grpc(req.mutable_chat());
    const std::string grpc = f.Grpc(req);
    EXPECT_FALSE(grpc.empty());
    EXPECT_EQ(
        f.Http(OpenAiEndpoint::kChat, R"({"model": "m", "messages": )" + c.messages_json + "}"),
        grpc);
    EXPECT_EQ(f.Batch(R"({"id": 1, "messages": )" + c.messages_json + "}"), grpc);
  }
}

}  // namespace
}  // namespace deltaserve
