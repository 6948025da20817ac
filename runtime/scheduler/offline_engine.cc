#include "runtime/scheduler/offline_engine.h"

#include "runtime/common/status_macros.h"

namespace deltaserve {

OfflineEngine::OfflineEngine(Replica& replica, const ModelConfig& config, SchedulerOptions options)
    : replica_(replica), scheduler_(config, options) {}

void OfflineEngine::Add(SequenceRequest request) { scheduler_.Add(std::move(request)); }

bool OfflineEngine::Finish(uint64_t id) { return scheduler_.Finish(id); }

absl::Status OfflineEngine::Run(const std::function<void(const SchedulerEvent&)>& on_event,
                                const std::function<void(const Step&)>& on_step) {
  auto deliver = [&](const std::vector<SchedulerEvent>& events) {
    for (const SchedulerEvent& e : events) on_event(e);
  };
  auto collect = [&]() -> absl::Status {
    DELTASERVE_ASSIGN_OR_RETURN(StepResult result, replica_.Collect());
    deliver(scheduler_.TakeResult(std::move(result)).events);
    return absl::OkStatus();
  };
  const size_t stages = static_cast<size_t>(replica_.layout().pp);
  while (!scheduler_.Idle()) {
    if (scheduler_.CanSchedule()) {
      std::vector<SchedulerEvent> events;
      std::optional<Step> step = scheduler_.Schedule(Scheduler::Clock::now(), &events);
      deliver(events);
      if (step) {
        if (on_step) on_step(*step);
        DELTASERVE_RETURN_IF_ERROR(replica_.Start(*step));
        // With more to come, only the older steps are collected: the later
        // stages are still working on them while this rank starts the next.
        const size_t keep = step->more_coming ? stages - 1 : 0;
        while (replica_.outstanding() > keep) DELTASERVE_RETURN_IF_ERROR(collect());
        continue;
      }
      // No step, but requests ended (one the cache could never hold fails
      // before it starts): see what is left.
      if (!events.empty()) continue;
    }
    if (replica_.outstanding() == 0) {
      return absl::InternalError("the scheduler has work but makes no step");
    }
    DELTASERVE_RETURN_IF_ERROR(collect());
  }
  return absl::OkStatus();
}

absl::Status OfflineEngine::ClearPrefixCache() {
  scheduler_.ClearPrefixCache();
  return Run([](const SchedulerEvent&) {});
}

}  // namespace deltaserve
