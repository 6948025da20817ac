// build/bin/deltaserve as MPI jobs across test hosts (tests/multihost/
// test_hosts.h: network namespaces with their own hostnames, TCP between
// them): pipeline stages on different hosts, tensor-parallel ranks inside a
// host, score the golden prompt as one process does, and the stage
// boundary's bytes cross the hosts' links.
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/model/config.h"
#include "runtime/model/safetensors.h"
#include "tests/multihost/test_hosts.h"
#include "tests/test_util.h"

namespace deltaserve {
namespace {

std::vector<float> ReadLogits(const std::string& path) {
  auto file = SafetensorsFile::Open(path);
  EXPECT_TRUE(file.ok()) << file.status();
  if (!file.ok()) return {};
  auto view = (*file)->Get("logits");
  EXPECT_TRUE(view.ok()) << view.status();
  return view.ok() ? *ToFloat32(**view) : std::vector<float>{};
}

std::vector<int> FirstHosts(int n) {
  std::vector<int> hosts;
  for (int i = 0; i < n; ++i) hosts.push_back(i);
  return hosts;
}

class MultihostTest : public ::testing::TestWithParam<std::string> {};

TEST_P(MultihostTest, StagesOnSeparateHostsScoreAsOneProcess) {
  const std::string model = testing::GoldenPath("model/" + GetParam());
  const std::string dir = testing::TempDir("multihost_score");
  const testing::GoldenLogits golden = testing::LoadGoldenLogits(GetParam());
  const std::string tokens = dir + "/tokens.txt";
  std::ofstream(tokens) << absl::StrJoin(golden.tokens, " ");
  const std::string score =
      absl::StrCat(testing::BinPath("deltaserve"), " score --threads 1 --model ", model,
                   " --tokens-file ", tokens, " --logits-out ");
  std::string log;
  ASSERT_EQ(testing::RunCommand(score + dir + "/one.safetensors 2>&1", &log), 0) << log;
  const std::vector<float> single = ReadLogits(dir + "/one.safetensors");
  const double float32_error = testing::RelL2(single, golden.logits);
  const std::vector<double> reference = testing::ToDouble(single);
  auto config = LoadModelConfig(model);
  ASSERT_TRUE(config.ok()) << config.status();

  testing::TestHosts hosts(4);
  ASSERT_EQ(hosts.size(), 4);
  const struct { int hosts, per_host, pp, tp; } layouts[] = {{2, 2, 2, 2}, {4, 1, 4, 1}};
  for (const auto& l : layouts) {
    SCOPED_TRACE(absl::StrCat("PP", l.pp, " x TP", l.tp, " over ", l.hosts, " hosts"));
    std::vector<int64_t> sent_before;
    for (int i = 0; i < l.hosts; ++i) sent_before.push_back(hosts.SentBytes(i));
    const std::string out = absl::StrCat(dir, "/pp", l.pp, "tp", l.tp, ".safetensors");
    // Ranks fill the hosts in order, `per_host` each: a stage's TP ranks on
    // one host, each stage on a host of its own.
    const std::string job =
        absl::StrCat("mpirun ", hosts.MpirunFlags(FirstHosts(l.hosts), l.per_host), " ", score, out,
                     " --pp ", l.pp, " --tp ", l.tp);
    ASSERT_EQ(testing::RunCommand("timeout 120 " + hosts.On(0, job) + " 2>&1", &log), 0) << log;
    const double err = testing::RelL2(ReadLogits(out), reference);
    std::printf("%s PP%d x TP%d over %d hosts: relative L2 %.3g (single process vs float64 %.3g)\n",
                GetParam().c_str(), l.pp, l.tp, l.hosts, err, float32_error);
    // As tests/launcher/distributed_mpi_test.cc bounds the same layouts on
    // one host: stages alone run the very same arithmetic; TP sums its
    // partials in another order.
    EXPECT_LE(err, l.tp == 1 ? 1e-5 : std::max(1e-5, 2 * float32_error));
    // Every host but the last sent a stage boundary's activations on, over
    // its link: at least a float32 row of the hidden state per prompt token.
    const int64_t boundary = static_cast<int64_t>(golden.tokens.size()) * config->hidden_size * 4;
    for (int i = 0; i + 1 < l.hosts; ++i) {
      EXPECT_GE(hosts.SentBytes(i) - sent_before[i], boundary) << "host " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Golden, MultihostTest, ::testing::ValuesIn(testing::kGoldenModels),
                         testing::GoldenTestName);

}  // namespace
}  // namespace deltaserve
