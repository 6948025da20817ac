// The batching policy alone: no model, no threads, no network. A fake clock
// and made-up step results drive the scheduler, and each test checks the
// steps it makes.
#include "runtime/scheduler/scheduler.h"

#include <algorithm>
#include <deque>
#include <functional>
#include <map>
#include <numeric>
#include <optional>
#include <random>
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
      if (w.fork_from) lengths_[w.sequence_id] = lengths_.at(*w.fork_from);
      // A token fed by the replica: the one its last sampling step gave.
      EXPECT_TRUE(!w.feed_sampled || (w.tokens.empty() && lengths_.count(w.sequence_id)))
          << "step " << step.id << ", sequence " << w.sequence_id;
      const int64_t n = w.feed_sampled ? 1 : static_cast<int64_t>(w.tokens.size());
      pieces.push_back({n, lengths_[w.sequence_id]});
      lengths_[w.sequence_id] += n;
      peak_held_ = std::max(peak_held_, held());
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
  int64_t peak_held() const { return peak_held_; }  // sequences held at once, at most

  int32_t next_token = 3;

 private:
  int64_t peak_held_ = 0;
  ChunkCostModel cost_;
  std::map<uint64_t, int64_t> lengths_;
};

SchedulerOptions Options(int64_t step_tokens, int stages = 1, int64_t fixed_chunk = 0,
                         int64_t max_running = 64) {
  SchedulerOptions options;
  options.step_tokens = step_tokens;
  options.pipeline_stages = stages;
  options.fixed_chunk = fixed_chunk;
  options.max_running = max_running;
  return options;
}

// A scheduler over k3-tiny's config, the fake replica that answers it, and
// the trace of every step and event.
struct Harness {
  explicit Harness(SchedulerOptions options = {}, ModelConfig model = Config())
      : config(std::move(model)), scheduler(config, options), replica(config) {}

  // The next step (a test failure when there is none).
  Step Next(Clock::time_point now = {}) {
    std::optional<Step> step = scheduler.Schedule(now, &events);
    EXPECT_TRUE(step.has_value());
    if (!step) return Step{};
    steps.push_back(*step);
    return *step;
  }
  // Answers `step` as the replica would; the number of steps taken in.
  int64_t Answer(const Step& step) {
    StepResult result = replica.Answer(step);
    EXPECT_TRUE(scheduler.CheckResult(result).ok()) << scheduler.CheckResult(result);
    Scheduler::Update update = scheduler.TakeResult(std::move(result));
    events.insert(events.end(), update.events.begin(), update.events.end());
    return update.steps;
  }
  // Steps and answers at once until nothing is left.
  void RunToEnd() {
    for (int i = 0; i < 100000 && !scheduler.Idle(); ++i) {
      EXPECT_TRUE(scheduler.CanSchedule());
      Answer(Next());
    }
  }
  // Tokens of sequence `id` in each step since `from` (0 where it had none).
  std::vector<int64_t> Chunks(uint64_t id, size_t from = 0) const {
    std::vector<int64_t> chunks;
    for (size_t i = from; i < steps.size(); ++i) chunks.push_back(TokensOf(steps[i], id));
    return chunks;
  }
  std::vector<int32_t> TokensFor(uint64_t id) const {
    std::vector<int32_t> tokens;
    for (const auto& e : events) {
      if (e.id == id && e.kind == SchedulerEvent::Kind::kToken) tokens.push_back(e.output.token);
    }
    return tokens;
  }
  const SchedulerEvent* LastOf(uint64_t id) const {
    const SchedulerEvent* last = nullptr;
    for (const auto& e : events) {
      if (e.id == id && e.kind != SchedulerEvent::Kind::kStarted) last = &e;
    }
    return last;
  }

  ModelConfig config;
  Scheduler scheduler;
  FakeReplica replica;
  std::vector<Step> steps;
  std::vector<SchedulerEvent> events;
};

std::vector<int64_t> NonZero(std::vector<int64_t> chunks) {
  chunks.erase(std::remove(chunks.begin(), chunks.end(), 0), chunks.end());
  return chunks;
}

TEST(SchedulerTest, ChunksShrinkAsTheMlaPrefixGrows) {
  Harness h(Options(256));
  h.scheduler.Add(Generate(1, 6000, 4));
  h.RunToEnd();
  ASSERT_EQ(h.TokensFor(1).size(), 4u);
  EXPECT_EQ(h.steps.back().release, (std::vector<uint64_t>{1}));
  std::vector<int64_t> chunks = NonZero(h.Chunks(1));
  chunks.resize(chunks.size() - 3);  // the decode steps
  EXPECT_EQ(std::accumulate(chunks.begin(), chunks.end(), int64_t{0}), 6000);
  EXPECT_EQ(chunks.front(), 256);
  for (size_t i = 1; i + 1 < chunks.size(); ++i) EXPECT_LE(chunks[i], chunks[i - 1]) << i;
  EXPECT_LT(chunks[chunks.size() - 2], 256 / 3);
  EXPECT_EQ(h.replica.held(), 0);  // released after its last token
}

TEST(SchedulerTest, FixedChunksCutThePromptEvenly) {
  Harness h(Options(100, 1, /*fixed_chunk=*/100));
  h.scheduler.Add(Generate(1, 350, 2));
  h.RunToEnd();
  EXPECT_EQ(h.Chunks(1), (std::vector<int64_t>{100, 100, 100, 50, 1, 0}));  // then the release
}

TEST(SchedulerTest, AdmitsInArrivalOrderUpToMaxRunning) {
  Harness h(Options(512, 1, 0, /*max_running=*/2));
  for (uint64_t id = 1; id <= 4; ++id) h.scheduler.Add(Generate(id, 4, 3));
  const Step first = h.Next();
  std::set<uint64_t> ids;
  for (const auto& w : first.work) ids.insert(w.sequence_id);
  EXPECT_EQ(ids, (std::set<uint64_t>{1, 2}));
  EXPECT_EQ(h.scheduler.running(), 2);
  EXPECT_EQ(h.scheduler.waiting(), 2);
  EXPECT_FALSE(h.scheduler.HasRoom());
  h.Answer(first);
  h.RunToEnd();
  // 3 and 4 start only when 1 and 2 have ended.
  size_t ended = 0;
  std::set<uint64_t> started;
  for (const auto& e : h.events) {
    if (e.kind == SchedulerEvent::Kind::kStarted) {
      if (e.id > 2) {
        EXPECT_EQ(ended, 2u) << "sequence " << e.id << " started early";
      }
      started.insert(e.id);
    }
    if (e.finished) ++ended;
  }
  EXPECT_EQ(started, (std::set<uint64_t>{1, 2, 3, 4}));
  for (uint64_t id = 1; id <= 4; ++id) EXPECT_EQ(h.TokensFor(id).size(), 3u) << id;
}

TEST(SchedulerTest, ShortRequestsDecodeInEveryStepOfALongPrefillWithinTheBudget) {
  Harness h(Options(256));
  h.scheduler.Add(Generate(1, 4000, 2));
  h.scheduler.Add(Generate(2, 5, 10));
  h.RunToEnd();
  EXPECT_EQ(h.TokensFor(2).size(), 10u);
  EXPECT_EQ(h.TokensFor(1).size(), 2u);
  int shared = 0;
  for (const Step& s : h.steps) {
    EXPECT_LE(StepTokens(s), 256) << "step " << s.id;
    if (TokensOf(s, 1) > 1 && TokensOf(s, 2) == 1) ++shared;
  }
  EXPECT_EQ(shared, 9);  // every decode of the short request
  // The short prompt went first: shortest remaining prompt first.
  EXPECT_EQ(TokensOf(h.steps[0], 2), 5);
}

TEST(SchedulerTest, TheOldestPromptProgressesUnderAnyLoad) {
  // A stream of short prompts never starves the long one: it gets at least
  // a quarter of the budget in every step.
  Harness h(Options(64, 1, /*fixed_chunk=*/64));
  h.scheduler.Add(Generate(1, 1000, 1));
  uint64_t next = 2;
  int64_t fed = 0;
  for (int i = 0; i < 40 && fed < 1000; ++i) {
    for (int k = 0; k < 3; ++k) h.scheduler.Add(Generate(next++, 30, 1));
    const Step step = h.Next();
    EXPECT_GE(TokensOf(step, 1), 64 / 4) << "step " << i;
    fed += TokensOf(step, 1);
    h.Answer(step);
  }
  EXPECT_GE(fed, 40 * 16);
}

TEST(SchedulerTest, PipelinedStepsPromiseASuccessorWhilePromptIsLeft) {
  Harness h(Options(256, /*stages=*/2));
  h.scheduler.Add(Generate(1, 2000, 3));
  // Pure prefill steps promise a successor, and two go out before any result.
  const Step first = h.Next();
  EXPECT_TRUE(first.more_coming);
  EXPECT_TRUE(h.scheduler.CanSchedule());
  const Step second = h.Next();
  EXPECT_FALSE(h.scheduler.CanSchedule());  // one step per stage in flight
  // Results are used in step order whatever order they come in.
  EXPECT_EQ(h.Answer(second), 0);
  EXPECT_EQ(h.Answer(first), 2);
  h.RunToEnd();
  // The prompt's last chunk samples and does not promise; neither do the
  // decode steps of a lone sequence (each needs the token before).
  size_t i = 0;
  while (i < h.steps.size() && h.steps[i].work[0].output == WorkOutput::kNone) {
    EXPECT_TRUE(h.steps[i].more_coming) << i;
    ++i;
  }
  ASSERT_LT(i, h.steps.size());
  for (; i < h.steps.size(); ++i) EXPECT_FALSE(h.steps[i].more_coming) << i;
  EXPECT_EQ(h.TokensFor(1).size(), 3u);
}

TEST(SchedulerTest, DecodesSplitIntoOneGroupPerPipelineStage) {
  Harness h(Options(512, /*stages=*/2));
  for (uint64_t id = 1; id <= 4; ++id) h.scheduler.Add(Generate(id, 3, 10));
  // Prefill all four, then keep two steps in flight: each carries two
  // decodes, and a sequence whose token is being sampled sits out.
  const Step prefill = h.Next();
  EXPECT_EQ(prefill.work.size(), 4u);
  h.Answer(prefill);
  std::deque<Step> in_flight;
  int decode_steps = 0;
  while (!h.scheduler.Idle()) {
    while (h.scheduler.CanSchedule()) {
      const Step step = h.Next();
      EXPECT_LE(step.work.size(), 2u) << "step " << step.id;
      for (const SequenceWork& w : step.work) {
        for (const Step& other : in_flight) EXPECT_EQ(TokensOf(other, w.sequence_id), 0);
      }
      decode_steps += !step.work.empty();
      in_flight.push_back(step);
    }
    ASSERT_FALSE(in_flight.empty());
    h.Answer(in_flight.front());
    in_flight.pop_front();
  }
  EXPECT_GE(decode_steps, 2 * 9);
}

// A replica behind a link: decoding sequences go again before their result
// is in, the replica feeding the token (decode_ahead), so two steps per stage
// are in flight; lengths and contexts end exactly, a stop token one step late.
TEST(SchedulerTest, DecodeAheadKeepsTwoStepsPerStageInFlightAndEndsExactly) {
  ModelConfig config = Config();
  config.max_position_embeddings = 13;
  SchedulerOptions options = Options(512, /*stages=*/2);
  options.decode_ahead = true;
  Harness h(options, config);
  SequenceRequest stop = Generate(1, 3, 100);
  stop.stop_ids = {9};
  h.scheduler.Add(stop);
  h.scheduler.Add(Generate(2, 3, 6));
  h.scheduler.Add(Generate(3, 3, 7));
  h.scheduler.Add(Generate(4, 3, 100));  // ends at the context: 3 + 10 = 13
  h.Answer(h.Next());                    // the prompts; a first token each
  std::deque<Step> in_flight;
  size_t most_in_flight = 0;
  int answered = 0;
  bool stopped = false;
  std::map<uint64_t, int> fed;  // steps that fed each sequence's token
  while (!h.scheduler.Idle()) {
    while (h.scheduler.CanSchedule()) {
      const Step step = h.Next();
      for (const SequenceWork& w : step.work) {
        int carrying = 0;  // steps in flight sampling it
        for (const Step& other : in_flight) {
          for (const SequenceWork& o : other.work) carrying += o.sequence_id == w.sequence_id;
        }
        // Sent ahead exactly when its token is being sampled, at most once.
        EXPECT_LE(carrying, 1) << "step " << step.id << ", sequence " << w.sequence_id;
        EXPECT_EQ(w.feed_sampled, carrying == 1) << "step " << step.id;
        fed[w.sequence_id] += w.feed_sampled;
      }
      // A released sequence is in no step after its release.
      for (uint64_t id : step.release) {
        for (const Step& other : in_flight) EXPECT_EQ(TokensOf(other, id), 0) << id;
      }
      in_flight.push_back(step);
      most_in_flight = std::max(most_in_flight, in_flight.size());
    }
    ASSERT_FALSE(in_flight.empty());
    // Sequence 1 samples its stop token in a step answered after a few,
    // with its next step already sent ahead.
    const auto has = [](const Step& step, uint64_t id) {
      return std::any_of(step.work.begin(), step.work.end(),
                         [&](const SequenceWork& w) { return w.sequence_id == id; });
    };
    const bool stop_now = ++answered > 4 && !stopped && has(in_flight.front(), 1) &&
                          std::any_of(in_flight.begin() + 1, in_flight.end(),
                                      [&](const Step& step) { return has(step, 1); });
    stopped = stopped || stop_now;
    h.replica.next_token = stop_now ? 9 : 3;
    h.Answer(in_flight.front());
    in_flight.pop_front();
  }
  EXPECT_EQ(most_in_flight, 4u);  // two per stage
  for (uint64_t id = 1; id <= 4; ++id) EXPECT_GT(fed[id], 0) << id;
  // Lengths and the context end exactly, with nothing sent ahead past them.
  EXPECT_EQ(h.TokensFor(2).size(), 6u);
  EXPECT_EQ(h.LastOf(2)->reason, FinishReason::kLength);
  EXPECT_EQ(h.TokensFor(3).size(), 7u);
  EXPECT_EQ(h.TokensFor(4).size(), 10u);
  EXPECT_EQ(h.LastOf(4)->reason, FinishReason::kContext);
  int64_t samples_of_2 = 0;
  for (const Step& step : h.steps) {
    for (const SequenceWork& w : step.work) samples_of_2 += w.sequence_id == 2;
  }
  EXPECT_EQ(samples_of_2, 6);  // the prompt's chunk, then 5 decode steps
  // The stop token ends sequence 1 where it came; the token a step sent
  // ahead sampled after it is dropped.
  const std::vector<int32_t> one = h.TokensFor(1);
  ASSERT_TRUE(stopped);
  ASSERT_FALSE(one.empty());
  EXPECT_EQ(one.back(), 9);
  EXPECT_EQ(h.LastOf(1)->reason, FinishReason::kStop);
  EXPECT_EQ(std::count(one.begin(), one.end(), 9), 1);
  EXPECT_EQ(h.replica.held(), 0);  // every state released
}

// A 2-stage worker behind a link, in time: each stage takes one unit per
// step, in order; a step starts on the first stage once it has been sent, the
// stage is free, and the steps that sample the tokens it feeds have left the
// second stage (Replica::FeedsReady); results reach the scheduler as they
// leave. Eight clients send two requests each, the second a moment after the
// first ends, as bench-serve does. With the stages overlapped a decode step
// of 4 rows leaves every unit. A sequence sent in two steps in a row makes the
// second wait a unit for the first: requests that arrived at odd times used
// to settle into groups that shared a sequence for good, and every other
// step waited (8 clients on 2 stages at about 1.1x one stage, not 1.4x).
TEST(SchedulerTest, DecodeAheadKeepsBothStagesOfAPipelineBusy) {
  constexpr uint64_t kClients = 8;
  constexpr int64_t kTokens = 64;
  for (uint32_t seed = 1; seed <= 20; ++seed) {
    SCOPED_TRACE(::testing::Message() << "seed " << seed);
    std::mt19937 gen(seed);
    const auto moment = [&] { return std::uniform_real_distribution<double>(0, 3)(gen); };
    SchedulerOptions options = Options(512, /*stages=*/2);
    options.decode_ahead = true;
    Harness h(options);
    std::multimap<double, uint64_t> arrivals;  // time, request id
    for (uint64_t id = 1; id <= kClients; ++id) arrivals.emplace(moment(), id);
    struct Sent {
      Step step;
      double done;  // leaves the second stage
    };
    std::deque<Sent> in_flight;
    std::map<uint64_t, double> sampled_at;  // when each sequence's last sampling step leaves
    double now = 0, first_stage_free = 0, second_stage_free = 0;
    for (int i = 0; i < 100000 && !(h.scheduler.Idle() && arrivals.empty()); ++i) {
      while (!arrivals.empty() && arrivals.begin()->first <= now) {
        h.scheduler.Add(Generate(arrivals.begin()->second, 8, kTokens));
        arrivals.erase(arrivals.begin());
      }
      if (h.scheduler.CanSchedule()) {
        const Step step = h.Next();
        double start = std::max(now, first_stage_free);
        for (const SequenceWork& w : step.work) {
          if (w.feed_sampled) start = std::max(start, sampled_at.at(w.sequence_id));
        }
        first_stage_free = start + 1;
        second_stage_free = std::max(first_stage_free, second_stage_free) + 1;
        for (const SequenceWork& w : step.work) sampled_at[w.sequence_id] = second_stage_free;
        in_flight.push_back({step, second_stage_free});
        continue;
      }
      const double next_arrival = arrivals.empty() ? 1e30 : arrivals.begin()->first;
      if (in_flight.empty() || next_arrival < in_flight.front().done) {
        now = next_arrival;
        continue;
      }
      now = std::max(now, in_flight.front().done);
      const size_t seen = h.events.size();
      h.Answer(in_flight.front().step);
      in_flight.pop_front();
      for (size_t e = seen; e < h.events.size(); ++e) {
        const SchedulerEvent& event = h.events[e];
        if (event.finished && event.id <= kClients) {
          arrivals.emplace(now + moment(), event.id + kClients);
        }
      }
    }
    ASSERT_TRUE(h.scheduler.Idle());
    for (uint64_t id = 1; id <= 2 * kClients; ++id) {
      EXPECT_EQ(h.TokensFor(id).size(), static_cast<size_t>(kTokens)) << id;
    }
    // 2 x 8 x 64 tokens, 4 a step: 256 units at best (the grouping that
    // drifted took about 336).
    EXPECT_LE(now, 1.12 * 256);
  }
}

// With decode_ahead, steps carrying prompt chunks stay one per stage in
// flight (a long prompt's chunks queue no deeper than without it), and a
// prompt that arrives while decoders keep the window full still gets in
// at once: on one stage (a remote single-process worker) and on two.
TEST(SchedulerTest, DecodeAheadNeitherQueuesPromptChunksDeepNorStarvesThem) {
  for (int stages : {1, 2}) {
    SCOPED_TRACE(::testing::Message() << stages << " stages");
    SchedulerOptions options = Options(256, stages);
    options.decode_ahead = true;
    Harness h(options);
    for (uint64_t id = 1; id <= 4; ++id) h.scheduler.Add(Generate(id, 3, 1000));
    h.Answer(h.Next());  // decoding from here, for good
    std::deque<Step> in_flight;
    int deep = 0;
    for (int answered = 0; answered < 200; ++answered) {
      if (answered == 50) h.scheduler.Add(Generate(5, 3000, 2));
      while (h.scheduler.CanSchedule()) {
        const Step step = h.Next();
        deep += in_flight.size() >= static_cast<size_t>(stages);
        int prompt_steps = TokensOf(step, 5) > 0;
        for (const Step& other : in_flight) prompt_steps += TokensOf(other, 5) > 0;
        EXPECT_LE(prompt_steps, stages) << "step " << step.id;
        in_flight.push_back(step);
      }
      ASSERT_FALSE(in_flight.empty());
      ASSERT_LE(in_flight.size(), 2u * stages);
      h.Answer(in_flight.front());
      in_flight.pop_front();
    }
    EXPECT_GT(deep, 0);
    // 3000 tokens in chunks of at most 256 (fewer beside the decodes), one
    // per stage in flight, while the decoders never stop: all in, and both
    // tokens out, within 150 steps of arriving.
    EXPECT_EQ(h.TokensFor(5).size(), 2u);
    EXPECT_GE(h.TokensFor(1).size(), 150u / stages);
  }
}

TEST(SchedulerTest, SequencesEndAtStopTokensMaxTokensAndTheContext) {
  ModelConfig config = Config();
  config.max_position_embeddings = 20;
  Harness h(SchedulerOptions{}, config);
  SequenceRequest stop = Generate(1, 4, 100);
  stop.stop_ids = {3};  // the fake replica's token
  h.scheduler.Add(stop);
  h.scheduler.Add(Generate(2, 4, 5));
  h.scheduler.Add(Generate(3, 15, 100));
  h.RunToEnd();
  const SchedulerEvent* one = h.LastOf(1);
  ASSERT_NE(one, nullptr);
  EXPECT_TRUE(one->finished);
  EXPECT_EQ(one->reason, FinishReason::kStop);
  EXPECT_EQ(one->stop, "token 3");
  EXPECT_EQ(h.TokensFor(1).size(), 1u);
  EXPECT_EQ(h.LastOf(2)->reason, FinishReason::kLength);
  EXPECT_EQ(h.TokensFor(2).size(), 5u);
  EXPECT_EQ(h.LastOf(3)->reason, FinishReason::kContext);
  EXPECT_EQ(h.TokensFor(3).size(), 5u);  // 15 + 5 = the context of 20
  EXPECT_EQ(h.replica.held(), 0);
}

TEST(SchedulerTest, ScoresComeInPiecesAndEndWhenAllAreIn) {
  Harness h(Options(40, 1, /*fixed_chunk=*/40));
  SequenceRequest score;
  score.id = 1;
  score.kind = SequenceKind::kScore;
  for (int32_t t = 0; t < 100; ++t) score.prompt.push_back(t);
  score.decode_from = 90;
  h.scheduler.Add(score);
  h.RunToEnd();
  const std::vector<int64_t> chunks = NonZero(h.Chunks(1));
  // Prefill pieces to position 90, then one token per step.
  EXPECT_EQ(chunks, (std::vector<int64_t>{40, 40, 10, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}));
  // Targets are the next tokens, -1 after the last.
  EXPECT_EQ(h.steps[0].work[0].targets.front(), 1);
  EXPECT_EQ(h.steps[chunks.size() - 1].work[0].targets.back(), -1);
  size_t pieces = 0;
  for (const auto& e : h.events) {
    if (e.kind != SchedulerEvent::Kind::kPiece) continue;
    ++pieces;
    EXPECT_EQ(e.finished, pieces == chunks.size());
  }
  EXPECT_EQ(pieces, chunks.size());
}

// Progress counts prompt tokens whose step has come back, not those sent:
// with two steps in flight on a 2-stage replica, none until a result; each
// event precedes the same step's token, and decode steps make none.
TEST(SchedulerTest, ProgressFollowsTheResultsOfPromptChunks) {
  Harness h(Options(40, /*stages=*/2, /*fixed_chunk=*/40));
  h.scheduler.Add(Generate(1, 100, 3));
  const Step first = h.Next();
  ASSERT_TRUE(h.scheduler.CanSchedule());
  const Step second = h.Next();
  auto progress = [&] {
    std::vector<int64_t> done;
    for (const auto& e : h.events) {
      if (e.kind != SchedulerEvent::Kind::kProgress) continue;
      EXPECT_EQ(e.id, 1u);
      EXPECT_EQ(e.prompt_tokens, 100);
      done.push_back(e.prefilled);
    }
    return done;
  };
  EXPECT_TRUE(progress().empty());
  h.Answer(first);
  EXPECT_EQ(progress(), (std::vector<int64_t>{40}));
  h.Answer(second);
  EXPECT_EQ(progress(), (std::vector<int64_t>{40, 80}));
  h.RunToEnd();
  EXPECT_EQ(progress(), (std::vector<int64_t>{40, 80, 100}));
  EXPECT_EQ(h.TokensFor(1).size(), 3u);
  // The last chunk's progress comes before the first token, and none after.
  bool token_seen = false;
  for (const auto& e : h.events) {
    if (e.kind == SchedulerEvent::Kind::kToken) token_seen = true;
    if (e.kind == SchedulerEvent::Kind::kProgress) {
      EXPECT_FALSE(token_seen);
    }
  }
}

// A worker's answer is checked against the step it answers: each way a
// forged result can disagree with the plan is refused, naming the sequence.
TEST(SchedulerTest, CheckResultRefusesAnswersThatDoNotMatchTheStep) {
  Harness h(Options(40, 1, /*fixed_chunk=*/20));
  SequenceRequest generate = Generate(1, 5, 10);
  generate.logprobs = true;
  generate.top_logprobs = 3;
  h.scheduler.Add(generate);
  SequenceRequest score;
  score.id = 2;
  score.kind = SequenceKind::kScore;
  for (int32_t t = 0; t < 20; ++t) score.prompt.push_back(t);
  h.scheduler.Add(score);
  const Step step = h.Next();
  ASSERT_EQ(TokensOf(step, 1), 5);
  ASSERT_EQ(TokensOf(step, 2), 20);
  StepResult good = h.replica.Answer(step);
  ASSERT_EQ(good.outputs.size(), 2u);
  for (SequenceResult& out : good.outputs) {
    if (out.sequence_id == 1) {
      out.top_ids = {3, 4, 5};
      out.top_logprobs = {-1, -2, -3};
    }
  }
  ASSERT_TRUE(h.scheduler.CheckResult(good).ok()) << h.scheduler.CheckResult(good);
  const auto refused = [&](const std::function<void(StepResult&)>& forge, const std::string& what) {
    StepResult r = good;
    forge(r);
    const absl::Status status = h.scheduler.CheckResult(r);
    EXPECT_FALSE(status.ok()) << what;
    EXPECT_NE(status.message().find(what), std::string::npos) << status;
  };
  auto output = [](StepResult& r, uint64_t id) -> SequenceResult& {
    return *std::find_if(r.outputs.begin(), r.outputs.end(),
                         [&](const SequenceResult& o) { return o.sequence_id == id; });
  };
  refused([&](StepResult& r) { r.outputs.push_back(output(r, 1)); }, "a second output");
  refused(
      [&](StepResult& r) {
        r.outputs.push_back(output(r, 1));
        r.outputs.back().sequence_id = 9;
      },
      "did not ask for");
  refused([&](StepResult& r) { output(r, 1).token = -1; }, "outside the vocabulary");
  refused([&](StepResult& r) { output(r, 1).top_ids.push_back(6); }, "4 top ids");
  refused([&](StepResult& r) { output(r, 2).target_logprobs.pop_back(); }, "19 target log-probs");
  refused([&](StepResult& r) { output(r, 2).target_logprobs.resize(1 << 20); },
          "1048576 target log-probs");
  refused([&](StepResult& r) { output(r, 2).logits.assign(4, 0.0f); }, "4 logits");
  // Every output the step asked for is there, unless the replica refused the step.
  refused([&](StepResult& r) { r.outputs.pop_back(); }, "no output where the step asked for one");
  refused([&](StepResult& r) { r.outputs.clear(); }, "no output where the step asked for one");
  StepResult refused_step = good;
  refused_step.outputs.clear();
  refused_step.error = "refused";
  EXPECT_TRUE(h.scheduler.CheckResult(refused_step).ok());
  // A failed sequence carries no outputs, and that matches.
  StepResult failed = good;
  for (uint64_t id : {1, 2}) {
    SequenceResult& out = output(failed, id);
    out = SequenceResult{};
    out.sequence_id = id;
    out.error = "not finite";
  }
  EXPECT_TRUE(h.scheduler.CheckResult(failed).ok()) << h.scheduler.CheckResult(failed);
  // A step not in flight is ignored by TakeResult, so nothing to check.
  StepResult stray = good;
  stray.step_id += 100;
  stray.outputs.push_back(stray.outputs.front());
  EXPECT_TRUE(h.scheduler.CheckResult(stray).ok());
}

// With the replica's MLA cache bounded in pages, a request starts only when
// the pages of its whole length fit beside the running ones' (it waits, never
// failing halfway); one that could never fit fails at once, naming the need;
// every page comes back as requests end.
TEST(SchedulerTest, RequestsStartWhenTheirCachePagesFit) {
  SchedulerOptions options = Options(512);
  options.cache_pages = 4;  // 256 tokens
  Harness h(options);
  h.scheduler.Add(Generate(1, 100, 60));  // 160 tokens: 3 pages
  h.scheduler.Add(Generate(2, 300, 1));   // 301 tokens: 5 pages, never
  h.scheduler.Add(Generate(3, 100, 28));  // 128 tokens: 2 pages, after 1
  h.scheduler.Add(Generate(4, 50, 14));   // 64 tokens: 1 page, beside 1
  const Step first = h.Next();
  EXPECT_EQ(TokensOf(first, 1), 100);
  EXPECT_EQ(TokensOf(first, 3), 0);  // 3 + 2 pages > 4: it waits, and 4 behind it
  EXPECT_EQ(TokensOf(first, 4), 0);
  EXPECT_EQ(h.scheduler.reserved_pages(), 3);
  const SchedulerEvent* refused = h.LastOf(2);
  ASSERT_NE(refused, nullptr);
  EXPECT_EQ(refused->kind, SchedulerEvent::Kind::kFailed);
  EXPECT_EQ(refused->status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(refused->status.message(),
            "the request needs 5 MLA cache pages of 64 tokens for its prompt and max_tokens, "
            "more than the replica's 4 (--kv-cache-tokens)");
  h.Answer(first);
  h.RunToEnd();
  EXPECT_EQ(h.TokensFor(1).size(), 60u);
  EXPECT_EQ(h.TokensFor(3).size(), 28u);
  EXPECT_EQ(h.TokensFor(4).size(), 14u);
  // 3 started only once 1 had ended: no step carried both.
  for (const Step& step : h.steps) EXPECT_FALSE(TokensOf(step, 1) > 0 && TokensOf(step, 3) > 0);
  EXPECT_EQ(h.scheduler.reserved_pages(), 0);
  EXPECT_TRUE(h.scheduler.Idle());
}

// A prefix's full pages are reserved once for it and its forks, which share
// them; a fork adds its own pages (its copy of the partly filled one, and
// what it writes), and the shared pages stay reserved until the last of them
// is gone. A fork that could not run beside its prefix fails at once instead
// of waiting for pages its prefix holds. Without a bound nothing is counted.
TEST(SchedulerTest, AForkReservesOnlyThePagesItDoesNotShare) {
  for (const int64_t capacity : {int64_t{6}, int64_t{5}}) {
    SchedulerOptions options = Options(512);
    options.cache_pages = capacity;
    Harness h(options);
    SequenceRequest prefix = Generate(1, 200, 0);  // 4 pages: 3 full and a part
    prefix.kind = SequenceKind::kPrefix;
    prefix.forks = 1;
    h.scheduler.Add(prefix);
    SequenceRequest fork = Generate(2, 20, 50);  // 270 tokens: 5 pages, 3 shared
    fork.fork_from = 1;
    h.scheduler.Add(fork);
    h.Answer(h.Next());
    if (capacity == 5) {
      // Beside the prefix's 4 pages it needs 2 more: it could never start.
      const SchedulerEvent* refused = h.LastOf(2);
      ASSERT_NE(refused, nullptr);
      EXPECT_EQ(refused->status.code(), absl::StatusCode::kResourceExhausted);
      h.RunToEnd();
      EXPECT_EQ(h.scheduler.reserved_pages(), 0);
      continue;
    }
    EXPECT_EQ(h.scheduler.reserved_pages(), 4 + 2);
    h.Answer(h.Next());  // the fork starts; its prefix is released
    EXPECT_EQ(h.scheduler.reserved_pages(), 3 + 2);
    h.RunToEnd();
    EXPECT_EQ(h.TokensFor(2).size(), 50u);
    EXPECT_EQ(h.scheduler.reserved_pages(), 0);
  }

  Harness unbounded(Options(512));
  unbounded.scheduler.Add(Generate(1, 5000, 10));
  unbounded.Answer(unbounded.Next());
  EXPECT_EQ(unbounded.scheduler.reserved_pages(), 0);
}

TEST(SchedulerTest, FinishReleasesTheStateWithTheNextStep) {
  Harness h;
  h.scheduler.Add(Generate(1, 3, 1000));
  h.scheduler.Add(Generate(2, 3, 1000));
  for (int i = 0; i < 3; ++i) h.Answer(h.Next());
  EXPECT_TRUE(h.scheduler.Finish(1));
  EXPECT_FALSE(h.scheduler.Finish(1));
  const Step step = h.Next();
  EXPECT_EQ(step.release, (std::vector<uint64_t>{1}));
  EXPECT_EQ(TokensOf(step, 1), 0);
  EXPECT_EQ(TokensOf(step, 2), 1);
  // A result for a sequence finished while its step was in flight is dropped.
  EXPECT_TRUE(h.scheduler.Finish(2));
  h.Answer(step);
  EXPECT_EQ(h.TokensFor(2).size(), 3u);
  const Step last = h.Next();
  EXPECT_EQ(last.release, (std::vector<uint64_t>{2}));
  EXPECT_TRUE(last.work.empty());
  h.Answer(last);
  EXPECT_TRUE(h.scheduler.Idle());
  EXPECT_EQ(h.replica.held(), 0);
}

TEST(SchedulerTest, DeadlinesEndRequestsBeforeTheyCostMore) {
  Harness h(Options(512, 1, 0, /*max_running=*/1));
  const Clock::time_point t0{};
  SequenceRequest running = Generate(1, 3, 1000);
  running.deadline = t0 + std::chrono::seconds(10);
  SequenceRequest queued = Generate(2, 3, 10);
  queued.deadline = t0 + std::chrono::seconds(5);
  h.scheduler.Add(running);
  h.scheduler.Add(queued);
  h.Answer(h.Next(t0));
  auto failed = [&] {
    std::vector<uint64_t> ids;
    for (const auto& e : h.events) {
      if (e.kind == SchedulerEvent::Kind::kFailed) {
        EXPECT_EQ(e.status.code(), absl::StatusCode::kDeadlineExceeded);
        ids.push_back(e.id);
      }
    }
    return ids;
  };
  EXPECT_TRUE(failed().empty());
  h.Answer(h.Next(t0 + std::chrono::seconds(6)));  // the queued one expires
  EXPECT_EQ(failed(), (std::vector<uint64_t>{2}));
  const Step step = h.Next(t0 + std::chrono::seconds(11));
  EXPECT_EQ(failed(), (std::vector<uint64_t>{2, 1}));
  EXPECT_EQ(step.release, (std::vector<uint64_t>{1}));  // it held state
  EXPECT_TRUE(step.work.empty());
}

TEST(SchedulerTest, ARefusedStepFailsItsSequences) {
  Harness h;
  h.scheduler.Add(Generate(1, 3, 10));
  const Step step = h.Next();
  StepResult refused;
  refused.step_id = step.id;
  refused.error = "token id 99999 is out of range";
  Scheduler::Update update = h.scheduler.TakeResult(refused);
  ASSERT_EQ(update.events.size(), 1u);
  EXPECT_EQ(update.events[0].kind, SchedulerEvent::Kind::kFailed);
  EXPECT_NE(update.events[0].status.message().find("99999"), std::string::npos);
  // A result for a step that is not in flight is ignored.
  EXPECT_EQ(h.scheduler.TakeResult(refused).steps, 0);
}

TEST(SchedulerTest, AbandonHandsBackEveryRequestInOrderToRunElsewhere) {
  Harness h(Options(512, 1, 0, /*max_running=*/2));
  SequenceRequest scored = Generate(3, 5, 0);
  scored.kind = SequenceKind::kScore;
  h.scheduler.Add(Generate(1, 3, 10));
  h.scheduler.Add(Generate(2, 4, 10));
  h.scheduler.Add(scored);
  // Two tokens of sequences 1 and 2 come back, then a third step is lost in
  // flight (its tokens never arrive).
  h.replica.next_token = 40;
  h.Answer(h.Next());
  h.replica.next_token = 41;
  h.Answer(h.Next());
  h.Next();
  ASSERT_EQ(h.TokensFor(1), (std::vector<int32_t>{40, 41}));
  Scheduler::Abandoned abandoned = h.scheduler.Abandon();
  EXPECT_TRUE(abandoned.lost.empty());
  EXPECT_EQ(abandoned.started, (std::vector<uint64_t>{1, 2}));
  ASSERT_EQ(abandoned.rerun.size(), 3u);
  // The started ones continue from the tokens that came back.
  EXPECT_EQ(abandoned.rerun[0].id, 1u);
  EXPECT_EQ(abandoned.rerun[0].prompt, (std::vector<int32_t>{7, 7, 7, 40, 41}));
  EXPECT_EQ(abandoned.rerun[0].max_tokens, 8);
  EXPECT_EQ(abandoned.rerun[1].id, 2u);
  EXPECT_EQ(abandoned.rerun[1].prompt, (std::vector<int32_t>{7, 7, 7, 7, 40, 41}));
  EXPECT_EQ(abandoned.rerun[1].max_tokens, 8);
  // The one that never ran is as it was given.
  EXPECT_EQ(abandoned.rerun[2].id, 3u);
  EXPECT_EQ(abandoned.rerun[2].kind, SequenceKind::kScore);
  EXPECT_EQ(abandoned.rerun[2].prompt.size(), 5u);
  EXPECT_TRUE(h.scheduler.Idle());

  // On another replica the continuation prefills the longer prompt and
  // samples on from there: 8 more tokens make the 10 asked for.
  Harness other(Options(512, 1, 0, 2));
  other.scheduler.Add(abandoned.rerun[0]);
  other.RunToEnd();
  EXPECT_EQ(other.TokensFor(1).size(), 8u);
  ASSERT_NE(other.LastOf(1), nullptr);
  EXPECT_TRUE(other.LastOf(1)->finished);
  EXPECT_EQ(other.LastOf(1)->reason, FinishReason::kLength);
}

SequenceRequest Prefix(uint64_t id, int64_t tokens, int64_t forks) {
  SequenceRequest r;
  r.id = id;
  r.kind = SequenceKind::kPrefix;
  r.prompt.assign(static_cast<size_t>(tokens), 5);
  r.forks = forks;
  return r;
}

TEST(SchedulerTest, AbandonStartsAScoreOverAndLosesPrefixState) {
  Harness h(Options(/*step_tokens=*/4, 1, /*fixed_chunk=*/4, /*max_running=*/1));
  SequenceRequest scored = Generate(1, 10, 0);
  scored.kind = SequenceKind::kScore;
  h.scheduler.Add(scored);
  h.scheduler.Add(Prefix(2, 6, 1));
  h.Answer(h.Next());  // a first piece of the score
  Scheduler::Abandoned abandoned = h.scheduler.Abandon();
  ASSERT_EQ(abandoned.rerun.size(), 2u);
  EXPECT_EQ(abandoned.rerun[0].id, 1u);
  EXPECT_EQ(abandoned.rerun[0].prompt.size(), 10u);  // from the start
  EXPECT_EQ(abandoned.rerun[1].id, 2u);              // the prefix had waited
  EXPECT_EQ(abandoned.started, (std::vector<uint64_t>{1}));
  EXPECT_TRUE(abandoned.lost.empty());

  Harness p(Options(4, 1, 4, 4));
  p.scheduler.Add(Prefix(2, 6, 1));
  p.Answer(p.Next());  // part of the prefix is in the replica's state
  abandoned = p.scheduler.Abandon();
  EXPECT_TRUE(abandoned.rerun.empty());
  EXPECT_EQ(abandoned.lost, (std::vector<uint64_t>{2}));
}

SequenceRequest Fork(uint64_t id, uint64_t prefix, int64_t prompt_tokens, int64_t max_tokens) {
  SequenceRequest r = Generate(id, prompt_tokens, max_tokens);
  r.fork_from = prefix;
  return r;
}

// The index of the first step with work for `id` (steps.size() when none).
size_t FirstStepOf(const Harness& h, uint64_t id) {
  size_t i = 0;
  while (i < h.steps.size() && TokensOf(h.steps[i], id) == 0) ++i;
  return i;
}

// The index of the step that releases `id` (steps.size() when none).
size_t ReleaseOf(const Harness& h, uint64_t id) {
  for (size_t i = 0; i < h.steps.size(); ++i) {
    const auto& r = h.steps[i].release;
    if (std::find(r.begin(), r.end(), id) != r.end()) return i;
  }
  return h.steps.size();
}

TEST(SchedulerTest, ForksStartFromAPrefilledPrefixWhichIsThenReleased) {
  Harness h(Options(64, 1, /*fixed_chunk=*/64));
  h.scheduler.Add(Prefix(1, 150, 2));
  h.scheduler.Add(Fork(2, 1, 4, 3));
  h.scheduler.Add(Fork(3, 1, 6, 3));
  h.RunToEnd();
  // The prefix goes in 64 + 64 + 22 tokens and nothing of it is sampled.
  EXPECT_EQ(NonZero(h.Chunks(1)), (std::vector<int64_t>{64, 64, 22}));
  const size_t prefilled = 2;
  EXPECT_EQ(TokensOf(h.steps[prefilled], 1), 22);
  for (uint64_t id : {2, 3}) {
    const size_t first = FirstStepOf(h, id);
    ASSERT_LT(first, h.steps.size());
    EXPECT_GT(first, prefilled) << "a fork started before its prefix was whole";
    // Only its first piece forks; it continues after the prefix's 150 tokens.
    for (size_t i = 0; i < h.steps.size(); ++i) {
      for (const SequenceWork& w : h.steps[i].work) {
        if (w.sequence_id != id) continue;
        EXPECT_EQ(w.fork_from.has_value(), i == first) << "sequence " << id << ", step " << i;
        if (i == first) {
          EXPECT_EQ(*w.fork_from, 1u);
        }
      }
    }
    EXPECT_EQ(h.TokensFor(id).size(), 3u);
    // The prefix is released after the last fork has started, never before.
    EXPECT_GT(ReleaseOf(h, 1), first);
  }
  EXPECT_LT(ReleaseOf(h, 1), h.steps.size());
  bool prefilled_event = false;
  for (const auto& e : h.events) {
    prefilled_event |= e.id == 1 && e.kind == SchedulerEvent::Kind::kPrefilled;
  }
  EXPECT_TRUE(prefilled_event);
  EXPECT_TRUE(h.scheduler.Idle());
  EXPECT_EQ(h.replica.held(), 0);
}

// The replica never holds more sequences than its state slots, a held prefix
// included; prefixes leave a slot for the others, and a prefix that waits for
// one does not hold back the forks of those that run, so everything ends.
TEST(SchedulerTest, SequencesHoldingStateStayWithinTheSlots) {
  SchedulerOptions options = Options(512);
  options.state_slots = 3;
  Harness h(options);
  h.scheduler.Add(Prefix(1, 100, 2));
  h.scheduler.Add(Prefix(2, 100, 2));
  h.scheduler.Add(Prefix(3, 100, 1));  // waits: two prefixes hold all they may
  h.scheduler.Add(Generate(4, 10, 5));
  for (uint64_t id : {5, 6}) h.scheduler.Add(Fork(id, 1, 4, 3));
  for (uint64_t id : {7, 8}) h.scheduler.Add(Fork(id, 2, 4, 3));
  h.scheduler.Add(Fork(9, 3, 4, 3));
  const Step first = h.Next();
  EXPECT_GT(TokensOf(first, 1), 0);
  EXPECT_GT(TokensOf(first, 2), 0);
  EXPECT_EQ(TokensOf(first, 3), 0);
  EXPECT_EQ(TokensOf(first, 4), 0);  // behind the waiting prefix
  h.Answer(first);
  h.RunToEnd();
  for (uint64_t id : {5, 6, 7, 8, 9}) EXPECT_EQ(h.TokensFor(id).size(), 3u) << id;
  EXPECT_EQ(h.TokensFor(4).size(), 5u);
  EXPECT_LE(h.replica.peak_held(), 3);
  EXPECT_TRUE(h.scheduler.Idle());
  EXPECT_EQ(h.replica.held(), 0);
}

TEST(SchedulerTest, AForkCountsItsPrefixInItsContext) {
  ModelConfig config = Config();
  config.max_position_embeddings = 110;
  Harness h(SchedulerOptions{}, config);
  h.scheduler.Add(Prefix(1, 100, 1));
  h.scheduler.Add(Fork(2, 1, 5, 50));
  h.RunToEnd();
  EXPECT_EQ(h.LastOf(2)->reason, FinishReason::kContext);
  EXPECT_EQ(h.TokensFor(2).size(), 5u);  // 100 + 5 + 5 = the context of 110
}

TEST(SchedulerTest, APrefilledPrefixDoesNotTakeARunningPlace) {
  // One place: the prefix, then its forks one at a time; nothing waits forever.
  Harness h(Options(512, 1, 0, /*max_running=*/1));
  h.scheduler.Add(Prefix(1, 20, 3));
  for (uint64_t id = 2; id <= 4; ++id) h.scheduler.Add(Fork(id, 1, 3, 2));
  h.RunToEnd();
  for (uint64_t id = 2; id <= 4; ++id) EXPECT_EQ(h.TokensFor(id).size(), 2u) << id;
  EXPECT_TRUE(h.scheduler.Idle());
  EXPECT_EQ(h.replica.held(), 0);
}

TEST(SchedulerTest, ForksOfAGonePrefixFailAndAPrefixNoForkNeedsIsReleased) {
  Harness h;
  h.scheduler.Add(Fork(7, 99, 3, 2));  // no such prefix
  h.scheduler.Add(Prefix(1, 30, 1));
  h.scheduler.Add(Fork(2, 1, 3, 2));
  EXPECT_TRUE(h.scheduler.Finish(2));  // its only fork leaves before starting
  h.RunToEnd();
  const SchedulerEvent* failed = h.LastOf(7);
  ASSERT_NE(failed, nullptr);
  EXPECT_EQ(failed->kind, SchedulerEvent::Kind::kFailed);
  EXPECT_NE(failed->status.message().find("sequence 99"), std::string::npos) << failed->status;
  EXPECT_EQ(h.LastOf(1)->kind, SchedulerEvent::Kind::kPrefilled);
  EXPECT_TRUE(h.LastOf(1)->finished);
  EXPECT_TRUE(h.scheduler.Idle());
  EXPECT_EQ(h.replica.held(), 0);
}

// The prefix cache (Scheduler's "Prefix cache").

SchedulerOptions CacheOptions(int64_t budget = int64_t{1} << 40) {
  SchedulerOptions options = Options(512);
  options.prefix_cache_bytes = budget;
  options.page_bytes = 10;
  options.slot_bytes = 100;
  return options;
}

// `n` tokens: those of `base` first, then distinct ones from `seed`.
std::vector<int32_t> Tokens(size_t n, const std::vector<int32_t>& base = {}, int32_t seed = 1) {
  std::vector<int32_t> tokens(base.begin(), base.begin() + std::min(n, base.size()));
  while (tokens.size() < n) tokens.push_back(static_cast<int32_t>(seed * 1000 + tokens.size()));
  return tokens;
}

SequenceRequest GenerateTokens(uint64_t id, std::vector<int32_t> prompt, int64_t max_tokens = 3) {
  SequenceRequest r;
  r.id = id;
  r.prompt = std::move(prompt);
  r.max_tokens = max_tokens;
  return r;
}

// The work of sequence `id` in the first step that has any.
const SequenceWork* FirstWorkOf(const Harness& h, uint64_t id) {
  for (const Step& step : h.steps) {
    for (const SequenceWork& w : step.work) {
      if (w.sequence_id == id) return &w;
    }
  }
  return nullptr;
}

// The cache's own sequence ids in the steps, in order of first appearance.
std::vector<uint64_t> CacheIds(const Harness& h) {
  std::vector<uint64_t> ids;
  for (const Step& step : h.steps) {
    for (const SequenceWork& w : step.work) {
      if (w.sequence_id >= kCacheSequenceIds &&
          std::find(ids.begin(), ids.end(), w.sequence_id) == ids.end()) {
        ids.push_back(w.sequence_id);
      }
    }
  }
  return ids;
}

int64_t CachedTokensOf(const Harness& h, uint64_t id) {
  for (const auto& e : h.events) {
    if (e.id == id && e.kind == SchedulerEvent::Kind::kStarted) return e.cached_tokens;
  }
  return -1;
}

// Namespaces: the same prompt from another namespace misses and makes an
// entry of its own, and nothing of another namespace's is extended or
// counted to it; within a namespace it hits. An account past its quota
// gives up its own least recently used entry, not another's.
TEST(SchedulerTest, EntriesServeOnlyTheirNamespaceAndAnAccountEvictsItsOwnFirst) {
  SchedulerOptions options = CacheOptions();
  options.prefix_cache_account_bytes = 2 * (100 + 3 * 10);  // two entries of three pages
  Harness h(options);
  const std::vector<int32_t> secret = Tokens(200);
  auto request = [](uint64_t id, std::vector<int32_t> prompt, const std::string& ns,
                    const std::string& account) {
    SequenceRequest r = GenerateTokens(id, std::move(prompt));
    r.cache_namespace = ns;
    r.cache_account = account;
    return r;
  };
  h.scheduler.Add(request(1, secret, "alice\n", "alice"));
  h.RunToEnd();
  h.scheduler.Add(request(2, secret, "bob\n", "bob"));
  h.RunToEnd();
  EXPECT_EQ(CachedTokensOf(h, 2), 0) << "bob found alice's prompt";
  h.scheduler.Add(request(3, secret, "alice\nsalt", "alice"));
  h.RunToEnd();
  EXPECT_EQ(CachedTokensOf(h, 3), 0) << "another salt found the prompt";
  h.scheduler.Add(request(4, Tokens(230, secret, 4), "alice\n", "alice"));
  h.RunToEnd();
  EXPECT_EQ(CachedTokensOf(h, 4), 192);
  EXPECT_EQ(CacheIds(h).size(), 3u);  // alice's, bob's, alice's salted
  const PrefixCacheStats alice = h.scheduler.prefix_cache("alice");
  const PrefixCacheStats bob = h.scheduler.prefix_cache("bob");
  EXPECT_EQ(alice.lookups, 3);
  EXPECT_EQ(alice.hits, 1);
  EXPECT_EQ(alice.entries, 2);
  EXPECT_EQ(bob.lookups, 1);
  EXPECT_EQ(bob.hits, 0);
  EXPECT_EQ(bob.entries, 1);
  EXPECT_EQ(h.scheduler.prefix_cache("carol").lookups, 0);
  EXPECT_EQ(h.scheduler.prefix_cache().entries, 3);
  // Alice's third entry is over her quota: her oldest goes, bob's stays.
  h.scheduler.Add(request(5, Tokens(200, {}, 5), "alice\n", "alice"));
  h.RunToEnd();
  EXPECT_EQ(h.scheduler.prefix_cache("alice").entries, 2);
  EXPECT_EQ(h.scheduler.prefix_cache("alice").evictions, 1);
  EXPECT_EQ(h.scheduler.prefix_cache("bob").entries, 1);
  EXPECT_EQ(h.scheduler.prefix_cache("bob").evictions, 0);
  h.scheduler.Add(request(6, Tokens(230, secret, 6), "bob\n", "bob"));
  h.RunToEnd();
  EXPECT_EQ(CachedTokensOf(h, 6), 192) << "bob's entry went for alice's";
}

// A miss prefills the prompt's last full page into an entry and forks the
// request from it; a request sharing those pages then prefills only its own
// tokens. No event names the cache's sequences, and the requests' progress
// counts their whole prompts.
TEST(SchedulerTest, AMissMakesAnEntryAtTheLastFullPageAndAHitForksFromIt) {
  Harness h(CacheOptions());
  const std::vector<int32_t> first = Tokens(200);
  h.scheduler.Add(GenerateTokens(1, first));
  h.RunToEnd();
  ASSERT_EQ(CacheIds(h).size(), 1u);
  const uint64_t entry = CacheIds(h)[0];
  EXPECT_EQ(NonZero(h.Chunks(entry)), (std::vector<int64_t>{192}));
  const SequenceWork* own = FirstWorkOf(h, 1);
  ASSERT_NE(own, nullptr);
  ASSERT_TRUE(own->fork_from.has_value());
  EXPECT_EQ(*own->fork_from, entry);
  EXPECT_EQ(own->tokens, std::vector<int32_t>(first.begin() + 192, first.end()));
  EXPECT_EQ(h.TokensFor(1).size(), 3u);
  EXPECT_EQ(CachedTokensOf(h, 1), 0);

  const size_t before = h.steps.size();
  const std::vector<int32_t> second = Tokens(230, Tokens(192, first), 2);
  h.scheduler.Add(GenerateTokens(2, second));
  h.RunToEnd();
  const SequenceWork* hit = FirstWorkOf(h, 2);
  ASSERT_NE(hit, nullptr);
  ASSERT_TRUE(hit->fork_from.has_value());
  EXPECT_EQ(*hit->fork_from, entry);
  EXPECT_EQ(hit->tokens, std::vector<int32_t>(second.begin() + 192, second.end()));
  EXPECT_EQ(CacheIds(h).size(), 1u) << "230 tokens leave no page past the entry's three";
  EXPECT_EQ(CachedTokensOf(h, 2), 192);
  int64_t prompt_tokens = 0, prefilled = 0;
  for (const auto& e : h.events) {
    EXPECT_LT(e.id, kCacheSequenceIds) << "an event of the cache's own sequence";
    if (e.id == 2 && e.kind == SchedulerEvent::Kind::kProgress) {
      prompt_tokens = e.prompt_tokens;
      prefilled = e.prefilled;
    }
  }
  EXPECT_EQ(prompt_tokens, 230);
  EXPECT_EQ(prefilled, 230);
  EXPECT_EQ(NonZero(h.Chunks(2, before)).size(), 3u);  // 38 tokens, then two decode steps
  const PrefixCacheStats& stats = h.scheduler.prefix_cache();
  EXPECT_EQ(stats.entries, 1);
  EXPECT_EQ(stats.bytes, 100 + 3 * 10);
  EXPECT_EQ(stats.lookups, 2);
  EXPECT_EQ(stats.hits, 1);
  EXPECT_EQ(stats.cached_tokens, 192);
  EXPECT_TRUE(h.scheduler.Idle());
  EXPECT_EQ(h.replica.held(), 1);  // the entry
}

// A chat's next turn starts from the last turn's entry and makes one of its
// own that extends it: it prefills only the pages past it.
TEST(SchedulerTest, ANextTurnExtendsTheLastTurnsEntry) {
  Harness h(CacheOptions());
  const std::vector<int32_t> turn1 = Tokens(150);
  h.scheduler.Add(GenerateTokens(1, turn1));
  h.RunToEnd();
  const std::vector<int32_t> turn2 = Tokens(300, turn1, 2);
  h.scheduler.Add(GenerateTokens(2, turn2));
  h.RunToEnd();
  const std::vector<uint64_t> entries = CacheIds(h);
  ASSERT_EQ(entries.size(), 2u);
  const SequenceWork* extension = FirstWorkOf(h, entries[1]);
  ASSERT_NE(extension, nullptr);
  ASSERT_TRUE(extension->fork_from.has_value());
  EXPECT_EQ(*extension->fork_from, entries[0]);
  EXPECT_EQ(extension->tokens, std::vector<int32_t>(turn2.begin() + 128, turn2.begin() + 256));
  const SequenceWork* own = FirstWorkOf(h, 2);
  ASSERT_NE(own, nullptr);
  EXPECT_EQ(*own->fork_from, entries[1]);
  EXPECT_EQ(own->tokens, std::vector<int32_t>(turn2.begin() + 256, turn2.end()));
  EXPECT_EQ(CachedTokensOf(h, 2), 128);
  EXPECT_EQ(h.scheduler.prefix_cache().bytes, (100 + 2 * 10) + (100 + 2 * 10));
  EXPECT_EQ(h.TokensFor(2).size(), 3u);
}

// Questions about one document, each longer than a page: the first names the
// document as a prefix others will share and leaves an entry at its last
// page, which the questions after it hit; added together, before any has
// run, they still prefill the document once. Without the name, the second
// question shares only part of the first's entry and prefills the document
// again.
TEST(SchedulerTest, ANamedPrefixLeavesAnEntryAtItsLastPageForTheRequestsThatShareIt) {
  const std::vector<int32_t> document = Tokens(300);
  const auto question = [&](uint64_t id, int32_t seed, int64_t named) {
    SequenceRequest r = GenerateTokens(id, Tokens(300 + 100, document, seed));
    r.cache_prefix = named;
    return r;
  };
  for (const bool together : {false, true}) {
    SCOPED_TRACE(together ? "added together" : "one after another");
    Harness h(CacheOptions());
    for (uint64_t id = 1; id <= 3; ++id) {
      h.scheduler.Add(question(id, static_cast<int32_t>(id + 1), 300));
      if (!together) h.RunToEnd();
    }
    h.RunToEnd();
    // The document's entry (256 tokens), then one at each prompt's last
    // page (384) extending it.
    const std::vector<uint64_t> entries = CacheIds(h);
    ASSERT_EQ(entries.size(), 4u);
    EXPECT_EQ(NonZero(h.Chunks(entries[0])), (std::vector<int64_t>{256}));
    for (size_t k = 1; k < entries.size(); ++k) {
      const SequenceWork* w = FirstWorkOf(h, entries[k]);
      ASSERT_NE(w, nullptr);
      ASSERT_TRUE(w->fork_from.has_value());
      EXPECT_EQ(*w->fork_from, entries[0]);
      EXPECT_EQ(w->tokens.size(), 128u);
    }
    EXPECT_EQ(CachedTokensOf(h, 1), 0);
    EXPECT_EQ(CachedTokensOf(h, 2), 256);
    EXPECT_EQ(CachedTokensOf(h, 3), 256);
    for (uint64_t id = 1; id <= 3; ++id) EXPECT_EQ(h.TokensFor(id).size(), 3u);
  }
  // Unnamed: the second question makes the document's entry from scratch.
  Harness h(CacheOptions());
  for (uint64_t id = 1; id <= 3; ++id) {
    h.scheduler.Add(question(id, static_cast<int32_t>(id + 1), 0));
    h.RunToEnd();
  }
  EXPECT_EQ(CachedTokensOf(h, 2), 0);
  EXPECT_EQ(CachedTokensOf(h, 3), 256);
  EXPECT_EQ(NonZero(h.Chunks(CacheIds(h)[1])), (std::vector<int64_t>{256}));
}

// Entries past the budget go least recently used first, never one a request
// waits to fork from or another entry extends; an evicted entry's state is
// released with the next step.
TEST(SchedulerTest, TheCacheEvictsTheLeastRecentlyUsedEntryWithinItsBudget) {
  Harness h(CacheOptions(/*budget=*/2 * (100 + 2 * 10)));
  const std::vector<int32_t> a = Tokens(140, {}, 1), b = Tokens(140, {}, 2), c = Tokens(140, {}, 3);
  h.scheduler.Add(GenerateTokens(1, a));
  h.RunToEnd();
  h.scheduler.Add(GenerateTokens(2, b));
  h.RunToEnd();
  h.scheduler.Add(GenerateTokens(3, Tokens(150, a, 4)));  // uses a's entry: b's is older now
  h.RunToEnd();
  EXPECT_EQ(CachedTokensOf(h, 3), 128);
  h.scheduler.Add(GenerateTokens(4, c));
  h.RunToEnd();
  const std::vector<uint64_t> entries = CacheIds(h);
  ASSERT_EQ(entries.size(), 3u);
  EXPECT_LT(ReleaseOf(h, entries[1]), h.steps.size()) << "b's entry was not released";
  EXPECT_EQ(ReleaseOf(h, entries[0]), h.steps.size()) << "a's entry was released";
  EXPECT_EQ(h.scheduler.prefix_cache().evictions, 1);
  EXPECT_EQ(h.scheduler.prefix_cache().entries, 2);
  EXPECT_LE(h.scheduler.prefix_cache().bytes, 2 * (100 + 2 * 10));
  // b again: a miss.
  h.scheduler.Add(GenerateTokens(5, Tokens(150, b, 5)));
  h.RunToEnd();
  EXPECT_EQ(CachedTokensOf(h, 5), 0);
  EXPECT_EQ(h.scheduler.prefix_cache().hits, 1);
}

// When the replica's pages or slots are held by entries, the requests that
// need them evict entries instead of waiting; a soak of shared and distinct
// prefixes ends with the cache within its budget, every page it reserved
// being its entries' own, and the replica holding only the entries.
TEST(SchedulerTest, ASoakStaysWithinTheCachesBudgetAndAccountsForEveryPage) {
  SchedulerOptions options = CacheOptions(/*budget=*/1000);
  options.cache_pages = 40;
  options.state_slots = 6;
  options.max_running = 3;
  Harness h(options);
  std::mt19937 rng(7);
  std::vector<std::vector<int32_t>> documents;
  for (int d = 0; d < 4; ++d) documents.push_back(Tokens(400, {}, 10 + d));
  for (uint64_t id = 1; id <= 60; ++id) {
    const auto& doc = documents[rng() % documents.size()];
    const size_t shared = 64 * (rng() % 6);
    h.scheduler.Add(GenerateTokens(
        id, Tokens(shared + 1 + rng() % 120, Tokens(shared, doc), static_cast<int32_t>(100 + id)),
        1 + rng() % 4));
    if (rng() % 3 == 0) h.RunToEnd();
  }
  h.RunToEnd();
  for (uint64_t id = 1; id <= 60; ++id) {
    const SchedulerEvent* last = h.LastOf(id);
    ASSERT_NE(last, nullptr) << id;
    EXPECT_EQ(last->kind, SchedulerEvent::Kind::kToken) << id << ": " << last->status;
    EXPECT_TRUE(last->finished) << id;
  }
  const PrefixCacheStats& stats = h.scheduler.prefix_cache();
  EXPECT_GT(stats.hits, 0);
  EXPECT_GT(stats.evictions, 0);
  EXPECT_LE(stats.bytes, 1000);
  EXPECT_EQ(h.replica.held(), stats.entries);
  EXPECT_EQ(h.scheduler.held_sequences(), stats.entries);
  EXPECT_EQ(h.scheduler.reserved_pages(), (stats.bytes - 100 * stats.entries) / 10);
  EXPECT_LE(h.replica.peak_held(), 6);
}

// A replica lost: the requests the cache served run again as they were
// given; the entries go with the replica.
TEST(SchedulerTest, AbandonHandsBackCacheServedRequestsAsGiven) {
  Harness h(CacheOptions());
  const std::vector<int32_t> prompt = Tokens(150);
  h.scheduler.Add(GenerateTokens(1, prompt));
  h.RunToEnd();
  h.scheduler.Add(GenerateTokens(2, Tokens(170, prompt, 2), 5));
  h.Answer(h.Next());
  h.Answer(h.Next());  // it has started
  const Scheduler::Abandoned out = h.scheduler.Abandon();
  ASSERT_EQ(out.rerun.size(), 1u);
  EXPECT_TRUE(out.lost.empty());
  const SequenceRequest& again = out.rerun[0];
  EXPECT_EQ(again.id, 2u);
  EXPECT_FALSE(again.fork_from.has_value());
  const std::vector<int32_t> given = Tokens(170, prompt, 2);
  ASSERT_GE(again.prompt.size(), given.size());
  EXPECT_TRUE(std::equal(given.begin(), given.end(), again.prompt.begin()));
  EXPECT_EQ(h.scheduler.prefix_cache().entries, 0);
}

// Scoring needs every position's output: it neither reads nor fills the cache.
TEST(SchedulerTest, ScoresDoNotUseTheCache) {
  Harness h(CacheOptions());
  SequenceRequest score = GenerateTokens(1, Tokens(300));
  score.kind = SequenceKind::kScore;
  h.scheduler.Add(score);
  h.RunToEnd();
  EXPECT_TRUE(CacheIds(h).empty());
  EXPECT_EQ(h.scheduler.prefix_cache().lookups, 0);
}

}  // namespace
}  // namespace deltaserve
