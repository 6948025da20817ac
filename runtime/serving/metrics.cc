#include "runtime/serving/metrics.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"

namespace deltaserve {
namespace {

// Registration errors are programmer errors (metric names are literals in
// the code): say which metric and stop.
[[noreturn]] void Fatal(const std::string& message) {
  std::fprintf(stderr, "deltaserve metrics: %s\n", message.c_str());
  std::abort();
}

// HELP text escaping of the text format: backslash and line feed.
std::string EscapeHelp(const std::string& help) {
  std::string out;
  out.reserve(help.size());
  for (char c : help) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

void AppendHeader(std::string& out, const std::string& name, const std::string& help,
                  const char* type) {
  absl::StrAppend(&out, "# HELP ", name, " ", EscapeHelp(help), "\n");
  absl::StrAppend(&out, "# TYPE ", name, " ", type, "\n");
}

}  // namespace

void Counter::Add(double v) {
  // !(v >= 0) also catches NaN, which would poison the total for good.
  if (!(v >= 0)) Fatal(absl::StrCat("Counter::Add(", FormatMetricValue(v), "): must be >= 0"));
  value_.fetch_add(v, std::memory_order_relaxed);
}

Histogram::Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)) {
  if (!bounds_.empty() && bounds_.back() == std::numeric_limits<double>::infinity()) {
    bounds_.pop_back();
  }
  for (size_t i = 0; i < bounds_.size(); ++i) {
    if (!std::isfinite(bounds_[i]) || (i > 0 && !(bounds_[i - 1] < bounds_[i]))) {
      Fatal(absl::StrCat("histogram bound ", i, " (", FormatMetricValue(bounds_[i]),
                         ") is not finite or not above the previous one"));
    }
  }
  buckets_ = std::make_unique<std::atomic<uint64_t>[]>(bounds_.size() + 1);
  for (size_t i = 0; i <= bounds_.size(); ++i) buckets_[i].store(0, std::memory_order_relaxed);
}

void Histogram::Observe(double v) {
  // The first bound >= v: bucket `le` counts v <= le. NaN belongs to +Inf
  // only (lower_bound would put it first, since every comparison is false).
  size_t index = bounds_.size();
  if (!std::isnan(v)) {
    index =
        static_cast<size_t>(std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin());
  }
  buckets_[index].fetch_add(1, std::memory_order_relaxed);
  sum_.fetch_add(v, std::memory_order_relaxed);
}

Histogram::Snapshot Histogram::Read() const {
  Snapshot snapshot;
  snapshot.cumulative.resize(bounds_.size() + 1);
  uint64_t running = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    running += buckets_[i].load(std::memory_order_relaxed);
    snapshot.cumulative[i] = running;
  }
  snapshot.count = running;
  snapshot.sum = sum_.load(std::memory_order_relaxed);
  return snapshot;
}

bool IsValidMetricName(std::string_view name) {
  if (name.empty() || name.substr(0, 2) == "__") return false;
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    const bool letter = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':';
    const bool digit = c >= '0' && c <= '9';
    if (!letter && !(digit && i > 0)) return false;
  }
  return true;
}

std::vector<double> LatencyBuckets() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,  1,    2.5,
          5,     10,     15,    30,   60,    120,  300, 600,  1200, 1800, 3600};
}

std::string FormatMetricValue(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  // Shortest decimal that parses back to the same double (0.1, not
  // 0.10000000000000001 as %.17g would give).
  char buffer[64];
  const std::to_chars_result result = std::to_chars(buffer, buffer + sizeof(buffer), v);
  return std::string(buffer, result.ptr);
}

struct MetricsRegistry::Family {
  enum class Type { kCounter, kGauge, kHistogram };
  Type type;
  std::string name;
  std::string help;
  std::unique_ptr<Counter> counter;
  std::unique_ptr<Gauge> gauge;
  std::unique_ptr<Histogram> histogram;
};

MetricsRegistry::MetricsRegistry() = default;
MetricsRegistry::~MetricsRegistry() = default;

void MetricsRegistry::ClaimNames(const std::string& name, bool histogram) {
  if (!IsValidMetricName(name)) {
    Fatal(absl::StrCat("invalid metric name \"", name,
                       "\": must match [a-zA-Z_:][a-zA-Z0-9_:]* and not start with __"));
  }
  std::vector<std::string> names = {name};
  if (histogram) {
    for (const char* suffix : {"_bucket", "_sum", "_count"}) names.push_back(name + suffix);
  }
  for (const std::string& n : names) {
    if (taken_.count(n) != 0) {
      Fatal(absl::StrCat("metric \"", name, "\": the name \"", n, "\" is already registered"));
    }
  }
  taken_.insert(names.begin(), names.end());
}

Counter& MetricsRegistry::AddCounter(const std::string& name, const std::string& help) {
  std::lock_guard<std::mutex> lock(mu_);
  ClaimNames(name, /*histogram=*/false);
  auto family = std::make_unique<Family>();
  family->type = Family::Type::kCounter;
  family->name = name;
  family->help = help;
  family->counter = std::make_unique<Counter>();
  Counter& counter = *family->counter;
  families_.push_back(std::move(family));
  return counter;
}

Gauge& MetricsRegistry::AddGauge(const std::string& name, const std::string& help) {
  std::lock_guard<std::mutex> lock(mu_);
  ClaimNames(name, /*histogram=*/false);
  auto family = std::make_unique<Family>();
  family->type = Family::Type::kGauge;
  family->name = name;
  family->help = help;
  family->gauge = std::make_unique<Gauge>();
  Gauge& gauge = *family->gauge;
  families_.push_back(std::move(family));
  return gauge;
}

Histogram& MetricsRegistry::AddHistogram(const std::string& name, const std::string& help,
                                         std::vector<double> bounds) {
  std::lock_guard<std::mutex> lock(mu_);
  ClaimNames(name, /*histogram=*/true);
  auto family = std::make_unique<Family>();
  family->type = Family::Type::kHistogram;
  family->name = name;
  family->help = help;
  family->histogram = std::make_unique<Histogram>(std::move(bounds));
  Histogram& histogram = *family->histogram;
  families_.push_back(std::move(family));
  return histogram;
}

std::string MetricsRegistry::Render() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::string out;
  for (const std::unique_ptr<Family>& family : families_) {
    const std::string& name = family->name;
    switch (family->type) {
      case Family::Type::kCounter:
        AppendHeader(out, name, family->help, "counter");
        absl::StrAppend(&out, name, " ", FormatMetricValue(family->counter->value()), "\n");
        break;
      case Family::Type::kGauge:
        AppendHeader(out, name, family->help, "gauge");
        absl::StrAppend(&out, name, " ", FormatMetricValue(family->gauge->value()), "\n");
        break;
      case Family::Type::kHistogram: {
        AppendHeader(out, name, family->help, "histogram");
        const Histogram& histogram = *family->histogram;
        const Histogram::Snapshot snapshot = histogram.Read();
        for (size_t i = 0; i < histogram.bounds().size(); ++i) {
          absl::StrAppend(&out, name, "_bucket{le=\"", FormatMetricValue(histogram.bounds()[i]),
                          "\"} ", snapshot.cumulative[i], "\n");
        }
        absl::StrAppend(&out, name, "_bucket{le=\"+Inf\"} ", snapshot.count, "\n");
        absl::StrAppend(&out, name, "_sum ", FormatMetricValue(snapshot.sum), "\n");
        absl::StrAppend(&out, name, "_count ", snapshot.count, "\n");
        break;
      }
    }
  }
  return out;
}

}  // namespace deltaserve
