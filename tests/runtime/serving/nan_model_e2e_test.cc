// A model whose logits are NaN (a corrupt checkpoint) behind a real
// `deltaserve serve`: every request ends with an error naming the sequence and
// the token position, at every sampling setting and for Score, and the server
// stays up: health, status and the next requests are answered the same way.
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/model_runs.h"
#include "tests/runtime/serving/serving_test_util.h"

namespace deltaserve {
namespace {

struct Setting {
  const char* name;
  float temperature;
  int32_t top_k;
  float top_p;  // 0: unset
  bool logprobs;
  int32_t top_logprobs;
};

TEST(NanModelTest, EveryRequestEndsWithTheErrorAndTheServerKeepsServing) {
  auto server = testing::StartServer("serve --model " + testing::NanModel("k3-tiny"));
  ASSERT_NE(server.stub, nullptr);
  const Setting settings[] = {
      {"greedy", 0.0f, 0, 0.0f, false, 0},
      {"greedy with logprobs", 0.0f, 0, 0.0f, true, 5},
      {"temperature", 0.8f, 0, 0.0f, false, 0},
      {"top-k", 1.0f, 20, 0.0f, false, 0},
      {"top-p", 0.7f, 0, 0.9f, false, 0},
      {"top-k and top-p with logprobs", 1.2f, 40, 0.5f, true, 3},
  };
  // Twice over: the second round shows the first left the server whole.
  for (int round = 0; round < 2; ++round) {
    for (const Setting& s : settings) {
      SCOPED_TRACE(absl::StrCat(s.name, ", round ", round));
      const std::vector<int32_t> prompt = testing::RandomTokens(17, 5 + round);
      v1::GenerateRequest req = testing::TokensRequest(prompt, 8);
      req.mutable_sampling()->set_temperature(s.temperature);
      req.mutable_sampling()->set_top_k(s.top_k);
      if (s.top_p > 0) req.mutable_sampling()->set_top_p(s.top_p);
      req.mutable_sampling()->set_seed(3);
      req.set_logprobs(s.logprobs);
      req.set_top_logprobs(s.top_logprobs);
      const testing::Streamed out = testing::GenerateAll(*server.stub, req, 60);
      EXPECT_FALSE(out.status.ok());
      EXPECT_TRUE(out.ids.empty()) << "a token came from NaN logits";
      // The prompt's last position (16) is where the first token's logits are.
      EXPECT_NE(out.status.error_message().find("not finite at token position 16"),
                std::string::npos)
          << out.status.error_message();
      EXPECT_NE(out.status.error_message().find("sequence "), std::string::npos)
          << out.status.error_message();
      EXPECT_EQ(testing::Probe("health " + server.address), "SERVING\n");
    }
    v1::ScoreRequest score;
    score.mutable_tokens()->mutable_ids()->Add(5);
    score.mutable_tokens()->mutable_ids()->Add(6);
    score.mutable_tokens()->mutable_ids()->Add(7);
    grpc::ClientContext context;
    v1::ScoreResponse response;
    const grpc::Status status = server.stub->Score(&context, score, &response);
    EXPECT_FALSE(status.ok());
    EXPECT_NE(status.error_message().find("not finite at token position 0"), std::string::npos)
        << status.error_message();
    EXPECT_EQ(response.logprobs_size(), 0);
  }
  // Still up: status answers, and nothing is left running.
  EXPECT_TRUE(testing::WaitForStatus(
      *server.stub,
      [](const v1::ServerStatus& st) {
        return st.running_sequences() == 0 && st.waiting_requests() == 0;
      },
      std::chrono::seconds(10)));
  EXPECT_EQ(server.process->Wait(std::chrono::milliseconds(0)), std::nullopt)
      << server.process->Log();
}

}  // namespace
}  // namespace deltaserve
