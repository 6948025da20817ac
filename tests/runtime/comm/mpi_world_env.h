// The world communicator of a test program that runs inside an MPI job
// (*_mpirun_test.cc), made once before the tests through InitMpiWorld (which
// adopts the MPI_Init of tests/mpi_test_main.cc) and released after them.
#pragma once

#include <unistd.h>

#include <memory>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "runtime/comm/communicator.h"
#include "runtime/comm/mpi_runtime.h"

namespace deltaserve::testing {

class MpiWorldEnvironment : public ::testing::Environment {
 public:
  // `alarm_s` > 0: the whole program ends by SIGALRM after that many seconds,
  // so a hang ends the job instead of waiting for ctest's timeout.
  explicit MpiWorldEnvironment(unsigned alarm_s = 0) : alarm_s_(alarm_s) {}

  void SetUp() override {
    if (alarm_s_ > 0) alarm(alarm_s_);
    absl::StatusOr<std::unique_ptr<Communicator>> world = InitMpiWorld(nullptr, nullptr);
    status_ = world.status();
    if (world.ok()) world_ = std::move(*world);
  }
  void TearDown() override { world_.reset(); }

  Communicator* world() const { return world_.get(); }
  const absl::Status& status() const { return status_; }

  // Registers one with gtest; call once, at namespace scope.
  static MpiWorldEnvironment* Register(unsigned alarm_s = 0) {
    return static_cast<MpiWorldEnvironment*>(
        ::testing::AddGlobalTestEnvironment(new MpiWorldEnvironment(alarm_s)));
  }

 private:
  unsigned alarm_s_;
  std::unique_ptr<Communicator> world_;
  absl::Status status_;
};

}  // namespace deltaserve::testing
