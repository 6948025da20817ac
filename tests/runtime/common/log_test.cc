#include "runtime/common/log.h"

#include <cmath>
#include <limits>
#include <regex>
#include <string>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace deltaserve {
namespace {

// Each case sets the format it reads and puts text back.
class LogTest : public ::testing::Test {
 protected:
  void TearDown() override { log::SetFormat(log::Format::kText); }
};

TEST_F(LogTest, TextLeadsWithTimeLevelAndPartAndQuotesOnlyWhatNeedsIt) {
  log::SetFormat(log::Format::kText);
  const std::string line =
      log::FormatLine(log::Level::kWarning, "coordinator", "worker 3 lost:\nlink down",
                      {{"request", "r1"},
                       {"principal", "alice smith"},
                       {"tokens", int64_t{12}},
                       {"total_s", 0.25},
                       {"error", "a \"quote\"\tand tab"}});
  const std::regex form(
      "^\\d{4}-\\d\\d-\\d\\dT\\d\\d:\\d\\d:\\d\\d\\.\\d{3}Z warning coordinator: worker 3 lost: "
      "link down request=r1 principal=\"alice smith\" tokens=12 total_s=0.25 "
      "error=\"a \\\\\"quote\\\\\"\\\\tand tab\"$");
  EXPECT_TRUE(std::regex_match(line, form)) << line;
  EXPECT_EQ(line.find('\n'), std::string::npos);
}

TEST_F(LogTest, JsonIsOneObjectWithTypedFieldsWhateverTheBytes) {
  log::SetFormat(log::Format::kJson);
  const std::string hostile = std::string("id\"\\\n\x01\x7f") + "\xff\xc3(" + "\xe2\x82\xac";
  const std::string line = log::FormatLine(log::Level::kInfo, "server", "request finished",
                                           {{"request", hostile},
                                            {"generated_tokens", int64_t{6}},
                                            {"worker", uint64_t{2}},
                                            {"ttft_s", 0.5},
                                            {"nan", std::nan("")},
                                            {"inf", std::numeric_limits<double>::infinity()}});
  EXPECT_EQ(line.find('\n'), std::string::npos) << line;
  const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
  ASSERT_TRUE(j.is_object()) << line;
  EXPECT_EQ(j["level"], "info");
  EXPECT_EQ(j["component"], "server");
  EXPECT_EQ(j["message"], "request finished");
  EXPECT_TRUE(
      std::regex_match(j["time"].get<std::string>(),
                       std::regex("^\\d{4}-\\d\\d-\\d\\dT\\d\\d:\\d\\d:\\d\\d\\.\\d{3}Z$")));
  // Quotes, backslashes and control characters escaped; a byte that is not
  // UTF-8 replaced by U+FFFD; valid UTF-8 (the euro sign) kept.
  EXPECT_EQ(j["request"],
            std::string("id\"\\\n\x01\x7f") + "\xef\xbf\xbd\xef\xbf\xbd(" + "\xe2\x82\xac");
  EXPECT_EQ(j["generated_tokens"], 6);
  EXPECT_EQ(j["worker"], 2);
  EXPECT_EQ(j["ttft_s"], 0.5);
  EXPECT_TRUE(j["nan"].is_null());
  EXPECT_TRUE(j["inf"].is_null());
}

TEST_F(LogTest, FormatNamesAreTextOrJson) {
  EXPECT_EQ(*log::ParseFormat("text"), log::Format::kText);
  EXPECT_EQ(*log::ParseFormat("json"), log::Format::kJson);
  const auto bad = log::ParseFormat("JSON");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(), "log format \"JSON\": use text or json");
}

}  // namespace
}  // namespace deltaserve
