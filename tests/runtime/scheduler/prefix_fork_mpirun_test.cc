// Prefix reuse across ranks: under `mpirun -np 4` as two pipeline stages of
// two tensor-parallel ranks each, a document prefilled once and forked for
// each question gives what document + question gives run fresh on the same
// ranks: the same greedy tokens, the same logits to rounding; and so do
// requests served from the prefix cache, whose hits and evictions the
// leader decides for every rank.
#include <map>
#include <memory>

#include "absl/strings/str_cat.h"
#include "kernels/threads.h"
#include "runtime/comm/mpi_runtime.h"
#include "runtime/comm/rank_communicators.h"
#include "runtime/engine/replica.h"
#include "runtime/scheduler/offline_engine.h"
#include "runtime/scheduler/stage_plan.h"
#include "tests/engine_runs.h"
#include "tests/test_util.h"

namespace deltaserve {
namespace {

// The world's communicators for `layout` (null after an error), made once (every test uses the same
// layout). Adopts the MPI_Init of tests/mpi_test_main.cc; lives until exit.
RankCommunicators* Comms(const WorldLayout& layout) {
  static RankCommunicators* comms = [&] {
    auto world = InitMpiWorld(nullptr, nullptr);
    EXPECT_TRUE(world.ok()) << world.status();
    if (!world.ok()) return static_cast<RankCommunicators*>(nullptr);
    auto made = MakeRankCommunicators(layout, std::move(*world));
    EXPECT_TRUE(made.ok()) << made.status();
    return made.ok() ? new RankCommunicators(std::move(*made)) : nullptr;
  }();
  return comms;
}

SchedulerOptions Options(const Replica& replica) {
  SchedulerOptions options;
  options.step_tokens = 64;
  options.fixed_chunk = 64;
  options.pipeline_stages = replica.layout().pp;
  return options;
}

// Runs `requests` on the replica's leader; every event, in order.
std::vector<SchedulerEvent> RunAll(Replica& replica, const ModelConfig& config,
                                   std::vector<SequenceRequest> requests) {
  const SchedulerOptions options = Options(replica);
  OfflineEngine engine(replica, config, options);
  for (auto& r : requests) engine.Add(std::move(r));
  std::vector<SchedulerEvent> events;
  const absl::Status status = engine.Run([&](const SchedulerEvent& e) { events.push_back(e); });
  EXPECT_TRUE(status.ok()) << status;
  return events;
}

// Per sequence: tokens, and the concatenated logits of its pieces.
struct Outputs {
  std::map<uint64_t, std::vector<int32_t>> tokens;
  std::map<uint64_t, std::vector<float>> logits;
};
Outputs Collect(const std::vector<SchedulerEvent>& events) {
  Outputs out;
  for (const auto& e : events) {
    EXPECT_NE(e.kind, SchedulerEvent::Kind::kFailed) << e.status;
    if (e.kind == SchedulerEvent::Kind::kToken) out.tokens[e.id].push_back(e.output.token);
    auto& l = out.logits[e.id];
    l.insert(l.end(), e.output.logits.begin(), e.output.logits.end());
  }
  return out;
}

class PrefixForkMpirunTest : public ::testing::TestWithParam<std::string> {};

TEST_P(PrefixForkMpirunTest, ForksAndCacheHitsEqualFreshRunsUnderPipelineAndTensorParallelism) {
  kernels::SetNumThreads(1);  // four ranks share the machine's cores
  const WorldLayout layout = *WorldLayout::Make(1, 2, 2);
  RankCommunicators* comms = Comms(layout);
  ASSERT_NE(comms, nullptr);
  Communicator& world = *comms->control;
  ASSERT_EQ(world.size(), 4);
  const RankCoord me = layout.CoordOf(world.rank());
  const std::string dir = testing::GoldenPath("model/" + GetParam());
  auto config = LoadModelConfig(dir);
  ASSERT_TRUE(config.ok()) << config.status();
  auto plan = PlanStages(*config, layout.pp, 400);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ModelShard shard;
  shard.layer_begin = plan->stages[me.stage].begin;
  shard.layer_end = plan->stages[me.stage].end;
  shard.tp_rank = me.tp_rank;
  shard.tp_size = layout.tp;
  auto model = Model::Load(dir, shard, comms->tp.get());
  ASSERT_TRUE(model.ok()) << model.status();
  StepExecutor executor(**model, layout, world, *comms->stage);
  Replica replica(executor);
  if (!replica.is_leader()) {
    EXPECT_TRUE(replica.Follow().ok());
    return;
  }

  const auto document = testing::RandomTokens(250, 31);
  const std::vector<std::vector<int32_t>> questions = {testing::RandomTokens(7, 32),
                                                       testing::RandomTokens(3, 33)};
  const int64_t V = config->vocab_size;
  for (SequenceKind kind : {SequenceKind::kGenerate, SequenceKind::kLogits}) {
    const std::vector<SequenceRequest> forked =
        testing::PrefixAndForks(document, questions, kind, 6);
    std::vector<SequenceRequest> fresh;
    for (size_t q = 0; q < questions.size(); ++q) {
      SequenceRequest r = forked[1 + q];  // the same question, asked whole
      r.id = 20 + q;
      r.fork_from.reset();
      r.prompt = document;
      r.prompt.insert(r.prompt.end(), questions[q].begin(), questions[q].end());
      fresh.push_back(std::move(r));
    }
    const Outputs a = Collect(RunAll(replica, *config, forked));
    const Outputs b = Collect(RunAll(replica, *config, fresh));
    for (size_t q = 0; q < questions.size(); ++q) {
      if (kind == SequenceKind::kGenerate) {
        ASSERT_EQ(a.tokens.at(10 + q).size(), 6u);
        EXPECT_EQ(a.tokens.at(10 + q), b.tokens.at(20 + q)) << "question " << q;
        continue;
      }
      const std::vector<float>& all = b.logits.at(20 + q);
      ASSERT_EQ(all.size(), (document.size() + questions[q].size()) * V);
      const std::vector<float> tail(all.end() - questions[q].size() * V, all.end());
      EXPECT_LE(testing::RelL2(a.logits.at(10 + q), testing::ToDouble(tail)), 5e-5)
          << "question " << q;
    }
  }
  EXPECT_GT(executor.stage().stats().fork_bytes, 0);

  // The prefix cache, with room for every entry and for one (each new entry
  // evicts the last), against each request run cold.
  const testing::PrefixCacheCase c = testing::MakePrefixCacheCase();
  std::map<uint64_t, testing::Answer> cold;
  for (const SequenceRequest& r : c.requests) {
    cold[r.id] = testing::Answers(RunAll(replica, *config, {r}))[r.id];
  }
  for (const int64_t entries : {100, 1}) {
    SCOPED_TRACE(absl::StrCat("room for ", entries, " entries"));
    const std::vector<SchedulerEvent> events = testing::RunOneAfterAnother(
        replica, *config,
        testing::WithPrefixCache(Options(replica), replica.state_unit_bytes(), entries),
        c.requests);
    EXPECT_EQ(testing::CachedTokens(events), c.cached);
    testing::ExpectAnswersEqual(testing::Answers(events), cold);
  }
  EXPECT_TRUE(replica.Stop().ok());
}

INSTANTIATE_TEST_SUITE_P(Golden, PrefixForkMpirunTest, ::testing::ValuesIn(testing::kGoldenModels),
                         testing::GoldenTestName);

}  // namespace
}  // namespace deltaserve
