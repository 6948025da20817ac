#include "runtime/tokenizer/chat_format.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "runtime/tokenizer/chat_formats.h"
#include "runtime/tokenizer/tokenizer.h"
#include "tests/test_util.h"

namespace deltaserve {
namespace {

using ojson = nlohmann::ordered_json;

// The fixture tokenizers' 676 ranks + 256 special ids, padded.
constexpr int64_t kFixtureVocab = 1024;
constexpr int32_t kFirstSpecialId = 676;

std::string SourcePath(const std::string& relative) {
  return std::string(DELTASERVE_SOURCE_DIR) + "/" + relative;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

::testing::AssertionResult Contains(const std::string& text, const std::string& part) {
  if (text.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "'" << text << "' does not contain '" << part << "'";
}

const std::set<std::string>& SpecialTokens(const std::string& format) {
  static const std::set<std::string> k3 = {"<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>"};
  static const std::set<std::string> linear = {"<|im_system|>",
                                               "<|im_user|>",
                                               "<|im_assistant|>",
                                               "<|im_middle|>",
                                               "<|im_end|>",
                                               "<|tool_calls_section_begin|>",
                                               "<|tool_calls_section_end|>",
                                               "<|tool_call_begin|>",
                                               "<|tool_call_argument_begin|>",
                                               "<|tool_call_end|>"};
  return format == "kimi_k3" ? k3 : linear;
}

std::unique_ptr<ChatFormat> Format(const std::string& name) {
  auto format = NewChatFormat(name);
  EXPECT_TRUE(format.ok()) << format.status();
  return format.ok() ? std::move(*format) : nullptr;
}

struct Fixture {
  std::string name;
  std::string format;
  ChatRequest request;
  std::string rendered;
};

const std::vector<Fixture>& Fixtures() {
  static const std::vector<Fixture> fixtures = [] {
    std::vector<Fixture> out;
    const ojson file = ojson::parse(ReadFile(SourcePath("tests/data/chat/fixtures.json")));
    for (const ojson& c : file.at("cases")) {
      Fixture f;
      f.name = c.at("name").get<std::string>();
      f.format = c.at("format").get<std::string>();
      f.rendered = c.at("rendered").get<std::string>();
      const ojson& input = c.at("input");
      auto messages = ParseChatMessages(input.at("messages").dump());
      EXPECT_TRUE(messages.ok()) << f.name << ": " << messages.status();
      if (messages.ok()) f.request.messages = *messages;
      if (input.contains("tools")) f.request.tools_json = input.at("tools").dump();
      f.request.add_generation_prompt = input.at("add_generation_prompt").get<bool>();
      if (input.contains("thinking")) f.request.thinking = input.at("thinking").get<bool>();
      if (input.contains("thinking_effort")) {
        f.request.thinking_effort = input.at("thinking_effort").get<std::string>();
      }
      out.push_back(std::move(f));
    }
    return out;
  }();
  return fixtures;
}

// ---------------------------------------------------------------------------
// Render against the templates (tools/render_chat_fixtures.py)

TEST(ChatFormatTest, RendersEveryFixtureAsTheTemplateDoes) {
  ASSERT_GE(Fixtures().size(), 30u);
  for (const Fixture& f : Fixtures()) {
    SCOPED_TRACE(f.name + " " + f.format);
    const std::unique_ptr<ChatFormat> format = Format(f.format);
    ASSERT_NE(format, nullptr);
    EXPECT_EQ(format->name(), f.format);
    auto segments = format->Render(f.request);
    ASSERT_TRUE(segments.ok()) << segments.status();
    EXPECT_EQ(RenderText(*segments), f.rendered);
    // Only the template's own markers are special; text is merged.
    for (size_t i = 0; i < segments->size(); ++i) {
      const ChatSegment& segment = (*segments)[i];
      EXPECT_FALSE(segment.text.empty());
      if (segment.special) {
        EXPECT_TRUE(SpecialTokens(f.format).count(segment.text)) << segment.text;
      } else if (i > 0) {
        EXPECT_TRUE((*segments)[i - 1].special) << "two text segments at " << i;
      }
    }
  }
}

TEST(ChatFormatTest, CoversBothFormatsAndTheirSwitches) {
  std::set<std::string> seen;
  for (const Fixture& f : Fixtures()) {
    seen.insert(f.format);
    if (f.format == "kimi_k3") seen.insert(f.request.thinking ? "k3 thinking" : "k3 plain");
    if (!f.request.tools_json.empty()) seen.insert(f.format + " tools");
  }
  EXPECT_EQ(seen, (std::set<std::string>{"kimi_k3", "kimi_linear", "k3 thinking", "k3 plain",
                                         "kimi_k3 tools", "kimi_linear tools"}));
}

TEST(ChatFormatTest, RefusesWhatTheTemplatesRefuse) {
  const auto k3 = Format("kimi_k3");
  const auto linear = Format("kimi_linear");
  ChatRequest request;
  request.messages = {{"user", "hi", "", {}, "", ""}};
  request.thinking_effort = "medium";
  auto rendered = k3->Render(request);
  ASSERT_FALSE(rendered.ok());
  EXPECT_TRUE(Contains(std::string(rendered.status().message()),
                       "thinking_effort: \"medium\" is not one of low, high, max"));
  request.thinking = false;  // the effort only counts with thinking on
  EXPECT_TRUE(k3->Render(request).ok());

  request = ChatRequest();
  request.messages = {{"user", "hi", "", {}, "", ""}, {"tool", "result", "", {}, "", ""}};
  rendered = k3->Render(request);
  ASSERT_FALSE(rendered.ok());
  EXPECT_TRUE(Contains(std::string(rendered.status().message()), "messages[1]: a Kimi K3 tool"));
  EXPECT_TRUE(linear->Render(request).ok());  // "## Return of functions.unknown:0"

  request = ChatRequest();
  request.messages = {{"assistant", "", "", {{"c1", "f", "[1, 2]"}}, "", ""}};
  rendered = k3->Render(request);
  ASSERT_FALSE(rendered.ok());
  EXPECT_TRUE(
      Contains(std::string(rendered.status().message()),
               "messages[0].tool_calls[0].function.arguments: '[1, 2]' is not a JSON object"));
  EXPECT_TRUE(linear->Render(request).ok());  // vLLM's json.loads takes a list

  request.messages[0].tool_calls[0].arguments = "{oops";
  EXPECT_TRUE(k3->Render(request).ok());  // kept as a raw JSON block
  rendered = linear->Render(request);
  ASSERT_FALSE(rendered.ok());
  EXPECT_TRUE(Contains(std::string(rendered.status().message()),
                       "messages[0].tool_calls[0].function.arguments: '{oops' is not JSON"));

  request.messages[0].tool_calls[0] = {"c1", "", "{}"};
  for (const auto* format : {k3.get(), linear.get()}) {
    rendered = format->Render(request);
    ASSERT_FALSE(rendered.ok());
    EXPECT_TRUE(Contains(std::string(rendered.status().message()),
                         "messages[0].tool_calls[0].function.name: required, a non-empty string"));
  }

  request = ChatRequest();
  request.messages = {{"robot", "beep", "", {}, "", ""}};
  for (const auto* format : {k3.get(), linear.get()}) {
    rendered = format->Render(request);
    ASSERT_FALSE(rendered.ok());
    EXPECT_TRUE(Contains(std::string(rendered.status().message()),
                         "messages[0].role: \"robot\" is not one of"));
  }

  request.messages = {{"user", "hi", "", {}, "", ""}};
  for (const char* tools : {"{\"type\": \"function\"}", "[{]"}) {
    request.tools_json = tools;
    for (const auto* format : {k3.get(), linear.get()}) {
      rendered = format->Render(request);
      ASSERT_FALSE(rendered.ok());
      EXPECT_TRUE(Contains(std::string(rendered.status().message()), "tools: "));
    }
  }
  // Tools the templates would declare to the model as something else: not
  // functions, without a name, or more than OpenAI's API takes (each was
  // once rendered as given: 5,000 tools made 388,258 prompt tokens).
  std::string many = "[";
  for (int i = 0; i <= kMaxChatTools; ++i) {
    absl::StrAppend(&many, i > 0 ? "," : "", R"({"type": "function", "function": {"name": "f"}})");
  }
  many += "]";
  for (const auto& [tools, why] : std::vector<std::pair<std::string, std::string>>{
           {R"([{"type": "function", "function": {"name": "f"}}, 3])",
            "tools[1]: must be an object"},
           {R"([{"type": "retrieval"}])", "tools[0].type: must be \"function\""},
           {R"([{"type": "function"}])", "tools[0].function: required"},
           {R"([{"type": "function", "function": {"description": "x"}}])",
            "tools[0].function.name: required, a non-empty string"},
           {many, "tools: 129 tools, over the limit of 128"}}) {
    request.tools_json = tools;
    for (const auto* format : {k3.get(), linear.get()}) {
      rendered = format->Render(request);
      ASSERT_FALSE(rendered.ok()) << tools.substr(0, 80);
      EXPECT_TRUE(Contains(std::string(rendered.status().message()), why)) << rendered.status();
    }
  }
  request.tools_json = "[]";  // no declaration, as the templates
  EXPECT_EQ(RenderText(*linear->Render(request)).find("tool_declare"), std::string::npos);
}

TEST(ChatFormatTest, WritesJsonAsPythonDoes) {
  // json.dumps(json.loads(text), ensure_ascii=False), from Python 3.11.
  const auto arguments = chat_internal::ReadToolArguments(
      "[1e15, 1e16, 0.0001, 1e-05, -0.0, 123.456, 1.5e300, 5e-324, 0.1, 0.3333333333333333, "
      "9007199254740992.0, 1e2, -2.5e-7, 12345678901234567890, 100, -0]",
      "test");
  ASSERT_TRUE(arguments.ok()) << arguments.status();
  EXPECT_EQ(arguments->python,
            "[1000000000000000.0, 1e+16, 0.0001, 1e-05, -0.0, 123.456, 1.5e+300, 5e-324, 0.1, "
            "0.3333333333333333, 9007199254740992.0, 100.0, -2.5e-07, 12345678901234567890, 100, "
            "0]");
  EXPECT_EQ(chat_internal::QuoteJson("a\"\\\n\x01\x7f \xC3\xA9\t\b\f\r"),
            "\"a\\\"\\\\\\n\\u0001\x7f \xC3\xA9\\t\\b\\f\\r\"");
  // A repeated key keeps its first place and its last value (json.loads).
  const auto repeated = chat_internal::ReadToolArguments("{\"b\": 1, \"a\": 2, \"b\": 3}", "t");
  ASSERT_TRUE(repeated.ok());
  EXPECT_EQ(repeated->python, "{\"b\": 3, \"a\": 2}");
  EXPECT_TRUE(chat_internal::IsPythonBlank(" \t\n\xC2\xA0\xE3\x80\x80"));  // NBSP, ideographic
  EXPECT_FALSE(chat_internal::IsPythonBlank(" x "));
}

// ---------------------------------------------------------------------------
// Parse: the generated part of a rendered assistant turn comes back

// The text a model generates for `reply`: the rendering of the conversation
// with it, less the rendering that ends with the generation prompt.
std::string Generated(const ChatFormat& format, const ChatMessage& reply, bool thinking) {
  ChatRequest prompt;
  prompt.messages = {{"user", "Go.", "", {}, "", ""}};
  prompt.thinking = thinking;
  prompt.tools_json = R"([{"type": "function", "function": {"name": "get_weather"}}])";
  ChatRequest full = prompt;
  full.messages.push_back(reply);
  full.add_generation_prompt = false;
  const std::string before = RenderText(*format.Render(prompt));
  const std::string after = RenderText(*format.Render(full));
  EXPECT_EQ(after.substr(0, before.size()), before);
  return after.substr(before.size());
}

TEST(ChatFormatTest, ParsesWhatItRenders) {
  ChatMessage assistant;
  assistant.role = "assistant";
  assistant.content = "Checking both.\nOne moment — 🙂";
  assistant.reasoning_content = "Two cities, two calls.";
  assistant.tool_calls = {
      {"call_1", "get_weather", R"({"city": "Paris", "days": 3, "metric": true})"},
      {"call_2", "get_weather",
       R"({"city": "Ōsaka \"Kita\" & <|sep|> in a value", "opts": {"z": [1, 2.5, null]}, "x": null})"},
      {"call_3", "noop", ""},
  };
  for (const std::string name : {"kimi_k3", "kimi_linear"}) {
    const auto format = Format(name);
    for (const bool thinking : {true, false}) {
      SCOPED_TRACE(name + (thinking ? " thinking" : " plain"));
      const ChatMessage& message = assistant;
      const std::string generated = Generated(*format, message, thinking);
      auto reply = format->Parse(generated, thinking);
      ASSERT_TRUE(reply.ok()) << reply.status() << "\n" << generated;
      EXPECT_EQ(reply->content, message.content);
      EXPECT_EQ(reply->reasoning_content,
                name == "kimi_k3" && thinking ? message.reasoning_content : "");
      ASSERT_EQ(reply->tool_calls.size(), 3u);
      for (size_t i = 0; i < 3; ++i) {
        EXPECT_EQ(reply->tool_calls[i].name, message.tool_calls[i].name);
        const std::string expected =
            message.tool_calls[i].arguments.empty() ? "{}" : message.tool_calls[i].arguments;
        EXPECT_EQ(reply->tool_calls[i].arguments, expected);
        EXPECT_EQ(reply->tool_calls[i].id,
                  name == "kimi_k3"
                      ? ""
                      : absl::StrCat("functions.", message.tool_calls[i].name, ":", i));
      }
      // Without the trailing end token, as a stop token leaves it.
      const std::string end = format->end_tokens().at(0);
      ASSERT_EQ(generated.substr(generated.size() - end.size()), end);
      auto cut = format->Parse(generated.substr(0, generated.size() - end.size()), thinking);
      ASSERT_TRUE(cut.ok()) << cut.status();
      EXPECT_EQ(cut->tool_calls.size(), 3u);
    }
  }
}

TEST(ChatFormatTest, ParsesPlainAndTruncatedReplies) {
  const auto k3 = Format("kimi_k3");
  auto reply = k3->Parse("Let me think", /*thinking=*/true);
  ASSERT_TRUE(reply.ok());
  EXPECT_EQ(reply->reasoning_content, "Let me think");
  EXPECT_EQ(reply->content, "");
  reply = k3->Parse("Hmm.<|close|>think<|sep|><|open|>response<|sep|>Half an ans", true);
  ASSERT_TRUE(reply.ok());
  EXPECT_EQ(reply->reasoning_content, "Hmm.");
  EXPECT_EQ(reply->content, "Half an ans");
  reply = k3->Parse("Use the response tag.<|close|>response<|sep|><|close|>message<|sep|>", false);
  ASSERT_TRUE(reply.ok());
  EXPECT_EQ(reply->content, "Use the response tag.");
  EXPECT_TRUE(reply->tool_calls.empty());

  const auto linear = Format("kimi_linear");
  reply = linear->Parse("Hello!<|im_end|>", false);
  ASSERT_TRUE(reply.ok());
  EXPECT_EQ(reply->content, "Hello!");
  // The section opener is optional before the first call.
  reply = linear->Parse(
      "<|tool_call_begin|>functions.f:0<|tool_call_argument_begin|> {\"a\": 1} "
      "<|tool_call_end|><|im_end|>",
      false);
  ASSERT_TRUE(reply.ok()) << reply.status();
  ASSERT_EQ(reply->tool_calls.size(), 1u);
  EXPECT_EQ(reply->tool_calls[0].name, "f");
  EXPECT_EQ(reply->tool_calls[0].id, "functions.f:0");
  EXPECT_EQ(reply->tool_calls[0].arguments, "{\"a\": 1}");
}

TEST(ChatFormatTest, NamesWhatIsWrongWithAToolCall) {
  const std::string calls =
      "<|close|>think<|sep|><|open|>response<|sep|><|close|>response<|sep|>"
      "<|open|>tools<|sep|>";
  const std::string call = "<|open|>call tool=\"f\" index=\"1\"<|sep|>";
  const struct {
    std::string generated;
    std::string error;
  } k3_cases[] = {
      {calls + call +
           "<|open|>argument key=\"n\" type=\"number\"<|sep|>ten<|close|>argument<|sep|>"
           "<|close|>call<|sep|><|close|>tools<|sep|>",
       "tool call 1 (f): argument \"n\": 'ten' is not JSON"},
      {calls + call +
           "<|open|>argument key=\"n\" type=\"number\"<|sep|>\"10\"<|close|>argument"
           "<|sep|><|close|>call<|sep|><|close|>tools<|sep|>",
       "argument \"n\": '\"10\"' is a JSON string, not number"},
      {calls + call +
           "<|open|>argument key=\"n\" type=\"int\"<|sep|>1<|close|>argument<|sep|>"
           "<|close|>call<|sep|><|close|>tools<|sep|>",
       "argument \"n\": type \"int\" is not one of string"},
      {calls + call + "<|open|>argument key=\"n\" type=\"number\"<|sep|>1",
       "tool call 1 (f): cut off in an argument"},
      {calls + call, "tool call 1 (f): cut off (no <|close|>call<|sep|>)"},
      {calls + "<|open|>call index=\"1\"<|sep|><|close|>call<|sep|>",
       "tool call 1: the call names no tool"},
      {calls + "<|open|>call tool=f<|sep|>", "tool call 1: malformed tag attributes ' tool=f'"},
      {calls + call +
           "<|open|>json type=\"object\"<|sep|>[1]<|close|>json<|sep|><|close|>call<|sep|>"
           "<|close|>tools<|sep|>",
       "its JSON block '[1]' is not a JSON object"},
      {calls + call + "<|close|>call<|sep|>", "cut off in the tool calls"},
      {calls + "oops", "tool call 1: expected <|open|>call or <|close|>tools<|sep|>, got 'oops'"},
      {"<|close|>think<|sep|>answer<|close|>response<|sep|>trailing",
       "unexpected text after the response: 'trailing'"},
  };
  const auto k3 = Format("kimi_k3");
  for (const auto& c : k3_cases) {
    SCOPED_TRACE(c.generated);
    auto reply = k3->Parse(c.generated, /*thinking=*/true);
    ASSERT_FALSE(reply.ok());
    EXPECT_EQ(reply.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(Contains(std::string(reply.status().message()), c.error));
  }

  const std::string section = "<|tool_calls_section_begin|>";
  const struct {
    std::string generated;
    std::string error;
  } linear_cases[] = {
      {section +
           "<|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{\"a\": <|tool_call_end|>"
           "<|tool_calls_section_end|>",
       "tool call 1 (f): arguments '{\"a\":' are not a JSON object"},
      {section + "<|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>[1]<|tool_call_end|>",
       "tool call 1 (f): arguments '[1]' are not a JSON object"},
      {section + "<|tool_call_begin|>get_weather<|tool_call_argument_begin|>{}<|tool_call_end|>",
       "tool call 1: id 'get_weather' is not of the form functions.<name>:<number>"},
      {section + "<|tool_call_begin|>functions.f:0<|tool_call_end|>",
       "no <|tool_call_argument_begin|> after its id 'functions.f:0'"},
      {section + "<|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{}",
       "tool call 1 (f): cut off (no <|tool_call_end|>)"},
      {section + "<|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{}<|tool_call_end|>",
       "cut off in the tool calls"},
      {section + "text", "tool call 1: expected <|tool_call_begin|>"},
      {"Done.<|im_end|>more", "unexpected text after the end of the turn: 'more'"},
  };
  const auto linear = Format("kimi_linear");
  for (const auto& c : linear_cases) {
    SCOPED_TRACE(c.generated);
    auto reply = linear->Parse(c.generated, false);
    ASSERT_FALSE(reply.ok());
    EXPECT_EQ(reply.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(Contains(std::string(reply.status().message()), c.error));
  }
}

TEST(ChatFormatTest, EndTokens) {
  EXPECT_EQ(Format("kimi_k3")->end_tokens(), std::vector<std::string>{"<|end_of_msg|>"});
  EXPECT_EQ(Format("kimi_linear")->end_tokens(), std::vector<std::string>{"<|im_end|>"});
  EXPECT_EQ(NewChatFormat("chatml").status().code(), absl::StatusCode::kNotFound);
}

// ---------------------------------------------------------------------------
// ParseChatMessages

TEST(ChatMessagesTest, ReadsTheOpenAiShape) {
  auto messages = ParseChatMessages(R"([
    {"role": "system", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
    {"role": "user", "content": "hi", "name": "ann"},
    {"role": "assistant", "content": null, "reasoning_content": "hmm", "refusal": null,
     "tool_calls": [{"id": "c1", "type": "function",
                     "function": {"name": "f", "arguments": "{\"x\": 1}"}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "42"}])");
  ASSERT_TRUE(messages.ok()) << messages.status();
  ASSERT_EQ(messages->size(), 4u);
  EXPECT_EQ((*messages)[0].content, "ab");
  EXPECT_EQ((*messages)[1].name, "ann");
  EXPECT_EQ((*messages)[2].content, "");
  EXPECT_EQ((*messages)[2].reasoning_content, "hmm");
  ASSERT_EQ((*messages)[2].tool_calls.size(), 1u);
  EXPECT_EQ((*messages)[2].tool_calls[0].id, "c1");
  EXPECT_EQ((*messages)[2].tool_calls[0].name, "f");
  EXPECT_EQ((*messages)[2].tool_calls[0].arguments, "{\"x\": 1}");
  EXPECT_EQ((*messages)[3].tool_call_id, "c1");
}

TEST(ChatMessagesTest, NamesTheBadField) {
  const struct {
    std::string json;
    std::string error;
  } cases[] = {
      {R"({"role": "user"})", "messages: must be an array, not object"},
      {"[]", "messages: empty"},
      {"[1]", "messages[0]: must be an object, not number"},
      {R"([{"role": "user", "content": "a"}, {"role": "user", "content": "b"},
           {"role": "robot", "content": "c"}])",
       "messages[2].role: \"robot\" is not one of system, user, assistant, tool"},
      {R"([{"content": "a"}])", "messages[0].role: required, a string"},
      {R"([{"role": "user", "content": "look"},
           {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}])",
       "messages[1].content[0].type: image_url: this model takes text only"},
      {R"([{"role": "user", "content": [{"type": "input_audio"}]}])",
       "messages[0].content[0].type: input_audio: this model takes text only"},
      {R"([{"role": "user", "content": [{"type": "sticker"}]}])",
       "messages[0].content[0].type: \"sticker\" is not a content part type (text)"},
      {R"([{"role": "user", "content": [{"type": "text"}]}])",
       "messages[0].content[0].text: required, a string"},
      {R"([{"role": "user", "content": 7}])", "messages[0].content: must be a string or an array"},
      {R"([{"role": "user"}])", "messages[0].content: required for a user message"},
      {R"([{"role": "user", "content": "a", "tool_calls": []}])",
       "messages[0].tool_calls: only an assistant message has one, not a user message"},
      {R"([{"role": "assistant", "content": "a", "tool_call_id": "x"}])",
       "messages[0].tool_call_id: only a tool message has one"},
      {R"([{"role": "user", "content": "a", "audio": {"id": "x"}}])",
       "messages[0].audio: not a field of a chat message"},
      {R"([{"role": "assistant", "tool_calls": [{"id": "c", "function": {"arguments": "{}"}}]}])",
       "messages[0].tool_calls[0].function.name: required, a non-empty string"},
      {R"([{"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": "f",
           "arguments": {"x": 1}}}]}])",
       "messages[0].tool_calls[0].function.arguments: must be a string of JSON"},
      {R"([{"role": "assistant", "tool_calls": [{"id": "c", "type": "code",
           "function": {"name": "f"}}]}])",
       "messages[0].tool_calls[0].type: must be \"function\""},
      {R"([{"role": "assistant", "tool_calls": [{"id": "c"}]}])",
       "messages[0].tool_calls[0].function: required"},
      {R"([{"role": "user", "content": "a"})", "not JSON"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.json);
    auto messages = ParseChatMessages(c.json);
    ASSERT_FALSE(messages.ok());
    EXPECT_EQ(messages.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(Contains(std::string(messages.status().message()), c.error));
  }
}

TEST(ChatMessagesTest, BoundsTheNumberOfMessages) {
  std::string json = "[";
  for (int64_t i = 0; i <= kMaxChatMessages; ++i) {
    absl::StrAppend(&json, i > 0 ? "," : "", R"({"role":"user","content":""})");
  }
  json += "]";
  auto messages = ParseChatMessages(json);
  ASSERT_FALSE(messages.ok());
  EXPECT_TRUE(Contains(std::string(messages.status().message()),
                       "messages: 4097 messages, over the limit of 4096"));
}

// ---------------------------------------------------------------------------
// Encoding: the template's markers are special ids, text never is

// A tokenizer directory with the fixture's ranks and `specials` at the first
// special ids.
std::string TokenizerDir(const std::string& tag, const std::vector<std::string>& specials) {
  const std::string dir = testing::TempDir(tag);
  std::filesystem::copy_file(SourcePath("tests/data/tokenizer/tiktoken.model"),
                             dir + "/tiktoken.model");
  ojson config = {{"added_tokens_decoder", ojson::object()}, {"eos_token", "[EOS]"}};
  std::vector<std::string> all = {"[BOS]", "[EOS]"};
  all.insert(all.end(), specials.begin(), specials.end());
  for (size_t i = 0; i < all.size(); ++i) {
    config["added_tokens_decoder"][std::to_string(kFirstSpecialId + i)] = {{"content", all[i]},
                                                                           {"special", true}};
  }
  WriteFile(dir + "/tokenizer_config.json", config.dump());
  return dir;
}

std::unique_ptr<Tokenizer> LoadFixtureTokenizer(const std::string& dir) {
  auto tokenizer = LoadTokenizer(dir, kFixtureVocab);
  EXPECT_TRUE(tokenizer.ok()) << tokenizer.status();
  return tokenizer.ok() ? std::move(*tokenizer) : nullptr;
}

const Fixture& FindFixture(const std::string& name, const std::string& format) {
  for (const Fixture& f : Fixtures()) {
    if (f.name == name && f.format == format) return f;
  }
  ADD_FAILURE() << "no fixture " << name << " " << format;
  return Fixtures().front();
}

TEST(EncodeChatTest, TextThatSpellsASpecialTokenStaysText) {
  const struct {
    std::string format;
    std::string fixture;
    std::string tokenizer_dir;
  } cases[] = {
      {"kimi_k3", "special_tokens_in_text/thinking", SourcePath("tests/data/tokenizer-k3")},
      {"kimi_linear", "special_tokens_in_text",
       TokenizerDir("chat_linear", std::vector<std::string>(SpecialTokens("kimi_linear").begin(),
                                                            SpecialTokens("kimi_linear").end()))},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.format);
    const auto tokenizer = LoadFixtureTokenizer(c.tokenizer_dir);
    ASSERT_NE(tokenizer, nullptr);
    const Fixture& f = FindFixture(c.fixture, c.format);
    auto segments = Format(c.format)->Render(f.request);
    ASSERT_TRUE(segments.ok()) << segments.status();
    auto ids = EncodeChat(*segments, *tokenizer);
    ASSERT_TRUE(ids.ok()) << ids.status();
    // As many special ids as the template wrote markers, though the user
    // typed more; and the ids spell the rendering back.
    const auto special_segments = std::count_if(segments->begin(), segments->end(),
                                                [](const ChatSegment& s) { return s.special; });
    const auto special_ids = std::count_if(ids->begin(), ids->end(), [](int32_t id) {
      return id >= kFirstSpecialId && id < kFirstSpecialId + 256;
    });
    EXPECT_EQ(special_ids, special_segments);
    std::string text;
    for (const int32_t id : *ids) text += *tokenizer->TokenBytes(id);
    EXPECT_EQ(text, f.rendered);
    // Encoding the rendering whole with specials allowed (what a template
    // engine's caller does) would have let the user's markers through.
    auto naive = tokenizer->Encode(f.rendered, /*allow_special=*/true);
    ASSERT_TRUE(naive.ok());
    EXPECT_GT(std::count_if(naive->begin(), naive->end(),
                            [](int32_t id) { return id >= kFirstSpecialId; }),
              special_ids);
  }
}

TEST(EncodeChatTest, NamesASpecialTokenTheTokenizerLacks) {
  // tests/data/tokenizer has <|im_end|>, <|im_user|>, <|im_middle|> but no
  // <|im_system|>, which every Kimi Linear prompt opens with.
  const auto tokenizer = LoadFixtureTokenizer(SourcePath("tests/data/tokenizer"));
  ASSERT_NE(tokenizer, nullptr);
  auto segments = Format("kimi_linear")->Render(FindFixture("no_system", "kimi_linear").request);
  ASSERT_TRUE(segments.ok());
  auto ids = EncodeChat(*segments, *tokenizer);
  ASSERT_FALSE(ids.ok());
  EXPECT_EQ(ids.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(std::string(ids.status().message()), "'<|im_system|>'"));

  // A user's "<|im_end|>" is ordinary text, the template's is id 678.
  ids =
      EncodeChat({{"<|im_user|>", true}, {"a<|im_end|>", false}, {"<|im_end|>", true}}, *tokenizer);
  ASSERT_TRUE(ids.ok()) << ids.status();
  auto text_ids = tokenizer->Encode("a<|im_end|>", /*allow_special=*/false);
  ASSERT_TRUE(text_ids.ok());
  std::vector<int32_t> expected = {679};
  expected.insert(expected.end(), text_ids->begin(), text_ids->end());
  expected.push_back(678);
  EXPECT_EQ(*ids, expected);
  EXPECT_EQ(std::count(ids->begin(), ids->end(), 678), 1);
}

// ---------------------------------------------------------------------------
// LoadChatFormat

TEST(LoadChatFormatTest, PicksTheFormatOfTheTokenizerFiles) {
  auto format = LoadChatFormat(SourcePath("tests/data/tokenizer"));
  ASSERT_TRUE(format.ok()) << format.status();
  EXPECT_EQ((*format)->name(), "kimi_linear");
  // tokenizer-k3 carries <|im_user|> and <|im_middle|> too.
  format = LoadChatFormat(SourcePath("tests/data/tokenizer-k3"));
  ASSERT_TRUE(format.ok()) << format.status();
  EXPECT_EQ((*format)->name(), "kimi_k3");

  // A chat template decides before the added tokens.
  const std::string with_template = testing::TempDir("chat_template");
  WriteFile(
      with_template + "/tokenizer_config.json",
      ojson{{"chat_template", ReadFile(SourcePath("tests/data/chat/Kimi-K3.jinja"))},
            {"added_tokens_decoder",
             {{"700", {{"content", "<|im_user|>"}}}, {"701", {{"content", "<|im_middle|>"}}}}}}
          .dump());
  format = LoadChatFormat(with_template);
  ASSERT_TRUE(format.ok()) << format.status();
  EXPECT_EQ((*format)->name(), "kimi_k3");
  const std::string jinja_file = testing::TempDir("chat_jinja");
  std::filesystem::copy_file(SourcePath("tests/data/chat/Kimi-K2-Instruct.jinja"),
                             jinja_file + "/chat_template.jinja");
  format = LoadChatFormat(jinja_file);
  ASSERT_TRUE(format.ok()) << format.status();
  EXPECT_EQ((*format)->name(), "kimi_linear");
}

TEST(LoadChatFormatTest, NamesADirectoryWithNeither) {
  const std::string empty = testing::TempDir("chat_none");
  auto format = LoadChatFormat(empty);
  ASSERT_FALSE(format.ok());
  EXPECT_EQ(format.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(Contains(std::string(format.status().message()), empty));
  EXPECT_TRUE(
      Contains(std::string(format.status().message()), "there is no tokenizer_config.json"));

  const std::string other = testing::TempDir("chat_other");
  WriteFile(
      other + "/tokenizer_config.json",
      R"({"chat_template": "{{ messages }}", "added_tokens_decoder": {"5": {"content": "<|im_user|>"}}})");
  format = LoadChatFormat(other);
  ASSERT_FALSE(format.ok());
  EXPECT_EQ(format.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(Contains(std::string(format.status().message()), other + ": no known chat format"));

  WriteFile(other + "/tokenizer_config.json", "{\"chat_template\": 3}");
  format = LoadChatFormat(other);
  ASSERT_FALSE(format.ok());
  EXPECT_EQ(format.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(
      Contains(std::string(format.status().message()), "tokenizer_config.json: chat_template"));
}

}  // namespace
}  // namespace deltaserve
