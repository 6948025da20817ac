// The two ways `deltaserve batch` runs its units (launcher/batch_source.h):
// on the offline engine in this process (the whole model, or the leader of
// an MPI job), or as a client of a running server.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "launcher/batch_progress.h"
#include "launcher/batch_source.h"
#include "runtime/engine/replica.h"
#include "runtime/model/config.h"
#include "runtime/scheduler/scheduler.h"
#include "runtime/serving/credentials.h"
#include "runtime/tokenizer/tokenizer.h"

namespace deltaserve {

// Keeps up to `options.max_running` units in one OfflineEngine, so that
// they share its steps, adding the next as each finishes; each unit's
// record is written as it finishes. A unit gets the tokens it gets alone
// (`deltaserve generate`): the engine samples each sequence with its own
// seeded generator. The model's tokenizer may be null (no text in the
// records).
// Errors: the replica's communication, writing the output.
absl::Status RunBatchOnEngine(Replica& replica, const BatchModel& model,
                              const SchedulerOptions& options, BatchSource& source,
                              BatchProgress& progress);

struct BatchClientOptions {
  std::string server;  // HOST:PORT
  ChannelSecurity security;
  int concurrency = 8;
  // How long a request is retried while the server is unavailable or its
  // queue full; then the job stops (rerun to resume).
  double retry_s = 60;
};

// `concurrency` requests in flight over the Generation API. Requests the
// server refuses (INVALID_ARGUMENT, ...) become error records; a server
// that stays unavailable ends the job with an error, leaving the rest for a
// rerun.
absl::Status RunBatchOnServer(const BatchClientOptions& options, BatchSource& source,
                              BatchProgress& progress);

}  // namespace deltaserve
