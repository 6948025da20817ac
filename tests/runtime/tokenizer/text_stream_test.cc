// Stop strings over streamed text, and tokens to text through them.
#include "runtime/tokenizer/text_stream.h"

#include "gtest/gtest.h"
#include "runtime/tokenizer/byte_tokenizer.h"

namespace deltaserve {
namespace {

// Feeds `pieces`, the last with last=true; returns what was emitted and the
// stop that ended it ("" when none).
std::pair<std::string, std::string> Feed(std::vector<std::string> stops,
                                         const std::vector<std::string>& pieces) {
  StopStrings matcher(std::move(stops));
  std::string emitted, stop;
  for (size_t i = 0; i < pieces.size(); ++i) {
    StopStrings::Output out = matcher.Add(pieces[i], i + 1 == pieces.size());
    emitted += out.text;
    if (out.stop) stop = *out.stop;
  }
  return {emitted, stop};
}

TEST(StopStringsTest, NoStopsPassEverythingThrough) {
  StopStrings matcher({});
  EXPECT_EQ(matcher.Add("hello", false).text, "hello");
  EXPECT_EQ(matcher.Add(" world", false).text, " world");
}

TEST(StopStringsTest, AStopAndWhatFollowsAreNotEmitted) {
  EXPECT_EQ(Feed({"END"}, {"abc", "ENDxyz", "more"}),
            std::make_pair(std::string("abc"), std::string("END")));
}

TEST(StopStringsTest, AStopSplitAcrossPiecesIsFound) {
  EXPECT_EQ(Feed({"STOP"}, {"ab S", "T", "O", "Pzz"}),
            std::make_pair(std::string("ab "), std::string("STOP")));
}

TEST(StopStringsTest, APossibleStartIsHeldBackUntilItCannotBeOne) {
  StopStrings matcher({"abc"});
  EXPECT_EQ(matcher.Add("xxab", false).text, "xx");  // "ab" may grow into "abc"
  EXPECT_EQ(matcher.Add("d", false).text, "abd");
  EXPECT_EQ(matcher.Add("a", true).text, "a");  // the text ends: nothing held
}

TEST(StopStringsTest, TheEarliestOfSeveralStopsWins) {
  EXPECT_EQ(Feed({"world", "lo w"}, {"hello world"}),
            std::make_pair(std::string("hel"), std::string("lo w")));
}

TEST(StopStringsTest, NothingAfterAStop) {
  StopStrings matcher({"x"});
  EXPECT_TRUE(matcher.Add("axb", false).stop);
  const StopStrings::Output after = matcher.Add("more", true);
  EXPECT_EQ(after.text, "");
  EXPECT_FALSE(after.stop);
}

TEST(StopStringsTest, EmptyStopsAreIgnored) {
  EXPECT_EQ(Feed({""}, {"abc"}), std::make_pair(std::string("abc"), std::string()));
}

TEST(TextStreamTest, SplitCharactersAndStopsAcrossTokens) {
  ByteTokenizer tokenizer(256);
  TextStream stream(tokenizer, {"!"});
  // "é" is two bytes, each its own token; "!" stops.
  std::string text;
  for (int32_t byte : {0x68, 0xC3}) text += stream.Add(byte, false).text;
  EXPECT_EQ(text, "h");
  text += stream.Add(0xA9, false).text;
  EXPECT_EQ(text, "h\xC3\xA9");
  const StopStrings::Output out = stream.Add('!', false);
  EXPECT_EQ(out.stop, "!");
  EXPECT_EQ(out.text, "");
  // A dangling lead byte at the end comes out as U+FFFD.
  TextStream tail(tokenizer, {});
  EXPECT_EQ(tail.Add(0xC3, true).text, "\xEF\xBF\xBD");
}

}  // namespace
}  // namespace deltaserve
