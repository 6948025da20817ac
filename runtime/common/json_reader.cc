#include "runtime/common/json_reader.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace deltaserve {
namespace {

using json = nlohmann::json;

// Builds the tree as nlohmann::json's own parser does, without exceptions,
// keeping the path to the value being read so that a value the tree cannot
// hold is named by its field: a number out of a double's range (1e400,
// which json::parse throws out_of_range for), nesting past the limit.
class Reader final : public nlohmann::json_sax<json> {
 public:
  explicit Reader(const JsonLimits& limits) : limits_(limits) {}
  bool null() override { return Value(json(nullptr)); }
  bool boolean(bool v) override { return Value(json(v)); }
  bool number_integer(number_integer_t v) override { return Value(json(v)); }
  bool number_unsigned(number_unsigned_t v) override { return Value(json(v)); }
  bool number_float(number_float_t v, const string_t& /*text*/) override { return Value(json(v)); }
  bool string(string_t& v) override { return Value(json(std::move(v))); }
  bool binary(binary_t& v) override { return Value(json::binary(std::move(v))); }
  bool start_object(std::size_t /*elements*/) override { return Open(json::object()); }
  bool start_array(std::size_t /*elements*/) override { return Open(json::array()); }
  bool key(string_t& key) override {
    stack_.back().key = std::move(key);
    return true;
  }
  bool end_object() override { return Close(); }
  bool end_array() override { return Close(); }
  bool parse_error(std::size_t /*position*/, const std::string& token,
                   const json::exception& e) override {
    if (e.id == 406) {  // out_of_range.406: the number overflows a double
      error_ =
          absl::StrCat(Field(), ": ", Clipped(token), ": a number out of the range of a double");
      return false;
    }
    // "[json.exception.parse_error.101] parse error at ...": the part after
    // the bracket.
    std::string what = e.what();
    if (const size_t at = what.find("] "); at != std::string::npos) what = what.substr(at + 2);
    error_ = absl::StrCat("not JSON: ", what);
    return false;
  }

  const std::string& error() const { return error_; }
  json Take() { return std::move(root_); }

 private:
  struct Level {
    json* value;
    std::string key;   // an object: the key being read
    size_t index = 0;  // an array: the element being read
  };

  static std::string Clipped(const std::string& text) {
    return text.size() > 40 ? text.substr(0, 37) + "..." : text;
  }
  // Where the value being read sits: "temperature", "questions[1][0]".
  std::string Field() const {
    std::string field;
    for (const Level& level : stack_) {
      if (level.value->is_array()) {
        absl::StrAppend(&field, "[", level.index, "]");
      } else {
        absl::StrAppend(&field, field.empty() ? "" : ".", level.key);
      }
    }
    return field.empty() ? limits_.root : field;
  }
  // Places a value (a scalar, or an empty container to be filled) and
  // returns where it is.
  json* Place(json&& v) {
    ++values_;
    if (stack_.empty()) {
      root_ = std::move(v);
      return &root_;
    }
    Level& top = stack_.back();
    if (top.value->is_array()) {
      top.value->push_back(std::move(v));
      return &top.value->back();
    }
    json& slot = (*top.value)[top.key];
    slot = std::move(v);
    return &slot;
  }
  void Next() {
    if (!stack_.empty() && stack_.back().value->is_array()) ++stack_.back().index;
  }
  bool Counted() {
    if (limits_.max_values >= 0 && values_ >= limits_.max_values) {
      error_ = absl::StrCat(limits_.root, ": more than ", limits_.max_values, " values, the limit");
      return false;
    }
    return true;
  }
  bool Value(json&& v) {
    if (!Counted()) return false;
    Place(std::move(v));
    Next();
    return true;
  }
  bool Open(json&& container) {
    if (static_cast<int>(stack_.size()) >= limits_.max_depth) {
      error_ =
          absl::StrCat(Field(), ": nested deeper than the limit of ", limits_.max_depth, " levels");
      return false;
    }
    if (!Counted()) return false;
    // The parent does not change until this container is closed, so the
    // pointer stays valid.
    stack_.push_back(Level{Place(std::move(container)), "", 0});
    return true;
  }
  bool Close() {
    stack_.pop_back();
    Next();
    return true;
  }

  const JsonLimits& limits_;
  json root_;
  std::vector<Level> stack_;
  int64_t values_ = 0;
  std::string error_;
};

}  // namespace

absl::StatusOr<json> ParseJson(std::string_view text, const JsonLimits& limits) {
  Reader reader(limits);
  if (!json::sax_parse(text, &reader)) return absl::InvalidArgumentError(reader.error());
  return reader.Take();
}

}  // namespace deltaserve
