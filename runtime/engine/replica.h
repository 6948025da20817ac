// One replica's ranks running steps together. The leader (stage 0, TP rank 0)
// gets each step from the scheduler, sends it to the replica's other ranks
// without waiting (so it can start the next step while later stages still
// run this one) and runs its own part; every rank runs its stage of the step
// (StepExecutor); the output rank sends the results to the leader and every
// rank reports what it holds, which the leader gathers into the StepResult.
// The other ranks sit in Follow until the leader stops them. In one process
// (a one-rank layout) the same code runs with nothing to send.
//
// These messages go over the stage's control communicator (StageRunner::
// control(); the activations have a data communicator of their own).
// Messages between two ranks keep their order, so the leader may Start
// several steps before it Collects the oldest; message tags are those of
// runtime/engine/message_tags.h.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/comm/communicator.h"
#include "runtime/engine/step.h"
#include "runtime/engine/step_executor.h"

namespace deltaserve {

class Replica {
 public:
  // The executor (and its communicators) must outlive the replica.
  explicit Replica(StepExecutor& executor);
  ~Replica();

  bool is_leader() const;
  const WorldLayout& layout() const { return executor_.stage().layout(); }
  // Pages of this rank's MLA cache and slots of its KDA state; every rank of
  // a replica has as many when its ranks were given the same
  // --kv-cache-tokens and --kv-state-slots.
  int64_t cache_pages() const { return executor_.stage().model().state_pool().capacity_pages(); }
  int64_t state_slots() const { return executor_.stage().model().state_pool().capacity_slots(); }
  StatePoolSize state_size() const { return {cache_pages(), state_slots()}; }
  // This rank's page and slot bytes (the leader's: stage 0's).
  StateUnitBytes state_unit_bytes() const {
    const StatePool& pool = executor_.stage().model().state_pool();
    return {pool.page_bytes(), pool.slot_bytes()};
  }
  StepExecutor& executor() { return executor_; }

  // Leader: sends `step` to the other ranks and runs this rank's part. A
  // step the executor refuses is not an error here: its result says why.
  // Errors are communication failures, after which the job cannot go on,
  // and a step that feeds a sampled token (SequenceWork::feed_sampled) this
  // rank has not collected (see FeedsReady).
  absl::Status Start(const Step& step);
  // Leader: whether every token `step` feeds was sampled by a step already
  // collected; if not, Collect the older steps first.
  bool FeedsReady(const Step& step) const;
  // Leader: steps started and not yet collected.
  size_t outstanding() const { return outstanding_.size(); }
  // Leader: the oldest outstanding step's result, gathered from every rank.
  absl::StatusOr<StepResult> Collect();
  // Leader: Start then Collect every outstanding step; the last result.
  absl::StatusOr<StepResult> Run(const Step& step);
  // Leader: tells the other ranks to return from Follow (once; also done by
  // the destructor of a leader that did not).
  absl::Status Stop();

  // Every rank but the leader: runs the leader's steps until it stops.
  absl::Status Follow();

 private:
  // What each rank reports to the leader after each step.
  struct Report {
    int64_t kda_bytes = 0, mla_bytes = 0, sequences = 0;
    int32_t stage = 0;
    double compute_s = 0;
  };
  // What one rank did of a step, until the leader collects it.
  struct Local {
    uint64_t step_id = 0;
    std::string error;
    std::vector<SequenceResult> outputs;  // the output rank's
    Report report;
    std::chrono::steady_clock::time_point start;
    std::vector<uint64_t> samples;  // the sequences whose next token it samples
  };
  absl::StatusOr<Local> Execute(const Step& step);
  // Sends `bytes` to every other rank of the replica without waiting.
  absl::Status SendToFollowers(uint64_t step_id, std::string bytes);
  // Waits for the sends of steps up to `step_id`.
  absl::Status WaitForSends(uint64_t step_id);

  StepExecutor& executor_;
  std::deque<Local> outstanding_;
  // Leader: each live sequence's last token sampled by a collected step.
  std::map<uint64_t, int32_t> sampled_;
  bool stopped_ = false;
  // One step's messages in flight to the other ranks, alive until waited for.
  struct Sends {
    uint64_t step_id = 0;
    std::unique_ptr<uint64_t> size;
    std::unique_ptr<std::string> bytes;
    std::vector<std::unique_ptr<SendRequest>> requests;
  };
  std::deque<Sends> sends_;
};

}  // namespace deltaserve
