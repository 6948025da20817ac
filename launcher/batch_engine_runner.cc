// `deltaserve batch` on the offline engine: in one process, or on the
// leader rank of an MPI job whose other ranks follow.
#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "launcher/batch_runners.h"
#include "runtime/common/status_macros.h"
#include "runtime/scheduler/offline_engine.h"
#include "runtime/tokenizer/text_stream.h"

namespace deltaserve {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

const char* ReasonName(FinishReason reason) {
  switch (reason) {
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kContext:
      return "context";
    case FinishReason::kLength:
      break;
  }
  return "length";
}

// A unit in the engine.
struct Running {
  BatchUnit unit;
  Clock::time_point added, started, first_token;
  bool was_started = false;
  int64_t fed = 0;  // prompt tokens sent
  GenerateOutcome generated;
  std::unique_ptr<TextStream> text;  // generate, when the model has a tokenizer
  std::vector<float> score_logprobs;

  BatchTimings Timings(Clock::time_point now) const {
    BatchTimings t;
    t.queue_s = was_started ? Seconds(added, started) : 0;
    t.time_to_first_token_s = generated.token_ids.empty() ? 0 : Seconds(added, first_token);
    t.total_s = Seconds(added, now);
    return t;
  }
};

}  // namespace

absl::Status RunBatchOnEngine(Replica& replica, const BatchModel& model,
                              const SchedulerOptions& options, BatchSource& source,
                              BatchProgress& progress) {
  const Tokenizer* const tokenizer = model.tokenizer;
  OfflineEngine engine(replica, model.config, options);
  std::map<uint64_t, Running> running;
  uint64_t next_id = 1;
  bool input_done = false;
  absl::Status failure;

  // Ends the job after a failure to read or write: the sequences in the
  // engine are dropped (their records are written by a rerun).
  auto fail = [&](absl::Status status) {
    if (failure.ok()) failure = std::move(status);
    for (const auto& [id, r] : running) engine.Finish(id);
    running.clear();
  };
  // A long document's questions arrive one after another: they are taken
  // together, the document prefilled once (a kPrefix sequence) and each
  // question forked from it. `held` is a unit read ahead of its turn.
  std::optional<BatchUnit> held;
  auto next_unit = [&]() -> absl::StatusOr<std::optional<BatchUnit>> {
    if (held) {
      std::optional<BatchUnit> unit = std::move(held);
      held.reset();
      return unit;
    }
    return source.Next();
  };
  struct Prefill {
    std::string name;
    int64_t fed = 0, total = 0;
  };
  std::map<uint64_t, Prefill> documents;  // prefixes being prefilled, for progress
  auto add = [&](BatchUnit unit, std::optional<uint64_t> fork_from) {
    Running r;
    r.unit = std::move(unit);
    r.added = Clock::now();
    const BatchUnit& u = r.unit;
    SequenceRequest s;
    s.id = next_id++;
    s.kind = u.task == BatchTask::kScore ? SequenceKind::kScore : SequenceKind::kGenerate;
    s.prompt = u.prompt;
    if (fork_from) {
      s.fork_from = fork_from;
      s.prompt.erase(s.prompt.begin(), s.prompt.begin() + u.document_tokens);
      r.fed = u.document_tokens;  // already in the prefix
    }
    if (u.task == BatchTask::kGenerate) {
      // As the API does (Coordinator::SubmitGenerate), and `generate`.
      const GenerateParams& p = u.params;
      s.sampling = p.sampling;
      s.seed = p.seed;
      s.logprobs = p.logprobs;
      s.top_logprobs = p.top_logprobs;
      s.max_tokens = p.max_tokens;
      s.stop_ids = p.stop_ids;
      if (tokenizer != nullptr) {
        r.text = std::make_unique<TextStream>(*tokenizer, p.stop);
        r.generated.has_text = true;
        if (!p.ignore_eos) {
          for (int32_t id : tokenizer->end_ids()) s.stop_ids.push_back(id);
        }
      }
      r.generated.prompt_tokens = static_cast<int64_t>(u.prompt.size());
    }
    running.emplace(s.id, std::move(r));
    engine.Add(std::move(s));
  };
  // Up to max_running units in the engine (a document's questions count
  // once they run: they wait in the engine behind the place limit).
  auto fill = [&] {
    while (failure.ok() && !input_done &&
           static_cast<int64_t>(running.size()) < options.max_running) {
      absl::StatusOr<std::optional<BatchUnit>> next = next_unit();
      if (!next.ok()) return fail(next.status());
      if (!next->has_value()) {
        input_done = true;
        return;
      }
      BatchUnit unit = std::move(**next);
      const bool forkable = unit.error.empty() && unit.document_tokens > 0 &&
                            unit.document_tokens < static_cast<int64_t>(unit.prompt.size());
      if (!forkable) {
        add(std::move(unit), std::nullopt);
        continue;
      }
      std::vector<BatchUnit> questions;
      questions.push_back(std::move(unit));
      while (true) {
        absl::StatusOr<std::optional<BatchUnit>> more = source.Next();
        if (!more.ok()) return fail(more.status());
        if (!more->has_value()) {
          input_done = true;
          break;
        }
        const BatchUnit& first = questions.front();
        BatchUnit& candidate = **more;
        const bool same = candidate.line == first.line && candidate.error.empty() &&
                          candidate.document_tokens == first.document_tokens &&
                          static_cast<int64_t>(candidate.prompt.size()) > first.document_tokens;
        if (!same) {
          held = std::move(candidate);
          break;
        }
        questions.push_back(std::move(candidate));
      }
      SequenceRequest document;
      document.id = next_id++;
      document.kind = SequenceKind::kPrefix;
      const BatchUnit& first = questions.front();
      document.prompt.assign(first.prompt.begin(), first.prompt.begin() + first.document_tokens);
      document.forks = static_cast<int64_t>(questions.size());
      documents[document.id] = {absl::StrCat("id ", first.id_json, " document"), 0,
                                first.document_tokens};
      const uint64_t prefix = document.id;
      engine.Add(std::move(document));
      for (BatchUnit& q : questions) add(std::move(q), prefix);
      if (input_done) return;
    }
  };
  auto write = [&](uint64_t id, const std::string& record, bool error) {
    auto it = running.find(id);
    const BatchUnit unit = std::move(it->second.unit);
    running.erase(it);
    if (absl::Status s = source.Write(unit, record, error); !s.ok()) return fail(s);
    fill();
  };

  auto on_event = [&](const SchedulerEvent& e) {
    if (e.kind == SchedulerEvent::Kind::kPrefilled || e.kind == SchedulerEvent::Kind::kFailed) {
      documents.erase(e.id);
    }
    auto it = running.find(e.id);
    if (it == running.end()) return;  // a document, finished by a stop string, or dropped
    Running& r = it->second;
    const auto now = Clock::now();
    switch (e.kind) {
      case SchedulerEvent::Kind::kPrefilled:  // documents only
      case SchedulerEvent::Kind::kProgress:   // on_step counts the prompt tokens sent
        return;
      case SchedulerEvent::Kind::kStarted:
        if (!r.was_started) {
          r.was_started = true;
          r.started = now;
        }
        return;
      case SchedulerEvent::Kind::kFailed:
        return write(e.id,
                     ErrorRecord(r.unit.id_json, r.unit.question, r.unit.line,
                                 std::string(e.status.message())),
                     true);
      case SchedulerEvent::Kind::kToken: {
        GenerateOutcome& g = r.generated;
        if (g.token_ids.empty()) r.first_token = now;
        g.token_ids.push_back(e.output.token);
        progress.AddGenerated(1);
        if (r.unit.params.logprobs) g.logprobs.push_back(e.output.logprob);
        if (r.unit.params.top_logprobs > 0) {
          std::vector<std::pair<int32_t, float>> top;
          for (size_t i = 0; i < e.output.top_ids.size(); ++i) {
            top.emplace_back(e.output.top_ids[i], e.output.top_logprobs[i]);
          }
          g.top_logprobs.push_back(std::move(top));
        }
        bool end = e.finished;
        if (end) {
          g.finish_reason = ReasonName(e.reason);
          g.stop = e.stop;
        }
        if (r.text != nullptr) {
          StopStrings::Output text = r.text->Add(e.output.token, e.finished);
          g.text += text.text;
          if (text.stop && !e.finished) {
            // The stop string ends it here; the engine lets it go.
            engine.Finish(e.id);
            end = true;
          }
          if (text.stop) {
            g.finish_reason = "stop";
            g.stop = *text.stop;
          }
        }
        if (end) {
          g.timings = r.Timings(now);
          if (r.unit.chat()) {
            // As the servers read a conversation's reply (a server's
            // INTERNAL error is an error record too).
            absl::StatusOr<ChatReply> reply =
                ParseReply(*model.chat, g.text, r.unit.request.prompt.chat.thinking);
            if (!reply.ok()) {
              return write(e.id,
                           ErrorRecord(r.unit.id_json, r.unit.question, r.unit.line,
                                       std::string(reply.status().message())),
                           true);
            }
            g.reply = std::move(*reply);
          }
          write(e.id, GenerateRecord(r.unit, g), false);
        }
        return;
      }
      case SchedulerEvent::Kind::kPiece: {
        const auto& lp = e.output.target_logprobs;
        r.score_logprobs.insert(r.score_logprobs.end(), lp.begin(), lp.end());
        if (!e.finished) return;
        ScoreOutcome o;
        o.token_ids = r.unit.prompt;
        // The last token has no next token to score.
        r.score_logprobs.resize(r.unit.prompt.size() - 1);
        o.logprobs = std::move(r.score_logprobs);
        o.timings = r.Timings(now);
        return write(e.id, ScoreRecord(r.unit, o), false);
      }
    }
  };

  // Progress: the prompt tokens each step carries, and where the prompt
  // with the most left to prefill is.
  auto on_step = [&](const Step& step) {
    for (const SequenceWork& w : step.work) {
      if (auto d = documents.find(w.sequence_id); d != documents.end()) {
        d->second.fed += static_cast<int64_t>(w.tokens.size());
        progress.AddPrompt(static_cast<int64_t>(w.tokens.size()));
        continue;
      }
      auto it = running.find(w.sequence_id);
      if (it == running.end()) continue;
      Running& r = it->second;
      const int64_t left = static_cast<int64_t>(r.unit.prompt.size()) - r.fed;
      const int64_t n = std::min<int64_t>(left, static_cast<int64_t>(w.tokens.size()));
      r.fed += n;
      progress.AddPrompt(n);
    }
    const Running* longest = nullptr;
    for (const auto& [id, r] : running) {
      const int64_t left = static_cast<int64_t>(r.unit.prompt.size()) - r.fed;
      if (r.fed > 0 && left > 0 &&
          (longest == nullptr ||
           left > static_cast<int64_t>(longest->unit.prompt.size()) - longest->fed)) {
        longest = &r;
      }
    }
    const Prefill* document = nullptr;
    for (const auto& [id, d] : documents) {
      if (d.fed < d.total &&
          (document == nullptr || d.total - d.fed > document->total - document->fed)) {
        document = &d;
      }
    }
    if (document != nullptr &&
        (longest == nullptr ||
         document->total - document->fed >
             static_cast<int64_t>(longest->unit.prompt.size()) - longest->fed)) {
      progress.SetPrefill(document->name, document->fed, document->total);
    } else if (longest == nullptr) {
      progress.SetPrefill("", 0, 0);
    } else {
      progress.SetPrefill(UnitName(longest->unit), longest->fed,
                          static_cast<int64_t>(longest->unit.prompt.size()));
    }
    progress.Tick();
  };

  fill();
  while (failure.ok() && !running.empty()) {
    DELTASERVE_RETURN_IF_ERROR(engine.Run(on_event, on_step));
    fill();
  }
  return failure;
}

}  // namespace deltaserve
