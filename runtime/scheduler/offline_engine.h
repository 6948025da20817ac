// `deltaserve generate` and `score` on the serving engine: the scheduler and
// the replica that the coordinator and its workers use, driven in this
// process with no coordinator in between (the way vLLM's offline API shares
// the server's engine). On an MPI job the leader rank runs the engine and the
// other ranks follow it (Replica::Follow); in one process the replica is the
// whole model.
#pragma once

#include <functional>

#include "absl/status/status.h"
#include "runtime/engine/replica.h"
#include "runtime/model/config.h"
#include "runtime/scheduler/scheduler.h"

namespace deltaserve {

class OfflineEngine {
 public:
  // The replica must be the leader's and outlive the engine.
  OfflineEngine(Replica& replica, const ModelConfig& config, SchedulerOptions options);

  void Add(SequenceRequest request);
  // Ends a sequence before the scheduler would (a stop string matched, in
  // the caller's text); its state is released with the next step and no
  // more of its events come. False when it is not here.
  bool Finish(uint64_t id);
  // Runs steps until every sequence has ended, handing each event (tokens,
  // scored pieces, failures) to `on_event` as it comes; `on_step`, when
  // given, sees each step as it goes out (for progress: the prompt tokens it
  // carries). Both may call Add and Finish: a sequence added there runs in
  // this same Run. Errors are communication failures. The replica's other
  // ranks keep following until the replica is stopped.
  absl::Status Run(const std::function<void(const SchedulerEvent&)>& on_event,
                   const std::function<void(const Step&)>& on_step = nullptr);
  // Releases the replica's state of the prefix cache's entries (with
  // options.prefix_cache_bytes > 0 they outlive Run, for the sequences of
  // the next one): before another engine drives the same replica.
  absl::Status ClearPrefixCache();

 private:
  Replica& replica_;
  Scheduler scheduler_;
};

}  // namespace deltaserve
