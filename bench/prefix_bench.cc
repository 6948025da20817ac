// Prefix reuse on k3-small: Q questions about one long document, answered
// (a) with the document prefilled once and its state forked for each
// question, against (b) Q independent sequences of document + question, both
// through the offline engine in one process, each --rounds times in turn (the faster
// counts). Prints markdown for
// docs/performance.md: the wall times, their ratio, and the ideal ratio from
// costs measured in the same run: with P the document's prefill alone and R
// what each question adds (the forked run less P, over Q), independent runs
// cost at least Q (P + R) and reuse P + Q R, so the ideal is
// Q (P + R) / (P + Q R).
//
//   build/bin/prefix_bench [--model DIR] [--document 16384] [--questions 4]
//                          [--question-tokens 32] [--max-tokens 32] [--threads N]
//                          [--rounds 2]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "kernels/sampling.h"
#include "kernels/threads.h"
#include "runtime/comm/host_data_communicator.h"
#include "runtime/comm/single_communicator.h"
#include "runtime/engine/replica.h"
#include "runtime/model/model.h"
#include "runtime/model/random_checkpoint.h"
#include "runtime/scheduler/offline_engine.h"

namespace deltaserve {
namespace {

using Clock = std::chrono::steady_clock;

std::vector<int32_t> Tokens(int64_t n, uint64_t seed, int64_t vocab) {
  kernels::Rng rng(seed);
  std::vector<int32_t> tokens(static_cast<size_t>(n));
  for (auto& t : tokens) t = static_cast<int32_t>(rng.Next() % static_cast<uint64_t>(vocab));
  return tokens;
}

struct Timed {
  double seconds = 0;
  std::map<uint64_t, std::vector<int32_t>> tokens;
};

Timed Run(Replica& replica, const ModelConfig& config, std::vector<SequenceRequest> requests) {
  SchedulerOptions options;
  options.step_tokens = 2048;
  options.fixed_chunk = 2048;
  OfflineEngine engine(replica, config, options);
  for (auto& r : requests) engine.Add(std::move(r));
  Timed timed;
  const auto start = Clock::now();
  const absl::Status status = engine.Run([&](const SchedulerEvent& e) {
    if (e.kind == SchedulerEvent::Kind::kFailed) {
      std::fprintf(stderr, "sequence %llu failed: %s\n", static_cast<unsigned long long>(e.id),
                   std::string(e.status.message()).c_str());
      std::exit(1);
    }
    if (e.kind == SchedulerEvent::Kind::kToken) timed.tokens[e.id].push_back(e.output.token);
  });
  timed.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  if (!status.ok()) {
    std::fprintf(stderr, "%s\n", std::string(status.message()).c_str());
    std::exit(1);
  }
  return timed;
}

}  // namespace
}  // namespace deltaserve

int main(int argc, char** argv) {
  using namespace deltaserve;
  std::string model_dir;
  int64_t document_tokens = 16384, questions = 4, question_tokens = 32, max_tokens = 32;
  int threads = 0, rounds = 2;
  for (int i = 1; i < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--help" || flag == "-h") {
      std::printf(
          "usage: prefix_bench [--model DIR] [--document 16384] [--questions 4]\n"
          "                    [--question-tokens 32] [--max-tokens 32] [--threads N]\n"
          "                    [--rounds 2]\n"
          "Q questions about one document: prefilled once and forked, against Q\n"
          "independent sequences of document + question (k3-small in /tmp by default).\n");
      return 0;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "%s needs a value (--help)\n", flag.c_str());
      return 2;
    }
    const std::string value = argv[i + 1];
    if (flag == "--model") {
      model_dir = value;
    } else if (flag == "--document") {
      document_tokens = std::stoll(value);
    } else if (flag == "--questions") {
      questions = std::stoll(value);
    } else if (flag == "--question-tokens") {
      question_tokens = std::stoll(value);
    } else if (flag == "--max-tokens") {
      max_tokens = std::stoll(value);
    } else if (flag == "--threads") {
      threads = std::stoi(value);
    } else if (flag == "--rounds") {
      rounds = std::max(1, std::stoi(value));
    } else {
      std::fprintf(stderr, "unknown flag %s (--help)\n", flag.c_str());
      return 2;
    }
  }
  kernels::SetNumThreads(threads);
  if (auto dir = BenchCheckpoint("k3-small", model_dir); dir.ok()) {
    model_dir = *dir;
  } else {
    std::fprintf(stderr, "make k3-small: %s\n", std::string(dir.status().message()).c_str());
    return 1;
  }
  auto model = Model::Load(model_dir);
  if (!model.ok()) {
    std::fprintf(stderr, "%s\n", std::string(model.status().message()).c_str());
    return 1;
  }
  const ModelConfig& config = (*model)->config();
  SingleCommunicator world;
  SingleDataCommunicator stage;
  const WorldLayout layout = *WorldLayout::Make(1, 1, 1);
  StepExecutor executor(**model, layout, world, stage);
  Replica replica(executor);

  const std::vector<int32_t> document = Tokens(document_tokens, 1, config.vocab_size);
  std::vector<std::vector<int32_t>> asked;
  for (int64_t q = 0; q < questions; ++q) {
    asked.push_back(Tokens(question_tokens, 100 + q, config.vocab_size));
  }
  // The document's prefill alone (what each reuse saves), the forked run and
  // the independent one, `rounds` times in turn; the fastest of each.
  SequenceRequest prefix;
  prefix.id = 1;
  prefix.kind = SequenceKind::kPrefix;
  prefix.prompt = document;
  std::vector<SequenceRequest> forked, independent;
  for (int64_t q = 0; q < questions; ++q) {
    SequenceRequest r;
    r.id = 10 + q;
    r.prompt = asked[q];
    r.max_tokens = max_tokens;
    r.fork_from = 1;
    forked.push_back(r);
    r.id = 100 + q;
    r.fork_from.reset();
    r.prompt = document;
    r.prompt.insert(r.prompt.end(), asked[q].begin(), asked[q].end());
    independent.push_back(r);
  }
  SequenceRequest held = prefix;
  held.forks = questions;
  forked.insert(forked.begin(), held);
  Timed alone, with, without;
  int64_t copied = 0;
  double copy_s = 0;
  for (int round = 0; round < rounds; ++round) {
    const Timed a = Run(replica, config, {prefix});
    const PipelineStats before = executor.stage().stats();
    const Timed w = Run(replica, config, forked);
    copied = executor.stage().stats().fork_bytes - before.fork_bytes;
    copy_s = executor.stage().stats().fork_s - before.fork_s;
    const Timed o = Run(replica, config, independent);
    if (round == 0 || a.seconds < alone.seconds) alone = a;
    if (round == 0 || w.seconds < with.seconds) with = w;
    if (round == 0 || o.seconds < without.seconds) without = o;
  }
  int same = 0;
  for (int64_t q = 0; q < questions; ++q)
    same += with.tokens.at(10 + q) == without.tokens.at(100 + q);

  const double per_question = std::max(0.0, (with.seconds - alone.seconds) / questions);
  const double ideal =
      questions * (alone.seconds + per_question) / (alone.seconds + questions * per_question);
  std::printf(
      "| document | questions | document prefill s | forked s | independent s | "
      "speedup | ideal | state copied | copy s | same greedy tokens |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|\n");
  std::printf(
      "| %lld | %lld x (%lld + %lld) | %.2f | %.2f | %.2f | **%.2fx** | %.2fx | %.1f MB | "
      "%.4f | %d of %lld |\n",
      static_cast<long long>(document_tokens), static_cast<long long>(questions),
      static_cast<long long>(question_tokens), static_cast<long long>(max_tokens), alone.seconds,
      with.seconds, without.seconds, without.seconds / with.seconds, ideal, copied / 1e6, copy_s,
      same, static_cast<long long>(questions));
  return same == questions ? 0 : 1;
}
