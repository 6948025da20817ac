// The deltaserve executable as a user runs it: make-model, generate, score,
// and its errors on bad input (exit code non-zero, message naming the problem).
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"
#include "runtime/model/config.h"
#include "runtime/model/safetensors.h"
#include "runtime/model/weight_spec.h"
#include "tests/test_util.h"

namespace deltaserve {
namespace {

namespace fs = std::filesystem;

std::string Deltaserve() { return testing::BinPath("deltaserve"); }

class CliGoldenTest : public ::testing::TestWithParam<std::string> {};

TEST_P(CliGoldenTest, ScoreWritesGoldenLogits) {
  const testing::GoldenLogits golden = testing::LoadGoldenLogits(GetParam());
  const std::string dir = testing::TempDir("score");
  for (const char* chunk : {"0", "64", "7"}) {
    const std::string out = dir + "/logits_" + chunk + ".safetensors";
    std::string output;
    const int rc = testing::RunCommand(
        absl::StrCat(Deltaserve(), " score --model ", testing::GoldenPath("model/" + GetParam()),
                     " --tokens ", absl::StrJoin(golden.tokens, ","), " --prefill-chunk ", chunk,
                     " --logits-out ", out),
        &output);
    ASSERT_EQ(rc, 0) << output;
    auto file = SafetensorsFile::Open(out);
    ASSERT_TRUE(file.ok()) << file.status();
    auto view = (*file)->Get("logits");
    ASSERT_TRUE(view.ok()) << view.status();
    EXPECT_EQ((*view)->dtype, DType::kF32);
    EXPECT_EQ((*view)->shape,
              (std::vector<int64_t>{static_cast<int64_t>(golden.tokens.size()), 256}));
    EXPECT_LE(testing::RelL2(*ToFloat32(**view), golden.logits), 1e-4) << "chunk " << chunk;
  }
}

TEST_P(CliGoldenTest, GreedyGenerateFollowsGoldenArgmax) {
  // The first generated token after a prompt prefix is the argmax of the
  // golden logits at the prefix's last position.
  const testing::GoldenLogits golden = testing::LoadGoldenLogits(GetParam());
  const int64_t V = 256;
  int checked = 0;
  for (int64_t t : {5, 40, 99, 149}) {
    const double* row = golden.logits.data() + t * V;
    int64_t best = 0, second = -1;
    for (int64_t i = 1; i < V; ++i) {
      if (row[i] > row[best]) {
        second = best;
        best = i;
      } else if (second < 0 || row[i] > row[second])
        second = i;
    }
    if (row[best] - row[second] <= 1e-3) continue;
    std::vector<int64_t> prefix(golden.tokens.begin(), golden.tokens.begin() + t + 1);
    std::string output;
    const int rc =
        testing::RunCommand(absl::StrCat(Deltaserve(), " generate --ids --max-tokens 3 --model ",
                                         testing::GoldenPath("model/" + GetParam()), " --tokens ",
                                         absl::StrJoin(prefix, ","), " 2>/dev/null"),
                            &output);
    ASSERT_EQ(rc, 0) << output;
    EXPECT_EQ(output.substr(0, output.find(' ')), std::to_string(best)) << output;
    ++checked;
  }
  EXPECT_GT(checked, 0);
}

INSTANTIATE_TEST_SUITE_P(Golden, CliGoldenTest, ::testing::ValuesIn(testing::kGoldenModels),
                         testing::GoldenTestName);
INSTANTIATE_TEST_SUITE_P(GoldenEps, CliGoldenTest, ::testing::ValuesIn(testing::kEpsGoldenModels),
                         testing::GoldenTestName);

TEST(CliTest, MakeModelThenGenerateStreamsWithTimings) {
  const std::string dir = testing::TempDir("make_model");
  for (const char* preset : {"k3-tiny", "kimi-linear-tiny"}) {
    const std::string model = dir + "/" + preset;
    std::string output;
    ASSERT_EQ(testing::RunCommand(absl::StrCat(Deltaserve(), " make-model --preset ", preset,
                                               " --out ", model, " --seed 3"),
                                  &output),
              0)
        << output;
    ASSERT_EQ(testing::RunCommand(absl::StrCat(Deltaserve(), " generate --model ", model,
                                               " --prompt 'hello' --max-tokens 8 --temperature 0.7 "
                                               "--top-k 40 --top-p 0.9 --seed 5"),
                                  &output),
              0)
        << output;
    EXPECT_NE(output.find("time to first token"), std::string::npos) << output;
    EXPECT_NE(output.find("tokens/s"), std::string::npos) << output;
    // Same seed, same tokens.
    std::string a, b;
    const std::string cmd =
        absl::StrCat(Deltaserve(), " generate --ids --model ", model,
                     " --tokens 1,2,3 --max-tokens 6 --temperature 1.0 --seed 9 2>/dev/null");
    ASSERT_EQ(testing::RunCommand(cmd, &a), 0);
    ASSERT_EQ(testing::RunCommand(cmd, &b), 0);
    EXPECT_EQ(a, b);
    EXPECT_EQ(std::count(a.begin(), a.end(), ' '), 5) << a;
  }
}

TEST(CliTest, MakeModelFromConfigFileAndScoreFromTokensFile) {
  // Any shape through --config: the golden K3 config with wider KDA heads and
  // a different block size, then score from a tokens file.
  const std::string dir = testing::TempDir("config_model");
  std::string text;
  {
    std::ifstream in(testing::GoldenPath("model/k3-tiny/config.json"));
    text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  auto replace = [&](const std::string& from, const std::string& to) {
    const size_t at = text.find(from);
    ASSERT_NE(at, std::string::npos) << from;
    text.replace(at, from.size(), to);
  };
  replace("\"head_dim\": 8", "\"head_dim\": 16");
  replace("\"attn_res_block_size\": 4", "\"attn_res_block_size\": 3");
  std::ofstream(dir + "/config.json") << text;
  std::string output;
  ASSERT_EQ(testing::RunCommand(absl::StrCat(Deltaserve(), " make-model --config ", dir,
                                             "/config.json --out ", dir, "/model"),
                                &output),
            0)
      << output;
  std::ofstream(dir + "/tokens.txt") << "5 6 7\n8, 9\n";
  ASSERT_EQ(testing::RunCommand(
                absl::StrCat(Deltaserve(), " score --model ", dir, "/model --tokens-file ", dir,
                             "/tokens.txt --logits-out ", dir, "/out.safetensors"),
                &output),
            0)
      << output;
  auto file = SafetensorsFile::Open(dir + "/out.safetensors");
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((**(*file)->Get("logits")).shape, (std::vector<int64_t>{5, 256}));
  EXPECT_EQ(*ToInt64(**(*file)->Get("tokens")), (std::vector<int64_t>{5, 6, 7, 8, 9}));
  // The new shape really is in the checkpoint.
  auto config = SafetensorsFile::Open(dir + "/model/model.safetensors");
  ASSERT_TRUE(config.ok());
  auto view = (*config)->Get("language_model.model.layers.0.self_attn.q_proj.weight");
  ASSERT_TRUE(view.ok());
  EXPECT_EQ((*view)->shape, (std::vector<int64_t>{64, 64}));
}

// Runs a command that must fail; returns its output.
std::string ExpectFailure(const std::string& args) {
  std::string output;
  const int rc = testing::RunCommand(Deltaserve() + " " + args, &output);
  EXPECT_NE(rc, 0) << output;
  EXPECT_LT(rc, 128) << "crashed: " << output;
  return output;
}

std::string ReadText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// Every tensor of a file: name -> (dtype, shape).
std::map<std::string, std::pair<DType, std::vector<int64_t>>> Tensors(const std::string& dir) {
  std::map<std::string, std::pair<DType, std::vector<int64_t>>> out;
  auto file = SafetensorsFile::Open(dir + "/model.safetensors");
  EXPECT_TRUE(file.ok()) << file.status();
  if (!file.ok()) return out;
  for (const auto& [name, view] : (*file)->tensors()) out[name] = {view.dtype, view.shape};
  return out;
}

TEST(CliTest, MakeModelMxfp4ExpertsAsTheGoldenCheckpoint) {
  const std::string golden = testing::GoldenPath("model/k3-tiny-mxfp4");
  const std::string dir = testing::TempDir("make_mxfp4");
  std::string output;
  ASSERT_EQ(testing::RunCommand(
                absl::StrCat(Deltaserve(), " make-model --config ", golden,
                             "/config.json --experts mxfp4 --seed 2 --out ", dir, "/mxfp4"),
                &output),
            0)
      << output;
  EXPECT_NE(output.find("mxfp4 routed experts"), std::string::npos) << output;
  // The golden layout: tensors, config.json with its quantization_config.
  EXPECT_EQ(Tensors(dir + "/mxfp4"), Tensors(golden));
  EXPECT_EQ(nlohmann::json::parse(ReadText(dir + "/mxfp4/config.json")),
            nlohmann::json::parse(ReadText(golden + "/config.json")));
  auto config = LoadModelConfig(dir + "/mxfp4");
  ASSERT_TRUE(config.ok()) << config.status();
  auto checkpoint = Checkpoint::Open(dir + "/mxfp4");
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  EXPECT_TRUE(ValidateCheckpoint(*config, **checkpoint).ok());

  // bf16 by default, even from a config that declares MXFP4: plain experts,
  // no quantization_config.
  ASSERT_EQ(testing::RunCommand(absl::StrCat(Deltaserve(), " make-model --config ", golden,
                                             "/config.json --out ", dir, "/bf16"),
                                &output),
            0)
      << output;
  EXPECT_NE(output.find("bf16 routed experts"), std::string::npos) << output;
  const auto bf16 = Tensors(dir + "/bf16");
  const std::string expert = "language_model.model.layers.1.block_sparse_moe.experts.0.w2.weight";
  ASSERT_TRUE(bf16.count(expert)) << expert;
  EXPECT_EQ(bf16.at(expert).first, DType::kBF16);
  EXPECT_FALSE(bf16.count(expert + "_packed"));
  EXPECT_FALSE(nlohmann::json::parse(ReadText(dir + "/bf16/config.json"))["text_config"].contains(
      "quantization_config"));

  // What cannot be MXFP4 is refused, and nothing is written.
  const std::string refused =
      ExpectFailure("make-model --preset k3-tiny --experts mxfp4 --out " + dir + "/tiny");
  EXPECT_NE(refused.find("moe_intermediate_size is 24"), std::string::npos) << refused;
  EXPECT_FALSE(fs::exists(dir + "/tiny"));
  const std::string unknown =
      ExpectFailure("make-model --preset k3-tiny --experts fp8 --out " + dir + "/fp8");
  EXPECT_NE(unknown.find("--experts"), std::string::npos) << unknown;
  EXPECT_NE(unknown.find("'fp8'"), std::string::npos) << unknown;
  // --help says so.
  ASSERT_EQ(testing::RunCommand(Deltaserve() + " make-model --help", &output), 0) << output;
  EXPECT_NE(output.find("--experts"), std::string::npos) << output;
  EXPECT_NE(output.find("mxfp4"), std::string::npos) << output;
}

// Checks the golden MXFP4 checkpoint against a config that does not declare
// it: generate fails naming the tensor and the missing quantization_config.
TEST(CliTest, Mxfp4CheckpointWithoutQuantizationConfigIsRefused) {
  const std::string golden = testing::GoldenPath("model/k3-tiny-mxfp4");
  const std::string dir = testing::TempDir("mxfp4_no_config");
  fs::copy_file(golden + "/model.safetensors", dir + "/model.safetensors");
  nlohmann::json config = nlohmann::json::parse(ReadText(golden + "/config.json"));
  config["text_config"].erase("quantization_config");
  std::ofstream(dir + "/config.json") << config.dump(2);
  const std::string output = ExpectFailure("generate --model " + dir + " --tokens 1,2");
  EXPECT_NE(output.find("experts.0.w1.weight_packed"), std::string::npos) << output;
  EXPECT_NE(output.find("no quantization_config"), std::string::npos) << output;
}

TEST(CliTest, BadInputGivesClearErrors) {
  const std::string golden = testing::GoldenPath("model/k3-tiny");
  const std::string dir = testing::TempDir("cli_errors");

  EXPECT_NE(ExpectFailure("score --model " + golden + " --tokens 1,2,256 --logits-out " + dir +
                          "/x.safetensors")
                .find("token id 256 at position 2"),
            std::string::npos);
  EXPECT_NE(ExpectFailure("generate --model " + golden + " --tokens 1,-3").find("token id -3"),
            std::string::npos);
  EXPECT_NE(ExpectFailure("generate --model " + golden + " --tokens 1,x").find("'x'"),
            std::string::npos);
  EXPECT_NE(ExpectFailure("generate --model " + golden + " --prompt hi --bogus 1")
                .find("unknown flag --bogus"),
            std::string::npos);
  EXPECT_NE(ExpectFailure("generate --model " + dir + "/nowhere --prompt hi").find("nowhere"),
            std::string::npos);
  EXPECT_NE(ExpectFailure("generate --model " + golden + " --prompt hi --top-p 0").find("--top-p"),
            std::string::npos);

  // A generation whose MLA cache cannot fit the pool is refused before it
  // starts, naming the pages; one that fits runs. 70 tokens + 60 to generate
  // need 3 pages of 64; --kv-cache-tokens 128 holds 2.
  std::string ids = "1";
  for (int i = 1; i < 70; ++i) ids += ",2";
  EXPECT_NE(ExpectFailure("generate --model " + golden + " --ids --tokens " + ids +
                          " --max-tokens 60 --kv-cache-tokens 128")
                .find("needs 3 MLA cache pages of 64 tokens for its prompt and max_tokens, more "
                      "than the replica's 2 (--kv-cache-tokens)"),
            std::string::npos);
  {
    std::string output;
    EXPECT_EQ(testing::RunCommand(absl::StrCat(Deltaserve(), " generate --model ", golden,
                                               " --ids --ignore-eos --tokens ", ids,
                                               " --max-tokens 50 --kv-cache-tokens 128"),
                                  &output),
              0)
        << output;
  }
  EXPECT_NE(ExpectFailure("generate --model " + golden + " --prompt hi --kv-cache-tokens -1")
                .find("--kv-cache-tokens is -1; it must be >= 0"),
            std::string::npos);
  EXPECT_NE(ExpectFailure("generate --model " + golden + " --prompt hi --kv-state-slots 1")
                .find("--kv-state-slots is 1; it must be >= 2"),
            std::string::npos);

  // A truncated checkpoint names the file.
  const std::string truncated = dir + "/truncated";
  fs::create_directories(truncated);
  fs::copy_file(golden + "/config.json", truncated + "/config.json");
  {
    std::ifstream in(golden + "/model.safetensors", std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::ofstream(truncated + "/model.safetensors", std::ios::binary)
        << bytes.substr(0, bytes.size() / 2);
  }
  EXPECT_NE(ExpectFailure("generate --model " + truncated + " --prompt hi")
                .find(truncated + "/model.safetensors"),
            std::string::npos);

  // A config missing a required K3 key names the key.
  const std::string no_key = dir + "/no_key";
  fs::create_directories(no_key);
  fs::copy_file(golden + "/model.safetensors", no_key + "/model.safetensors");
  {
    std::ifstream in(golden + "/config.json");
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const size_t at = text.find("\"attn_res_block_size\"");
    ASSERT_NE(at, std::string::npos);
    text.replace(at, std::string("\"attn_res_block_size\"").size(), "\"renamed_key\"");
    std::ofstream(no_key + "/config.json") << text;
  }
  EXPECT_NE(
      ExpectFailure("generate --model " + no_key + " --prompt hi").find("attn_res_block_size"),
      std::string::npos);
}

// --prompt-file is --prompt from a file, for generate and score alike; the
// four prompt flags are one choice, and an empty or missing file is named.
TEST(CliTest, PromptFileIsThePromptsText) {
  const std::string golden = testing::GoldenPath("model/k3-tiny");
  const std::string dir = testing::TempDir("prompt_file");
  const std::string text = "a \"quoted\" prompt, with commas, 1 2 3";
  std::ofstream(dir + "/prompt.txt") << text;
  const auto run = [](const std::string& args) {
    std::string output;
    EXPECT_EQ(testing::RunCommand(Deltaserve() + " " + args + " 2>/dev/null", &output), 0)
        << args << ": " << output;
    return output;
  };
  const std::string generate = "generate --model " + golden + " --ids --max-tokens 6 ";
  EXPECT_EQ(run(generate + "--prompt-file " + dir + "/prompt.txt"),
            run(generate + "--prompt '" + text + "'"));
  const std::string score = "score --model " + golden + " --top-k 3 ";
  run(score + "--prompt-file " + dir + "/prompt.txt --logprobs-out " + dir + "/a.safetensors");
  run(score + "--prompt '" + text + "' --logprobs-out " + dir + "/b.safetensors");
  EXPECT_EQ(ReadText(dir + "/a.safetensors"), ReadText(dir + "/b.safetensors"));
  EXPECT_GT(ReadText(dir + "/a.safetensors").size(), text.size() * 4);

  std::ofstream(dir + "/empty.txt").flush();
  EXPECT_NE(ExpectFailure(generate + "--prompt-file " + dir + "/empty.txt")
                .find(dir + "/empty.txt: is empty"),
            std::string::npos);
  EXPECT_NE(ExpectFailure(generate + "--prompt-file " + dir + "/none.txt").find(dir + "/none.txt"),
            std::string::npos);
  EXPECT_NE(ExpectFailure(generate + "--prompt x --prompt-file " + dir + "/prompt.txt")
                .find("give exactly one of --prompt, --prompt-file, --tokens, --tokens-file"),
            std::string::npos);
  EXPECT_NE(ExpectFailure(score + "--logprobs-out " + dir + "/c.safetensors")
                .find("give exactly one of --prompt, --prompt-file, --tokens, --tokens-file"),
            std::string::npos);
}

// The server's output files: --step-log and --port-file refuse a FIFO (which
// an ofstream would block on, waiting for a reader) and a symbolic link
// (which it would write through), naming the path and what it is, and leave
// them as they were. `timeout` turns a hang into a failure.
TEST(CliTest, ServerOutputFilesAreNeverLinksOrFifos) {
  const std::string golden = testing::GoldenPath("model/k3-tiny");
  const std::string dir = testing::TempDir("cli_server_outputs");
  const std::string victim = dir + "/victim", link = dir + "/link", fifo = dir + "/fifo";
  std::ofstream(victim) << "precious";
  std::filesystem::create_symlink(victim, link);
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const std::string serve = "timeout 60 " + Deltaserve() + " serve --model " + golden + " --port 0";
  for (const auto& [flags, message] : std::vector<std::pair<std::string, std::string>>{
           {" --step-log " + fifo, "--step-log: " + fifo + ": is a FIFO, not a regular file"},
           {" --step-log " + link, "--step-log: " + link + ": is a symbolic link"},
           {" --port-file " + link, link + ": is a symbolic link, not a regular file"},
           {" --port-file " + fifo, fifo + ": is a FIFO, not a regular file"},
       }) {
    std::string output;
    const int rc = testing::RunCommand(serve + flags, &output);
    EXPECT_NE(rc, 0) << flags << "\n" << output;
    EXPECT_NE(rc, 124) << flags << ": hung\n" << output;
    EXPECT_NE(output.find(message), std::string::npos) << flags << "\n" << output;
  }
  EXPECT_EQ(ReadText(victim), "precious");
  EXPECT_TRUE(std::filesystem::is_symlink(link));
  EXPECT_TRUE(std::filesystem::is_fifo(fifo));
}

}  // namespace
}  // namespace deltaserve
