// The batching policy alone: no model, no threads, no network. A fake clock
// and made-up step results drive the scheduler, and each test checks the
// steps it makes.
#include "runtime/scheduler/scheduler.h"

#include <deque>
#include <numeric>
#include <set>

#include "gtest/gtest.h"
#include "runtime/model/presets.h"

namespace deltaserve {
namespace {

using Clock = Scheduler::Clock;

ModelConfig Config() {
  auto config = PresetConfig("k3-tiny");
  EXPECT_TRUE(config.ok()) << config.status();
  return *config;
}

SequenceRequest Generate(uint64_t id, int64_t prompt_tokens, int64_t max_tokens) {
  SequenceRequest r;
  r.id = id;
  r.prompt.assign(static_cast<size_t>(prompt_tokens), 7);
  r.max_tokens = max_tokens;
  return r;
}

int64_t TokensOf(const Step& step, uint64_t id) {
  for (const SequenceWork& w : step.work) {
    if (w.sequence_id == id) return static_cast<int64_t>(w.tokens.size());
  }
  return 0;
}

int64_t StepTokens(const Step& step) {
  int64_t n = 0;
  for (const SequenceWork& w : step.work) n += static_cast<int64_t>(w.tokens.size());
  return n;
}

// Plays the replica: answers every step with a token for each sampled
// sequence (`next_token`), target log-probs for scores, and a step time from
// the scheduler's own starting cost model so that nothing depends on this
// machine.
class FakeReplica {
 public:
  explicit FakeReplica(const ModelConfig& config) : cost_(config) {}

  StepResult Answer(const Step& step) {
    StepResult result;
    result.step_id = step.id;
    std::vector<StepPiece> pieces;
    for (uint64_t id : step.release) lengths_.erase(id);
    for (const SequenceWork& w : step.work) {
      const int64_t n = static_cast<int64_t>(w.tokens.size());
      pieces.push_back({n, lengths_[w.sequence_id]});
      lengths_[w.sequence_id] += n;
      if (w.output == WorkOutput::kNone) continue;
      SequenceResult out;
      out.sequence_id = w.sequence_id;
      if (w.output == WorkOutput::kSample) out.token = next_token;
      if (w.output == WorkOutput::kScore) out.target_logprobs.assign(w.targets.size(), -1.0f);
      result.outputs.push_back(out);
    }
    result.wall_s = cost_.Cost(pieces);
    result.stage_compute_s = {result.wall_s};
    return result;
  }
  int64_t held() const { return static_cast<int64_t>(lengths_.size()); }

  int32_t next_token = 3;

 private:
  ChunkCostModel cost_;
  std::map<uint64_t, int64_t> lengths_;
};

// Runs the scheduler to the end (or `max_steps`), answering every step at
// once, and returns the steps and the events.
struct Trace {
  std::vector<Step> steps;
  std::vector<SchedulerEvent> events;
};
Trace RunToEnd(Scheduler& scheduler, FakeReplica& replica, int max_steps = 100000) {
  Trace run;
  auto now = Clock::time_point{};
  while (!scheduler.Idle() && max_steps-- > 0) {
    EXPECT_TRUE(scheduler.CanSchedule());
    auto step = scheduler.Schedule(now, &run.events);
    EXPECT_TRUE(step.has_value());
    if (!step) break;
    run.steps.push_back(*step);
    auto update = scheduler.TakeResult(replica.Answer(*step));
    run.events.insert(run.events.end(), update.events.begin(), update.events.end());
  }
  return run;
}

std::vector<int32_t> TokensFor(const Trace& run, uint64_t id) {
  std::vector<int32_t> tokens;
  for (const auto& e : run.events) {
    if (e.id == id && e.kind == SchedulerEvent::Kind::kToken) tokens.push_back(e.output.token);
  }
  return tokens;
}

const SchedulerEvent* LastOf(const Trace& run, uint64_t id) {
  const SchedulerEvent* last = nullptr;
  for (const auto& e : run.events) {
    if (e.id == id && e.kind != SchedulerEvent::Kind::kStarted) last = &e;
  }
  return last;
}

TEST(SchedulerTest, ChunksShrinkAsTheMlaPrefixGrows) {
  const ModelConfig config = Config();
  SchedulerOptions options;
  options.step_tokens = 256;
  Scheduler scheduler(config, options);
  FakeReplica replica(config);
  scheduler.Add(Generate(1, 6000, 4));
  const Trace run = RunToEnd(scheduler, replica);
  std::vector<int64_t> chunks;
  for (const Step& s : run.steps) {
    if (TokensOf(s, 1) > 0) chunks.push_back(TokensOf(s, 1));
  }
  ASSERT_EQ(TokensFor(run, 1).size(), 4u);
  EXPECT_EQ(run.steps.back().release, (std::vector<uint64_t>{1}));
  chunks.resize(chunks.size() - 3);  // the decode steps
  EXPECT_EQ(std::accumulate(chunks.begin(), chunks.end(), int64_t{0}), 6000);
  EXPECT_EQ(chunks.front(), 256);
  for (size_t i = 1; i + 1 < chunks.size(); ++i) EXPECT_LE(chunks[i], chunks[i - 1]) << i;
  EXPECT_LT(chunks[chunks.size() - 2], 256 / 3);
  EXPECT_EQ(replica.held(), 0);  // released after its last token
}

TEST(SchedulerTest, FixedChunksCutThePromptEvenly) {
  const ModelConfig config = Config();
  SchedulerOptions options;
  options.step_tokens = 100;
  options.fixed_chunk = 100;
  Scheduler scheduler(config, options);
  FakeReplica replica(config);
  scheduler.Add(Generate(1, 350, 2));
  const Trace run = RunToEnd(scheduler, replica);
  std::vector<int64_t> chunks;
  for (const Step& s : run.steps) chunks.push_back(TokensOf(s, 1));
  EXPECT_EQ(chunks, (std::vector<int64_t>{100, 100, 100, 50, 1, 0}));  // then the release
}

TEST(SchedulerTest, AdmitsInArrivalOrderUpToMaxRunning) {
  const ModelConfig config = Config();
  SchedulerOptions options;
  options.max_running = 2;
  Scheduler scheduler(config, options);
  FakeReplica replica(config);
  for (uint64_t id = 1; id <= 4; ++id) scheduler.Add(Generate(id, 4, 3));
  std::vector<SchedulerEvent> events;
  auto step = scheduler.Schedule(Clock::time_point{}, &events);
  ASSERT_TRUE(step);
  std::set<uint64_t> ids;
  for (const auto& w : step->work) ids.insert(w.sequence_id);
  EXPECT_EQ(ids, (std::set<uint64_t>{1, 2}));
  EXPECT_EQ(scheduler.running(), 2);
  EXPECT_EQ(scheduler.waiting(), 2);
  EXPECT_FALSE(scheduler.HasRoom());
  scheduler.TakeResult(replica.Answer(*step));
  const Trace run = RunToEnd(scheduler, replica);
  // 3 and 4 start only when 1 and 2 have ended.
  size_t ended = 0;
  std::set<uint64_t> started;
  for (const auto& e : run.events) {
    if (e.kind == SchedulerEvent::Kind::kStarted) {
      EXPECT_EQ(ended, 2u) << "sequence " << e.id << " started early";
      started.insert(e.id);
    }
    if (e.finished) ++ended;
  }
  EXPECT_EQ(started, (std::set<uint64_t>{3, 4}));
  // 1 and 2 sampled their first token in the first step.
  for (uint64_t id = 1; id <= 4; ++id) EXPECT_EQ(TokensFor(run, id).size(), id <= 2 ? 2u : 3u);
}

TEST(SchedulerTest, ShortRequestsDecodeInEveryStepOfALongPrefillWithinTheBudget) {
  const ModelConfig config = Config();
  SchedulerOptions options;
  options.step_tokens = 256;
  Scheduler scheduler(config, options);
  FakeReplica replica(config);
  scheduler.Add(Generate(1, 4000, 2));
  scheduler.Add(Generate(2, 5, 10));
  const Trace run = RunToEnd(scheduler, replica);
  EXPECT_EQ(TokensFor(run, 2).size(), 10u);
  EXPECT_EQ(TokensFor(run, 1).size(), 2u);
  int shared = 0;
  for (const Step& s : run.steps) {
    EXPECT_LE(StepTokens(s), 256) << "step " << s.id;
    if (TokensOf(s, 1) > 1 && TokensOf(s, 2) == 1) ++shared;
  }
  EXPECT_EQ(shared, 9);  // every decode of the short request
  // The short prompt went first: shortest remaining prompt first.
  EXPECT_EQ(TokensOf(run.steps[0], 2), 5);
}

TEST(SchedulerTest, TheOldestPromptProgressesUnderAnyLoad) {
  // A stream of short prompts never starves the long one: it gets at least
  // a quarter of the budget in every step.
  const ModelConfig config = Config();
  SchedulerOptions options;
  options.step_tokens = 64;
  options.fixed_chunk = 64;
  Scheduler scheduler(config, options);
  FakeReplica replica(config);
  scheduler.Add(Generate(1, 1000, 1));
  uint64_t next = 2;
  std::vector<SchedulerEvent> events;
  int64_t fed = 0;
  for (int i = 0; i < 40 && fed < 1000; ++i) {
    for (int k = 0; k < 3; ++k) scheduler.Add(Generate(next++, 30, 1));
    auto step = scheduler.Schedule(Clock::time_point{}, &events);
    ASSERT_TRUE(step);
    const int64_t mine = TokensOf(*step, 1);
    EXPECT_GE(mine, 64 / 4) << "step " << i;
    fed += mine;
    scheduler.TakeResult(replica.Answer(*step));
  }
  EXPECT_GE(fed, 40 * 16);
}

TEST(SchedulerTest, PipelinedStepsPromiseASuccessorWhilePromptIsLeft) {
  const ModelConfig config = Config();
  SchedulerOptions options;
  options.step_tokens = 256;
  options.pipeline_stages = 2;
  Scheduler scheduler(config, options);
  FakeReplica replica(config);
  scheduler.Add(Generate(1, 2000, 3));
  // Pure prefill steps promise a successor, and two go out before any result.
  std::vector<SchedulerEvent> events;
  auto first = scheduler.Schedule(Clock::time_point{}, &events);
  ASSERT_TRUE(first);
  EXPECT_TRUE(first->more_coming);
  EXPECT_TRUE(scheduler.CanSchedule());
  auto second = scheduler.Schedule(Clock::time_point{}, &events);
  ASSERT_TRUE(second);
  EXPECT_FALSE(scheduler.CanSchedule());  // one step per stage in flight
  // Results are used in step order whatever order they come in.
  EXPECT_EQ(scheduler.TakeResult(replica.Answer(*second)).steps, 0);
  EXPECT_EQ(scheduler.TakeResult(replica.Answer(*first)).steps, 2);
  const Trace run = RunToEnd(scheduler, replica);
  // The prompt's last chunk samples and does not promise; neither do the
  // decode steps of a lone sequence (each needs the token before).
  size_t i = 0;
  while (i < run.steps.size() && run.steps[i].work[0].output == WorkOutput::kNone) {
    EXPECT_TRUE(run.steps[i].more_coming) << i;
    ++i;
  }
  ASSERT_LT(i, run.steps.size());
  for (; i < run.steps.size(); ++i) EXPECT_FALSE(run.steps[i].more_coming) << i;
  EXPECT_EQ(TokensFor(run, 1).size(), 3u);
}

TEST(SchedulerTest, DecodesSplitIntoOneGroupPerPipelineStage) {
  const ModelConfig config = Config();
  SchedulerOptions options;
  options.pipeline_stages = 2;
  Scheduler scheduler(config, options);
  FakeReplica replica(config);
  for (uint64_t id = 1; id <= 4; ++id) scheduler.Add(Generate(id, 3, 10));
  // Prefill all four, then keep two steps in flight: each carries two
  // decodes, and a sequence whose token is being sampled sits out.
  std::vector<SchedulerEvent> events;
  auto prefill = scheduler.Schedule(Clock::time_point{}, &events);
  ASSERT_TRUE(prefill);
  EXPECT_EQ(prefill->work.size(), 4u);
  scheduler.TakeResult(replica.Answer(*prefill));
  std::deque<Step> in_flight;
  int decode_steps = 0;
  while (!scheduler.Idle()) {
    while (scheduler.CanSchedule()) {
      auto step = scheduler.Schedule(Clock::time_point{}, &events);
      ASSERT_TRUE(step);
      EXPECT_LE(step->work.size(), 2u) << "step " << step->id;
      std::set<uint64_t> mine;
      for (const auto& w : step->work) mine.insert(w.sequence_id);
      for (const Step& other : in_flight) {
        for (const auto& w : other.work) EXPECT_FALSE(mine.contains(w.sequence_id));
      }
      decode_steps += !step->work.empty();
      in_flight.push_back(*step);
    }
    ASSERT_FALSE(in_flight.empty());
    scheduler.TakeResult(replica.Answer(in_flight.front()));
    in_flight.pop_front();
  }
  EXPECT_GE(decode_steps, 2 * 9);
}

TEST(SchedulerTest, SequencesEndAtStopTokensMaxTokensAndTheContext) {
  ModelConfig config = Config();
  config.max_position_embeddings = 20;
  Scheduler scheduler(config, SchedulerOptions{});
  FakeReplica replica(config);
  SequenceRequest stop = Generate(1, 4, 100);
  stop.stop_ids = {3};  // the fake replica's token
  scheduler.Add(stop);
  scheduler.Add(Generate(2, 4, 5));
  scheduler.Add(Generate(3, 15, 100));
  const Trace run = RunToEnd(scheduler, replica);
  const SchedulerEvent* one = LastOf(run, 1);
  ASSERT_NE(one, nullptr);
  EXPECT_TRUE(one->finished);
  EXPECT_EQ(one->reason, FinishReason::kStop);
  EXPECT_EQ(one->stop, "token 3");
  EXPECT_EQ(TokensFor(run, 1).size(), 1u);
  EXPECT_EQ(LastOf(run, 2)->reason, FinishReason::kLength);
  EXPECT_EQ(TokensFor(run, 2).size(), 5u);
  EXPECT_EQ(LastOf(run, 3)->reason, FinishReason::kContext);
  EXPECT_EQ(TokensFor(run, 3).size(), 5u);  // 15 + 5 = the context of 20
  EXPECT_EQ(replica.held(), 0);
}

TEST(SchedulerTest, ScoresComeInPiecesAndEndWhenAllAreIn) {
  const ModelConfig config = Config();
  SchedulerOptions options;
  options.step_tokens = 40;
  options.fixed_chunk = 40;
  Scheduler scheduler(config, options);
  FakeReplica replica(config);
  SequenceRequest score;
  score.id = 1;
  score.kind = SequenceKind::kScore;
  for (int32_t t = 0; t < 100; ++t) score.prompt.push_back(t);
  score.decode_from = 90;
  scheduler.Add(score);
  const Trace run = RunToEnd(scheduler, replica);
  std::vector<int64_t> chunks;
  for (const Step& s : run.steps) {
    if (TokensOf(s, 1) > 0) chunks.push_back(TokensOf(s, 1));
  }
  // Prefill pieces to position 90, then one token per step.
  EXPECT_EQ(chunks, (std::vector<int64_t>{40, 40, 10, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}));
  // Targets are the next tokens, -1 after the last.
  EXPECT_EQ(run.steps[0].work[0].targets.front(), 1);
  EXPECT_EQ(run.steps[chunks.size() - 1].work[0].targets.back(), -1);
  size_t pieces = 0;
  for (const auto& e : run.events) {
    if (e.kind != SchedulerEvent::Kind::kPiece) continue;
    ++pieces;
    EXPECT_EQ(e.finished, pieces == chunks.size());
  }
  EXPECT_EQ(pieces, chunks.size());
}

TEST(SchedulerTest, FinishReleasesTheStateWithTheNextStep) {
  const ModelConfig config = Config();
  Scheduler scheduler(config, SchedulerOptions{});
  FakeReplica replica(config);
  scheduler.Add(Generate(1, 3, 1000));
  scheduler.Add(Generate(2, 3, 1000));
  std::vector<SchedulerEvent> events;
  for (int i = 0; i < 3; ++i) {
    auto step = scheduler.Schedule(Clock::time_point{}, &events);
    ASSERT_TRUE(step);
    scheduler.TakeResult(replica.Answer(*step));
  }
  EXPECT_TRUE(scheduler.Finish(1));
  EXPECT_FALSE(scheduler.Finish(1));
  auto step = scheduler.Schedule(Clock::time_point{}, &events);
  ASSERT_TRUE(step);
  EXPECT_EQ(step->release, (std::vector<uint64_t>{1}));
  EXPECT_EQ(TokensOf(*step, 1), 0);
  EXPECT_EQ(TokensOf(*step, 2), 1);
  // A result for a finished sequence that was in flight is dropped.
  scheduler.TakeResult(replica.Answer(*step));
  EXPECT_TRUE(scheduler.Finish(2));
  auto last = scheduler.Schedule(Clock::time_point{}, &events);
  ASSERT_TRUE(last);
  EXPECT_EQ(last->release, (std::vector<uint64_t>{2}));
  EXPECT_TRUE(last->work.empty());
  scheduler.TakeResult(replica.Answer(*last));
  EXPECT_TRUE(scheduler.Idle());
  EXPECT_EQ(replica.held(), 0);
}

TEST(SchedulerTest, DeadlinesEndRequestsBeforeTheyCostMore) {
  const ModelConfig config = Config();
  SchedulerOptions options;
  options.max_running = 1;
  Scheduler scheduler(config, options);
  FakeReplica replica(config);
  const Clock::time_point t0{};
  SequenceRequest running = Generate(1, 3, 1000);
  running.deadline = t0 + std::chrono::seconds(10);
  SequenceRequest queued = Generate(2, 3, 10);
  queued.deadline = t0 + std::chrono::seconds(5);
  scheduler.Add(running);
  scheduler.Add(queued);
  std::vector<SchedulerEvent> events;
  auto step = scheduler.Schedule(t0, &events);
  ASSERT_TRUE(step);
  scheduler.TakeResult(replica.Answer(*step));
  events.clear();
  step = scheduler.Schedule(t0 + std::chrono::seconds(6), &events);  // the queued one expires
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].id, 2u);
  EXPECT_EQ(events[0].status.code(), absl::StatusCode::kDeadlineExceeded);
  ASSERT_TRUE(step);
  scheduler.TakeResult(replica.Answer(*step));
  events.clear();
  step = scheduler.Schedule(t0 + std::chrono::seconds(11), &events);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].id, 1u);
  ASSERT_TRUE(step);
  EXPECT_EQ(step->release, (std::vector<uint64_t>{1}));  // it held state
  EXPECT_TRUE(step->work.empty());
}

TEST(SchedulerTest, ARefusedStepFailsItsSequences) {
  const ModelConfig config = Config();
  Scheduler scheduler(config, SchedulerOptions{});
  scheduler.Add(Generate(1, 3, 10));
  std::vector<SchedulerEvent> events;
  auto step = scheduler.Schedule(Clock::time_point{}, &events);
  ASSERT_TRUE(step);
  StepResult refused;
  refused.step_id = step->id;
  refused.error = "token id 99999 is out of range";
  auto update = scheduler.TakeResult(refused);
  ASSERT_EQ(update.events.size(), 1u);
  EXPECT_EQ(update.events[0].kind, SchedulerEvent::Kind::kFailed);
  EXPECT_NE(update.events[0].status.message().find("99999"), std::string::npos);
  // A result for a step that is not in flight is ignored.
  EXPECT_EQ(scheduler.TakeResult(refused).steps, 0);
}

TEST(SchedulerTest, AbandonReturnsUnseenRequestsInOrder) {
  const ModelConfig config = Config();
  SchedulerOptions options;
  options.max_running = 1;
  Scheduler scheduler(config, options);
  scheduler.Add(Generate(1, 3, 10));
  scheduler.Add(Generate(2, 3, 10));
  scheduler.Add(Generate(3, 3, 10));
  std::vector<SchedulerEvent> events;
  ASSERT_TRUE(scheduler.Schedule(Clock::time_point{}, &events));
  Scheduler::Abandoned abandoned = scheduler.Abandon();
  EXPECT_EQ(abandoned.held, (std::vector<uint64_t>{1}));
  ASSERT_EQ(abandoned.unseen.size(), 2u);
  EXPECT_EQ(abandoned.unseen[0].id, 2u);
  EXPECT_EQ(abandoned.unseen[1].id, 3u);
  EXPECT_TRUE(scheduler.Idle());
}

}  // namespace
}  // namespace deltaserve
