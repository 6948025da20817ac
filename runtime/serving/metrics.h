// Process metrics for Prometheus: counters, gauges and histograms kept in a
// MetricsRegistry, which renders them in the text exposition format 0.0.4
// (what a Prometheus server scrapes from /metrics; see http_server.h).
//
// Updates are lock-free atomics, cheap enough for per-request and per-step
// use from any thread. Labels are not supported: one metric, one series.
//
// Registration errors (an invalid or duplicate name, bad histogram bounds) are
// programmer errors in code that names its metrics with literals, so they
// abort with a message naming the metric rather than return a Status.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

namespace deltaserve {

// A monotonically increasing total (requests served, tokens generated).
class Counter {
 public:
  Counter() = default;
  Counter(const Counter&) = delete;
  Counter& operator=(const Counter&) = delete;

  // v must be >= 0 (a counter never goes down); a negative or NaN v aborts.
  void Add(double v = 1);
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

// A value that goes up and down (requests in flight, free KV blocks).
class Gauge {
 public:
  Gauge() = default;
  Gauge(const Gauge&) = delete;
  Gauge& operator=(const Gauge&) = delete;

  void Set(double v) { value_.store(v, std::memory_order_relaxed); }
  void Add(double v) { value_.fetch_add(v, std::memory_order_relaxed); }
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

// Observations counted into buckets with fixed upper bounds, as Prometheus
// histograms are: bucket `le=b` counts observations <= b, the implicit +Inf
// bucket counts all of them (NaN included), plus their sum.
class Histogram {
 public:
  // bounds: finite and strictly increasing (an empty list is allowed: only
  // +Inf then); a trailing +Inf is accepted and dropped, since that bucket is
  // always there. Anything else aborts.
  explicit Histogram(std::vector<double> bounds);
  Histogram(const Histogram&) = delete;
  Histogram& operator=(const Histogram&) = delete;

  void Observe(double v);

  // The finite upper bounds, without +Inf.
  const std::vector<double>& bounds() const { return bounds_; }

  // A snapshot. `cumulative[i]` counts observations <= bounds()[i]; its last
  // element (index bounds().size()) is the +Inf bucket and equals `count`.
  // Buckets and count are consistent with each other; `sum` may miss (or
  // already hold) an observation that is in flight while the snapshot is taken.
  struct Snapshot {
    std::vector<uint64_t> cumulative;
    uint64_t count = 0;
    double sum = 0;
  };
  Snapshot Read() const;

 private:
  std::vector<double> bounds_;
  // Per-bucket (not cumulative) counts: bounds_.size() + 1, the last is +Inf.
  std::unique_ptr<std::atomic<uint64_t>[]> buckets_;
  std::atomic<double> sum_{0};
};

// A Prometheus metric name: [a-zA-Z_:][a-zA-Z0-9_:]*, and not starting with
// "__" (reserved for Prometheus' own use).
bool IsValidMetricName(std::string_view name);

// Bucket upper bounds in seconds for request and step latencies: 1 ms up to an
// hour, since a million-token prefill takes minutes.
std::vector<double> LatencyBuckets();

// Owns metrics and renders them. Thread-safe: metrics may be added, updated
// and rendered concurrently. Returned references stay valid for the
// registry's lifetime. A name that is invalid, or that collides with a name
// already registered (including a histogram's _bucket/_sum/_count series),
// aborts.
class MetricsRegistry {
 public:
  MetricsRegistry();
  ~MetricsRegistry();
  MetricsRegistry(const MetricsRegistry&) = delete;
  MetricsRegistry& operator=(const MetricsRegistry&) = delete;

  Counter& AddCounter(const std::string& name, const std::string& help);
  Gauge& AddGauge(const std::string& name, const std::string& help);
  Histogram& AddHistogram(const std::string& name, const std::string& help,
                          std::vector<double> bounds);

  // All metrics in registration order, in the text exposition format 0.0.4.
  // Values print in the shortest form that reads back to the same double;
  // infinities and NaN as +Inf, -Inf and NaN.
  std::string Render() const;

 private:
  struct Family;

  // Checks `name` (and the series names a histogram adds) and claims them.
  void ClaimNames(const std::string& name, bool histogram);

  mutable std::mutex mu_;
  std::vector<std::unique_ptr<Family>> families_;  // guarded by mu_
  std::unordered_set<std::string> taken_;          // guarded by mu_
};

// `v` as Prometheus reads it back exactly: shortest round-trip decimal, or
// +Inf, -Inf, NaN. Exposed for tests and for other exporters.
std::string FormatMetricValue(double v);

}  // namespace deltaserve
