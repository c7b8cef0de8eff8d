// DeepSpeed-Chat's data pipeline and steps 1-2 on the real HH-RLHF files and
// stories260K: loaders and their error reports, data_split, tokenization,
// batch layouts, SFT and reward-model training.
#include <doctest/doctest.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <thread>
#include <type_traits>

#include "actors/dschat_common.h"
#include "actors/node_models.h"
#include "models/decoder.h"
#include "models/rlhf/dschat_data.h"
#include "models/rlhf/dschat_steps.h"
#include "models/train/ds_config.h"
#include "models/hf.h"
#include "models/llama2c.h"
#include "models/train/lr_schedule.h"
#include "runtime/util/assets.h"
#include "models/train/zero.h"
#include "models/tokenizer.h"
#include "test_ranks.h"
#include "test_util.h"

using namespace flowrun;
using namespace flowrun::dschat;
namespace fs = std::filesystem;

namespace {

std::string dschat_path() { return asset_path("data/hh-rlhf/harmless-base-test.dschat.jsonl").string(); }
std::string raw_path() { return asset_path("data/hh-rlhf/harmless-base-test.jsonl.gz").string(); }

struct temp_dir {
  fs::path path;
  explicit temp_dir(const std::string& name) {
    path = fs::temp_directory_path() / ("flowrun_test_dschat_" + std::to_string(::getpid()) + "_" + name);
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~temp_dir() { fs::remove_all(path); }
  std::string write(const std::string& name, const std::string& text) const {
    auto p = path / name;
    std::ofstream(p, std::ios::binary) << text;
    return p.string();
  }
  std::string write_gz(const std::string& name, const std::string& text) const {
    auto p = (path / name).string();
    gzFile f = gzopen(p.c_str(), "wb");
    REQUIRE(f != nullptr);
    REQUIRE(gzwrite(f, text.data(), static_cast<unsigned>(text.size())) == static_cast<int>(text.size()));
    gzclose(f);
    return p;
  }
};

std::vector<int64_t> bad_lines(const load_report& r) {
  std::vector<int64_t> v;
  for (const auto& b : r.malformed) v.push_back(b.line);
  return v;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

std::vector<int32_t> ints(const tensor& t) {
  const int32_t* p = t.data<int32_t>();
  return std::vector<int32_t>(p, p + t.numel());
}

std::vector<int64_t> iota(int64_t a, int64_t b) {
  std::vector<int64_t> v;
  for (int64_t i = a; i < b; ++i) v.push_back(i);
  return v;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

TEST_CASE("loaders: the real HH-RLHF files, DS-Chat form and raw dialogues split at the last Assistant turn") {
  auto ds = load_source(dschat_path());
  MESSAGE(ds.report.summary());
  CHECK(ds.report.format == data_format::prompt_chosen_rejected);
  CHECK(ds.rows.size() == 2307);
  CHECK(ds.report.malformed.empty());
  CHECK(ds.report.blank == 0);
  for (const auto& r : ds.rows) {
    REQUIRE(r.prompt.size() >= 12);
    CHECK(r.prompt.substr(r.prompt.size() - 12) == "\n\nAssistant:");
  }

  auto raw = load_source(raw_path());
  MESSAGE(raw.report.summary());
  CHECK(raw.report.format == data_format::hh_rlhf_raw);
  CHECK(raw.report.lines == 2312);
  CHECK(raw.rows.size() == 2307);
  CHECK(raw.report.malformed.empty());
  CHECK(raw.report.prompt_mismatch_lines == std::vector<int64_t>{1255, 1689, 1951, 1953, 2037});
  // the raw split reproduces the DS-Chat file row for row
  REQUIRE(raw.rows.size() == ds.rows.size());
  int64_t same = 0;
  for (size_t i = 0; i < ds.rows.size(); ++i)
    same += raw.rows[i].prompt == ds.rows[i].prompt && raw.rows[i].chosen == ds.rows[i].chosen &&
            raw.rows[i].rejected == ds.rows[i].rejected;
  CHECK(same == 2307);
  CHECK(raw.rows[0].prompt == ds.rows[0].prompt);
  CHECK(raw.rows[0].chosen.rfind(" No, sorry!", 0) == 0);

  // the {prompt, chosen} reading of the same file ignores "rejected"
  auto pc = load_source(dschat_path(), data_format::prompt_chosen);
  CHECK(pc.rows.size() == 2307);
  CHECK(pc.rows[5].rejected.empty());
  CHECK(pc.rows[5].chosen == ds.rows[5].chosen);
}

TEST_CASE("loaders: malformed lines are counted and reported with their line numbers") {
  temp_dir tmp("bad");
  const std::string good = R"({"prompt": "\n\nHuman: hi\n\nAssistant:", "chosen": " Hello.", "rejected": " Go away."})";
  std::string text = good + "\n" +                                          // 1 ok
                     R"({"prompt": "x", "chosen": )" + "\n" +                // 2 bad JSON
                     R"({"prompt": "x", "chosen": " a"})" + "\n" +           // 3 missing rejected
                     R"({"prompt": "x", "chosen": "", "rejected": " b"})" + "\n" +  // 4 empty answer
                     R"({"prompt": "x", "chosen": 7, "rejected": " b"})" + "\n" +   // 5 not a string
                     "   \n" +                                               // 6 blank
                     "[1, 2]\n" +                                            // 7 not an object
                     good + "\r\n";                                          // 8 ok (CRLF)
  auto src = load_source(tmp.write("mixed.jsonl", text));
  const auto& r = src.report;
  MESSAGE(r.summary());
  CHECK(src.rows.size() == 2);
  CHECK(r.lines == 8);
  CHECK(r.blank == 1);
  CHECK(bad_lines(r) == std::vector<int64_t>{2, 3, 4, 5, 7});
  CHECK(r.malformed[0].reason.rfind("bad JSON", 0) == 0);
  CHECK(r.malformed[1].reason == "missing key \"rejected\"");
  CHECK(r.malformed[2].reason == "empty \"chosen\"");
  CHECK(r.malformed[3].reason == "\"chosen\" is number, not a string");
  CHECK(r.malformed[4].reason.find("not a JSON object") != std::string::npos);
  CHECK(r.summary().find("5 malformed (line 2: bad JSON") != std::string::npos);
  CHECK(r.summary().find("), skipped: fix or remove those lines to use them") != std::string::npos);
  CHECK(src.rows[1].chosen == " Hello.");

  // a bad line's bytes that are not UTF-8 are quoted as escapes (a raw 0xff made the log a "binary file" to grep)
  {
    auto bin = load_source(tmp.write("bin.jsonl", good + "\n{\"prompt\": \"\xff\xfe\", \"chosen\": \"x\"}\n"));
    REQUIRE(bin.report.malformed.size() == 1);
    const std::string why = bin.report.malformed[0].reason;
    MESSAGE(why);
    CHECK(why.rfind("bad JSON", 0) == 0);
    CHECK(why.find('\xff') == std::string::npos);
    CHECK(why.find("\\xff") != std::string::npos);
  }
  // the first line decides the layout (a pairs file with some {prompt, chosen} lines trains SFT on every row), and the
  // report counts each layout's lines and names the deciding line, for the step that cannot read it
  {
    const std::string pc = R"({"prompt": "x", "chosen": " a"})";
    auto first = load_source(tmp.write("first.jsonl", "\n" + pc + "\n" + good + "\n" + good + "\n"));
    CHECK(first.report.format == data_format::prompt_chosen);
    CHECK(first.report.layout_line == 2);
    CHECK(first.rows.size() == 3);  // a pair's prompt and chosen are a prompt/chosen row
    CHECK(first.report.layouts.at(data_format::prompt_chosen) == 1);
    CHECK(first.report.layouts.at(data_format::prompt_chosen_rejected) == 2);
    CHECK(load_source(tmp.write("pairs.jsonl", good + "\n" + pc + "\n")).report.layout_line == 1);
    // a raw HH-RLHF first line makes the {prompt, chosen, rejected} lines malformed: the summary says why
    const std::string raw = R"({"chosen": "\n\nHuman: a?\n\nAssistant: yes", "rejected": "\n\nHuman: a?\n\nAssistant: no"})";
    const auto m = load_source(tmp.write("rawfirst.jsonl", raw + "\n" + good + "\n" + good + "\n")).report;
    CHECK(m.format == data_format::hh_rlhf_raw);
    CHECK(m.summary().find("(2 of the lines hold prompt/chosen/rejected rows: line 1, the first, decided the layout "
                           "raw HH-RLHF chosen/rejected dialogues)") != std::string::npos);
  }

  // no usable line: an error naming the file and the first bad lines with reasons
  auto none = tmp.write("none.jsonl", std::string(R"({"prompt": "x", "chosen": "", "rejected": "y"})") + "\n{oops\n");
  auto msg = error_of([&] { load_source(none); });
  MESSAGE(msg);
  CHECK(msg.find(none) != std::string::npos);
  CHECK(msg.find("no usable line") != std::string::npos);
  CHECK(msg.find("line 1: empty \"chosen\"") != std::string::npos);
  CHECK(msg.find("line 2: bad JSON") != std::string::npos);
  // (a file that is one JSON list is read as rows: the test case below)
  const std::string folder = error_of([&] { load_source(tmp.path.string()); });
  CHECK(folder.find("DS-Chat local/jsonfile folder: give its data/train.json itself") != std::string::npos);
  CHECK(folder.find("jq") == std::string::npos);
  // a layout that cannot be told, and a missing file
  CHECK(error_of([&] { load_source(tmp.write("keys.jsonl", "{\"a\": 1}\n")); }).find("cannot tell the data layout") !=
        std::string::npos);
  CHECK(error_of([&] { load_source((tmp.path / "nope.jsonl").string()); }).find("nope.jsonl: cannot open") !=
        std::string::npos);
  // a folder given as the data: said so, not reported as a damaged gzip file
  std::filesystem::create_directories(tmp.path / "adir");
  const auto dir_msg = error_of([&] { load_source((tmp.path / "adir").string()); });
  CHECK(dir_msg.find("adir: is a folder, not a data file") != std::string::npos);
  CHECK(dir_msg.find("gzip") == std::string::npos);

  // raw HH-RLHF dialogues, gzip: mismatched prompts are dropped and counted, a dialogue
  // without an Assistant turn or with an empty last answer is malformed
  const std::string raw_text =
      R"({"chosen": "\n\nHuman: a?\n\nAssistant: b\n\nHuman: c?\n\nAssistant: yes", "rejected": "\n\nHuman: a?\n\nAssistant: b\n\nHuman: c?\n\nAssistant: no"})"
      "\n"
      R"({"chosen": "\n\nHuman: a?\n\nAssistant: one", "rejected": "\n\nHuman: z?\n\nAssistant: two"})"
      "\n"
      R"({"chosen": "\n\nHuman: no turn", "rejected": "\n\nHuman: no turn\n\nAssistant: x"})"
      "\n"
      R"({"chosen": "\n\nHuman: q\n\nAssistant:", "rejected": "\n\nHuman: q\n\nAssistant: x"})"
      "\n";
  auto rawsrc = load_source(tmp.write_gz("raw.jsonl.gz", raw_text));
  MESSAGE(rawsrc.report.summary());
  CHECK(rawsrc.report.format == data_format::hh_rlhf_raw);
  REQUIRE(rawsrc.rows.size() == 1);
  CHECK(rawsrc.rows[0].prompt == "\n\nHuman: a?\n\nAssistant: b\n\nHuman: c?\n\nAssistant:");
  CHECK(rawsrc.rows[0].chosen == " yes");
  CHECK(rawsrc.rows[0].rejected == " no");
  CHECK(rawsrc.report.prompt_mismatch_lines == std::vector<int64_t>{2});
  CHECK(bad_lines(rawsrc.report) == std::vector<int64_t>{3, 4});
  CHECK(rawsrc.report.summary().find("1 dropped: prompts differ (lines 2)") != std::string::npos);
  // the same text uncompressed reads the same
  CHECK(load_source(tmp.write("raw.jsonl", raw_text)).rows.size() == 1);
  // a truncated gzip is an error, not a short file
  {
    std::ifstream in(tmp.path / "raw.jsonl.gz", std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    auto cut = tmp.write("cut.jsonl.gz", bytes.substr(0, bytes.size() / 2));
    CHECK(error_of([&] { load_source(cut); }).find("cut.jsonl.gz") != std::string::npos);
  }

  // {prompt, chosen} data cannot feed step 2
  auto sft_only = load_source(tmp.write("sft.jsonl", R"({"prompt": "p", "chosen": " c"})" "\n"));
  CHECK(sft_only.report.format == data_format::prompt_chosen);
  auto tok = load_tokenizer(test::tokenizer_path());
  CHECK(error_of([&] { make_rm_examples(sft_only.rows, *tok, {}); }).find("no rejected answer") != std::string::npos);

  // {prompt} rows alone (TRL's and OpenRLHF's RL prompt datasets): step 3's prompts; steps 1-2 refuse
  // them by name (such a file was refused as having no prompt key)
  auto prompts = load_source(tmp.write("prompts.jsonl", R"({"prompt": "p1", "source": "x"})" "\n"
                                                        R"({"prompt": "p2"})" "\n"));
  CHECK(prompts.report.format == data_format::prompt_only);
  REQUIRE(prompts.rows.size() == 2);
  CHECK(prompts.rows[1].prompt == "p2");
  CHECK(prompts.rows[1].chosen.empty());
  tokenize_settings pts;
  pts.max_prompt_seq_len = 16;
  pts.overflow = prompt_overflow::keep_end;
  CHECK(make_prompt_examples(prompts.rows, *tok, pts).size() == 2);
  CHECK(error_of([&] { make_sft_examples(prompts.rows, *tok, {}); }).find("row 0 has no answer: this is {prompt} data") !=
        std::string::npos);
  CHECK(error_of([&] { make_rm_examples(prompts.rows, *tok, {}); }).find("this is {prompt} data") != std::string::npos);
}

TEST_CASE("loaders: a file that is one JSON list (json.dump(rows)) is read as rows, numbered as items") {
  // DS-Chat's local/jsonfile data/train.json, and what datasets.load_dataset("json") reads as rows besides JSON Lines:
  // it was refused with a jq line to convert it
  temp_dir tmp("list");
  const std::string a = R"({"prompt": "\n\nHuman: hi\n\nAssistant:", "chosen": " Hello.", "rejected": " Go away."})";
  const std::string b = R"({"prompt": "\n\nHuman: bye\n\nAssistant:", "chosen": " Bye.", "rejected": " No."})";
  // json.dump(rows, indent=2), json.dump(rows) after a byte order mark, and the pretty one gzipped
  const std::string pretty = "[\n  {\n    \"prompt\": \"\\n\\nHuman: hi\\n\\nAssistant:\",\n    \"chosen\": \" Hello.\",\n"
                             "    \"rejected\": \" Go away.\"\n  },\n  " + b + "\n]\n";
  const std::vector<std::string> files = {tmp.write("pretty.json", pretty), tmp.write("one_line.json", "[" + a + ", " + b + "]"),
                                          tmp.write("bom.json", "\xEF\xBB\xBF  [" + a + ",\r\n" + b + "]"),
                                          tmp.write_gz("train.json.gz", pretty)};
  const auto lines = load_source(tmp.write("rows.jsonl", a + "\n" + b + "\n"));
  for (const auto& f : files) {
    CAPTURE(f);
    const auto src = load_source(f);
    const auto& r = src.report;
    CHECK(r.json_list);
    CHECK(r.format == data_format::prompt_chosen_rejected);
    CHECK(r.lines == 2);
    CHECK(r.blank == 0);
    CHECK(r.malformed.empty());
    CHECK(r.layout_line == 1);
    REQUIRE(src.rows.size() == 2);
    CHECK(src.rows[0].prompt == "\n\nHuman: hi\n\nAssistant:");
    CHECK(src.rows[0].chosen == " Hello.");
    CHECK(src.rows[0].rejected == " Go away.");
    CHECK(src.rows[1].prompt == "\n\nHuman: bye\n\nAssistant:");
    CHECK(src.rows[1].chosen == " Bye.");
    CHECK(src.rows[1].rejected == " No.");
    for (size_t i = 0; i < 2; ++i)  // the same rows as the JSON Lines file of them
      CHECK((src.rows[i].prompt == lines.rows[i].prompt && src.rows[i].chosen == lines.rows[i].chosen &&
             src.rows[i].rejected == lines.rows[i].rejected));
    CHECK(r.summary() == f + ": 2 rows loaded (prompt/chosen/rejected) of 2 items; 0 malformed");
  }
  CHECK_FALSE(lines.report.json_list);
  CHECK(lines.report.summary().find("of 2 lines; 0 malformed") != std::string::npos);

  // an item that is not an object, or lacks a key, is malformed as such a line is, named by its item number; the
  // first item decided the layout
  const std::string pc = R"({"prompt": "x", "chosen": " a"})";
  const auto mixed = load_source(tmp.write("mixed.json", "[" + a + ", \"just text\", " + pc + ", " + b + "]"));
  const auto& m = mixed.report;
  REQUIRE(mixed.rows.size() == 2);
  CHECK(mixed.rows[1].chosen == " Bye.");
  CHECK(bad_lines(m) == std::vector<int64_t>{2, 3});
  CHECK(m.malformed[0].reason == "not a JSON object (a string)");
  CHECK(m.malformed[1].reason == "missing key \"rejected\"");
  CHECK(m.summary() == tmp.path.string() + "/mixed.json: 2 rows loaded (prompt/chosen/rejected) of 4 items; 2 malformed "
                       "(item 2: not a JSON object (a string); item 3: missing key \"rejected\"), skipped: fix or remove "
                       "those items to use them (1 of the items hold prompt/chosen rows: item 1, the first, decided the "
                       "layout prompt/chosen/rejected)");
  // the first object decides the layout: its item number
  const auto second = load_source(tmp.write("second.json", "[7, " + pc + ", " + a + "]")).report;
  CHECK(second.format == data_format::prompt_chosen);
  CHECK(second.layout_line == 2);
  CHECK(bad_lines(second) == std::vector<int64_t>{1});

  // raw HH-RLHF dialogues are split, and a pair whose prompts differ dropped, as in JSON Lines
  const auto raw = load_source(tmp.write("raw.json", R"([{"chosen": "\n\nHuman: a?\n\nAssistant: yes", "rejected": "\n\nHuman: a?\n\nAssistant: no"},
 {"chosen": "\n\nHuman: a?\n\nAssistant: one", "rejected": "\n\nHuman: z?\n\nAssistant: two"}])"));
  CHECK(raw.report.format == data_format::hh_rlhf_raw);
  REQUIRE(raw.rows.size() == 1);
  CHECK(raw.rows[0].prompt == "\n\nHuman: a?\n\nAssistant:");
  CHECK(raw.rows[0].chosen == " yes");
  CHECK(raw.rows[0].rejected == " no");
  CHECK(raw.report.prompt_mismatch_lines == std::vector<int64_t>{2});
  CHECK(raw.report.summary().find("; 1 dropped: prompts differ (items 2)") != std::string::npos);
  // TRL's conversational rows alike
  const auto conv = load_source(tmp.write(
      "messages.json", R"([{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello."}]}])"));
  CHECK(conv.report.format == data_format::messages);
  REQUIRE(conv.rows.size() == 1);
  CHECK(conv.rows[0].prompt == "\n\nHuman: hi\n\nAssistant:");
  CHECK(conv.rows[0].chosen == " Hello.");

  // no usable item, no layout, an empty list: the errors count and name items
  const std::string none = error_of([&] {
    load_source(tmp.write("none.json", R"([{"prompt": "x", "chosen": "", "rejected": "y"}, 5])"));
  });
  CHECK_MESSAGE(none.find("none.json: no usable item (2 items, 2 malformed): item 1: empty \"chosen\"; item 2: not a "
                          "JSON object (a number). Expected one JSON object per item") != std::string::npos,
                none);
  const std::string keys = error_of([&] { load_source(tmp.write("keys.json", R"([{"a": 1}])")); });
  CHECK_MESSAGE(keys.find("cannot tell the data layout: no item is a JSON object with the keys") != std::string::npos, keys);
  CHECK(keys.find("(item 1: a JSON object without prompt/chosen/rejected") != std::string::npos);
  CHECK(error_of([&] { load_source(tmp.write("empty.json", "[]\n")); }).find("(the list is empty)") != std::string::npos);

  // a list of lists is not rows: refused naming the file and what to write
  const auto lists_file = tmp.write("lists.json", "[[" + a + "], [" + b + "]]");
  const std::string lists = error_of([&] { load_source(lists_file); });
  CHECK_MESSAGE(lists.find(lists_file + ": is one JSON list of 2 items, and its items are not JSON objects (the first is "
                                        "of type array)") != std::string::npos,
                lists);
  CHECK(lists.find("write one {\"prompt\": ..., ...} object per row") != std::string::npos);
  CHECK(lists.find("jq") == std::string::npos);

  // a text that starts with '[' but is not one JSON value is JSON Lines: a first line that is a list is malformed
  const auto jsonl = load_source(tmp.write("list_line.jsonl", "[1, 2]\n" + a + "\n"));
  CHECK_FALSE(jsonl.report.json_list);
  CHECK(jsonl.rows.size() == 1);
  REQUIRE(jsonl.report.malformed.size() == 1);
  CHECK(jsonl.report.malformed[0].line == 1);
  CHECK(jsonl.report.malformed[0].reason == "not a JSON object (an array)");
  CHECK(jsonl.report.summary().find("of 2 lines; 1 malformed (line 1: not a JSON object (an array))") != std::string::npos);
  // a list that does not parse, whose first line is no JSON value either (a cut file, a trailing comma): refused with
  // the parse error's line and column in the file. Read as JSON Lines it was "bad JSON" at line 1 and trained on
  // the one item that had a line of its own, or (pretty-printed) "write one JSON object per line"
  const auto cut_file = tmp.write("cut.json", "[" + a + ",\n" + b + "\n");
  const std::string cut = error_of([&] { load_source(cut_file); });
  CHECK_MESSAGE(cut.find(cut_file + ": starts as one JSON list ('[') but is not valid JSON: parse error at line 3, "
                                    "column 1") != std::string::npos,
                cut);
  CHECK(cut.find("fix the list (a trailing comma before ']' or a file cut short") != std::string::npos);
  const auto comma_file = tmp.write("comma.json", "\xEF\xBB\xBF[\n  " + a + ",\n  " + b + ",\n]\n");
  const std::string comma = error_of([&] { load_source(comma_file); });
  CHECK_MESSAGE(comma.find(comma_file + ": starts as one JSON list ('[') but is not valid JSON: parse error at line 4, "
                                      "column 1") != std::string::npos,
                comma);
}

TEST_CASE("GSM8K's {question, answer} rows load as prompt/chosen, the reference answer of rule rewards (real data)") {
  const auto src = load_source(flowrun::asset_path("data/gsm8k/test.jsonl").string());
  CHECK(src.report.format == data_format::question_answer);
  REQUIRE(src.rows.size() == 1319);  // the test split, every row usable
  CHECK(src.rows[0].prompt.rfind("Janet", 0) == 0);
  CHECK(src.rows[0].chosen.size() > 7);
  CHECK(src.rows[0].chosen.substr(src.rows[0].chosen.size() - 7) == "#### 18");
  // the prompt loader keeps each row's chosen beside its tokens, for the reward_function
  auto tok = load_tokenizer(test::tokenizer_path());
  tokenize_settings ts;
  ts.max_prompt_seq_len = 64;
  ts.overflow = prompt_overflow::keep_end;
  const auto pe = make_prompt_examples({src.rows[0], src.rows[1]}, *tok, ts);
  REQUIRE(pe.size() == 2);
  CHECK(pe[0].reference == src.rows[0].chosen);
  CHECK(pe[1].reference == src.rows[1].chosen);
}

TEST_CASE("TRL's prompt-completion and conversational rows train on their answers, and its text rows are named with the fix") {
  temp_dir tmp("trl");
  // TRL's standard prompt-completion layout: "completion" is the answer (it loaded as {prompt} data, the
  // completions ignored, and SFT refused "row 0 has no answer")
  auto pc = load_source(tmp.write("pc.jsonl", R"({"prompt": "The sky is", "completion": " blue."})" "\n"
                                              R"({"prompt": "Two and two make", "completion": " four.", "id": 7})" "\n"));
  CHECK(pc.report.format == data_format::prompt_completion);
  REQUIRE(pc.rows.size() == 2);
  CHECK(pc.rows[1].chosen == " four.");
  CHECK(pc.rows[1].question);  // the prompt is the user's text, not HH-RLHF turns
  CHECK(row_messages(pc.rows[0]) == nlohmann::ordered_json::parse(R"([{"role": "user", "content": "The sky is"}])"));
  // without a chat template the text is prompt + completion, as TRL's SFTTrainer joins them
  auto tok = load_tokenizer(test::tokenizer_path());
  tokenize_settings ts;
  ts.max_seq_len = 64;
  const auto sft = make_sft_examples(pc.rows, *tok, ts);
  REQUIRE(sft.size() == 2);
  auto want = tok->encode("The sky is blue.");
  if (tok->adds_bos()) want.insert(want.begin(), tok->bos_id());
  want.push_back(tok->eos_id());
  CHECK(sft[0].ids == want);
  CHECK(sft[0].prompt_len == static_cast<int64_t>(tok->encode("The sky is").size()) + (tok->adds_bos() ? 1 : 0));
  // TRL's conversational layout: the last message is the answer, the ones before it the prompt (as the chat
  // template reads them; DS-Chat's Human/Assistant text without one)
  auto conv = load_source(tmp.write(
      "msgs.jsonl",
      R"({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}, )"
      R"({"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Sky?"}, )"
      R"({"role": "assistant", "content": "Blue."}]})" "\n"
      R"({"messages": [{"role": "user", "content": "Q"}]})" "\n"
      R"({"messages": [{"role": "user", "content": "Q"}, {"role": "robot", "content": "A"}]})" "\n"));
  CHECK(conv.report.format == data_format::messages);
  REQUIRE(conv.rows.size() == 1);
  CHECK(conv.rows[0].chosen == " Blue.");
  CHECK(conv.rows[0].prompt == "Be brief.\n\nHuman: Hi\n\nAssistant: Hello.\n\nHuman: Sky?\n\nAssistant:");
  CHECK(row_messages(conv.rows[0]) ==
        nlohmann::ordered_json::parse(R"([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                                           {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Sky?"}])"));
  REQUIRE(conv.report.malformed.size() == 2);
  CHECK(conv.report.malformed[0].reason ==
        "the last message is the user's: a conversation to learn from ends with the assistant's answer");
  CHECK(conv.report.malformed[1].reason == "\"messages\" message 1 has role \"robot\" (system, user or assistant)");
  // TRL's KTO rows (a label per completion) and conversational prompt-completion rows (lists): named, not trained on
  auto kto = load_source(tmp.write("kto.jsonl", R"({"prompt": "p", "completion": " c", "label": true})" "\n"
                                                R"({"prompt": "p", "completion": " c"})" "\n"
                                                R"({"prompt": [{"role": "user", "content": "p"}], "completion": " c"})" "\n"));
  REQUIRE(kto.rows.size() == 1);
  REQUIRE(kto.report.malformed.size() == 2);
  CHECK(kto.report.malformed[0].reason.rfind("a {prompt, completion, label} row is TRL's KTO layout", 0) == 0);
  CHECK(kto.report.malformed[1].reason ==
        "\"completion\" is not a list of the assistant's one message (TRL's conversational layout)");
  // TRL's conversational preference rows (UltraFeedback's layout): the prompt's messages, each answer the
  // assistant's one message; a reward model or DPO trains on them as on DS-Chat's pairs
  auto pref = load_source(tmp.write(
      "pref.jsonl",
      R"({"prompt": [{"role": "user", "content": "Sky?"}], "chosen": [{"role": "assistant", "content": "Blue."}], )"
      R"("rejected": [{"role": "assistant", "content": "Green."}]})" "\n"
      R"({"prompt": [{"role": "user", "content": "Sky?"}], "chosen": [{"role": "user", "content": "Blue."}], )"
      R"("rejected": [{"role": "assistant", "content": "Green."}]})" "\n"));
  CHECK(pref.report.format == data_format::prompt_chosen_rejected);
  REQUIRE(pref.rows.size() == 1);
  CHECK(pref.rows[0].prompt == "\n\nHuman: Sky?\n\nAssistant:");
  CHECK(pref.rows[0].chosen == " Blue.");
  CHECK(pref.rows[0].rejected == " Green.");
  CHECK(row_messages(pref.rows[0]) == nlohmann::ordered_json::parse(R"([{"role": "user", "content": "Sky?"}])"));
  REQUIRE(pref.report.malformed.size() == 1);
  CHECK(pref.report.malformed[0].reason ==
        "\"chosen\"'s message is not the assistant's {\"role\": \"assistant\", \"content\": string}");
  const auto rm = make_rm_examples(pref.rows, *tok, ts);
  REQUIRE(rm.size() == 1);
  auto want_chosen = tok->encode("\n\nHuman: Sky?\n\nAssistant: Blue.");
  if (tok->adds_bos()) want_chosen.insert(want_chosen.begin(), tok->bos_id());
  want_chosen.push_back(tok->eos_id());
  CHECK(rm[0].chosen == want_chosen);
  // TRL's language-modeling layout is not read: the error says what to give
  CHECK(error_of([&] { load_source(tmp.write("text.jsonl", R"({"text": "Once upon a time"})" "\n")); })
            .find("a {text} row (TRL's language-modeling format) is not read here") != std::string::npos);
}

TEST_CASE("data_split: DS-Chat's boundaries, disjoint steps that cover the data, deterministic shuffles") {
  CHECK(split_boundaries(10, {2, 4, 4}) == std::vector<int64_t>{0, 2, 6, 10});
  CHECK(split_boundaries(2307, {2, 4, 4}) == std::vector<int64_t>{0, 461, 1384, 2307});
  // Python's round is half-to-even: round(2.5) = 2, so [0, 2, 4] - (4 - 5) = [0, 3, 5]
  CHECK(split_boundaries(5, {1, 1}) == std::vector<int64_t>{0, 3, 5});
  // round(5/3) = 2 each: [0, 2, 4, 6] - 1 = [0, 1, 3, 5]
  CHECK(split_boundaries(5, {1, 1, 1}) == std::vector<int64_t>{0, 1, 3, 5});
  CHECK(parse_data_split("6,2,2") == std::vector<double>{6, 2, 2});
  CHECK_THROWS_AS(parse_data_split("2,x,4"), std::invalid_argument);
  CHECK_THROWS_AS(parse_data_split("0,0"), std::invalid_argument);
  CHECK_THROWS_AS(parse_data_split("2,-1"), std::invalid_argument);
  CHECK_THROWS_AS(split_for_step(10, "2,4,4", 3, 1), std::invalid_argument);

  // shuffles: a permutation, the same for a seed, different across seeds
  auto p1 = shuffle_indices(1000, 1234), p2 = shuffle_indices(1000, 1234), p3 = shuffle_indices(1000, 1235);
  CHECK(p1 == p2);
  CHECK(p1 != p3);
  auto sorted = p1;
  std::sort(sorted.begin(), sorted.end());
  CHECK(sorted == iota(0, 1000));
  CHECK(p1 != iota(0, 1000));
  // DS-Chat's get_shuffle_idx, number for number: the values numpy 2.4.6 gives for
  // x = np.arange(n, dtype=np.uint32); np.random.RandomState(seed).shuffle(x)
  CHECK(shuffle_indices(10, 1234) == std::vector<int64_t>{7, 2, 9, 1, 0, 8, 4, 5, 6, 3});
  CHECK(shuffle_indices(7, 0) == std::vector<int64_t>{6, 2, 1, 3, 0, 5, 4});
  const auto hh = shuffle_indices(2307, 1234);  // the assets' HH-RLHF test file's rows
  CHECK(std::vector<int64_t>(hh.begin(), hh.begin() + 8) == std::vector<int64_t>{1540, 836, 1546, 1781, 477, 1004, 62, 28});
  CHECK(std::vector<int64_t>(hh.end() - 5, hh.end()) == std::vector<int64_t>{279, 2041, 664, 1318, 723});
  CHECK(hh[1000] == 524);
  const auto big = shuffle_indices(100000, 4294967295u);  // the largest seed numpy takes
  CHECK(std::vector<int64_t>(big.begin(), big.begin() + 5) == std::vector<int64_t>{85117, 19600, 4648, 56853, 35772});
  CHECK(big[77777] == 49443);
  CHECK_THROWS_WITH_AS(shuffle_indices(10, 4294967296ull), doctest::Contains("give a seed below 4294967296"),
                       std::invalid_argument);
  // so step 1 of "2,4,4" over 10 rows takes DS-Chat's rows 7 and 2, step 2 rows 9, 1, 0, 8
  CHECK(split_for_step(10, "2,4,4", 0, 1234) == std::vector<int64_t>{7, 2});
  CHECK(split_for_step(10, "2,4,4", 1, 1234) == std::vector<int64_t>{9, 1, 0, 8});

  // the three steps: disjoint, covering, sized by the boundaries
  const int64_t n = 2307;
  std::vector<int> seen(n, 0);
  std::vector<size_t> sizes;
  for (int step = 0; step < 3; ++step) {
    auto idx = split_for_step(n, "2,4,4", step, 1234);
    CHECK(idx == split_for_step(n, "2,4,4", step, 1234));
    sizes.push_back(idx.size());
    for (int64_t i : idx) ++seen[i];
  }
  CHECK(sizes == std::vector<size_t>{461, 923, 923});
  CHECK(std::all_of(seen.begin(), seen.end(), [](int c) { return c == 1; }));

  // rows per step from two blended sources: train and eval disjoint, all rows used once
  auto sources = load_sources({dschat_path(), raw_path()});
  split_settings cfg;
  std::set<std::pair<int32_t, int64_t>> used;
  int64_t total = 0;
  for (int step = 0; step < 3; ++step) {
    auto rows = rows_for_step(sources, step, cfg);
    MESSAGE(rows.summary);
    CHECK(rows.train.size() == rows.train_refs.size());
    CHECK(rows.eval.size() == rows.eval_refs.size());
    CHECK(!rows.eval.empty());
    for (size_t i = 0; i < rows.train.size(); ++i) {
      const auto& ref = rows.train_refs[i];
      CHECK(rows.train[i].chosen == sources[ref.source].rows[ref.row].chosen);
    }
    for (const auto& r : rows.train_refs) used.insert({r.source, r.row});
    for (const auto& r : rows.eval_refs) used.insert({r.source, r.row});
    total += static_cast<int64_t>(rows.train.size() + rows.eval.size());
    auto again = rows_for_step(sources, step, cfg);
    CHECK(again.train_refs.size() == rows.train_refs.size());
    CHECK(std::equal(again.train_refs.begin(), again.train_refs.end(), rows.train_refs.begin(),
                     [](const row_ref& a, const row_ref& b) { return a.source == b.source && a.row == b.row; }));
  }
  CHECK(total == 2 * 2307);
  CHECK(used.size() == 2 * 2307);
  // about eval_fraction of the rows are held out: 231 of 2307 per source
  auto s2 = rows_for_step({sources[0]}, 1, cfg);
  CHECK(s2.eval.size() == 92);   // 40% of the 231 held-out rows
  CHECK(s2.train.size() == 830);  // 40% of the 2076 training rows

  // epoch batches: every row once, reshuffled per epoch; sequential for eval
  auto e0 = epoch_batches(10, 4, 7, 0), e1 = epoch_batches(10, 4, 7, 1);
  CHECK(e0.size() == 3);
  CHECK(e0.back().size() == 2);
  std::vector<int64_t> flat;
  for (auto& b : e0) flat.insert(flat.end(), b.begin(), b.end());
  std::sort(flat.begin(), flat.end());
  CHECK(flat == iota(0, 10));
  CHECK(e0 != e1);
  CHECK(epoch_batches(5, 2, 7, 0, false) == std::vector<std::vector<int64_t>>{{0, 1}, {2, 3}, {4}});
}

TEST_CASE("batch_cycle: a checkpoint's data position resumes the same batches, across epoch ends") {
  // steps 1 and 2 save where() and a resumed run calls set_where (issue 17). The reference is
  // epoch_batches itself, epoch after epoch: 10 rows in batches of 4 make 3 batches per epoch
  // (4, 4, 2); with full_only the batch of 2 is skipped (2 per epoch).
  using flowrun::actors::batch_cycle;
  for (const bool full_only : {false, true}) {
    CAPTURE(full_only);
    std::vector<std::vector<int64_t>> ref;
    std::vector<batch_cycle::position> at;  // the position before each reference batch
    for (int64_t e = 0; e < 12; ++e) {  // at least 21 batches either way
      int64_t i = 0;
      for (auto& b : epoch_batches(10, 4, 7, e))
        if (!full_only || b.size() == 4) {
          ref.push_back(b);
          at.push_back({e, i++});
        }
    }
    const int64_t per_epoch = full_only ? 2 : 3;
    for (int64_t k = 0; k <= 10; ++k) {
      CAPTURE(k);
      batch_cycle a(10, 4, 7, full_only);
      for (int64_t j = 0; j < k; ++j) CHECK(a.next("n") == ref[j]);
      const auto p = a.where();
      // the batch index within its epoch; an epoch's end reads as the next epoch's start
      CHECK(p == batch_cycle::position{k / per_epoch, k % per_epoch});
      CHECK(p == at[k]);
      batch_cycle b(10, 4, 7, full_only);
      b.set_where(p);
      CHECK(b.where() == p);
      for (int64_t j = k; j < k + 10; ++j) CHECK(b.next("n") == ref[j]);
    }
    // the end of epoch 0 given as its last index: the same place as {1, 0}
    batch_cycle c(10, 4, 7, full_only);
    c.set_where({0, per_epoch});
    CHECK(c.where() == batch_cycle::position{1, 0});
    CHECK(c.next("n") == ref[per_epoch]);
    CHECK_THROWS_WITH_AS(c.set_where({0, per_epoch + 1}), doctest::Contains("past its"), std::invalid_argument);
    CHECK_THROWS_AS(c.set_where({-1, 0}), std::invalid_argument);
  }
}

TEST_CASE("tokenization: EOS kept when cut, prompt masking, RM pairs, left-padded prompts") {
  auto tok = load_tokenizer(test::tokenizer_path());
  const int32_t bos = tok->bos_id(), eos = tok->eos_id();
  REQUIRE(tok->pad_id() < 0);  // tok512 has no pad: batches carry lengths and masks
  auto src = load_source(dschat_path());
  std::vector<sample> rows(src.rows.begin(), src.rows.begin() + 64);

  std::vector<int32_t> v = {5, 6, 7, 8, eos};
  CHECK(truncate_keep_eos(v, 3, true, eos));
  CHECK(v == std::vector<int32_t>{5, 6, eos});
  CHECK_FALSE(truncate_keep_eos(v, 3, true, eos));

  tokenize_settings ts;
  ts.max_seq_len = 96;
  process_report rep;
  auto sft = make_sft_examples(rows, *tok, ts, &rep);
  MESSAGE("SFT, max_seq_len 96: " << rep.summary());
  CHECK(rep.kept == 64);
  CHECK(rep.truncated > 0);
  CHECK(rep.truncated < 64);
  for (size_t i = 0; i < sft.size(); ++i) {
    const auto& e = sft[i];
    CHECK(static_cast<int64_t>(e.ids.size()) <= 96);
    CHECK(e.ids.front() == bos);
    CHECK(e.ids.back() == eos);
    if (!e.truncated) {
      auto want = tok->encode(rows[i].prompt + rows[i].chosen);
      want.insert(want.begin(), bos);
      want.push_back(eos);
      CHECK(e.ids == want);
      // the prompt tokens are the prompt's own encoding
      auto p = tok->encode(rows[i].prompt);
      CHECK(e.prompt_len >= static_cast<int64_t>(p.size()));  // BOS + the common prefix
      CHECK(e.prompt_len <= static_cast<int64_t>(p.size()) + 1);
    }
  }

  // batches: labels -100 on padding (from the lengths) and, with mask_prompt, on the prompt
  std::vector<int64_t> pick = {0, 1, 2, 3};
  size_t untruncated = 0;
  while (sft[untruncated].truncated) ++untruncated;
  pick[0] = static_cast<int64_t>(untruncated);
  auto b = sft_batch(sft, pick, /*mask_prompt=*/true);
  auto ids = ints(b.ids), labels = ints(b.labels), targets = ints(b.targets), mask = ints(b.mask), lens = ints(b.lengths);
  for (int64_t r = 0; r < b.B; ++r) {
    const auto& e = sft[pick[r]];
    CHECK(lens[r] == static_cast<int32_t>(e.ids.size()));
    for (int64_t t = 0; t < b.T; ++t) {
      const bool real = t < lens[r];
      CHECK(mask[r * b.T + t] == (real ? 1 : 0));
      CHECK(ids[r * b.T + t] == (real ? e.ids[t] : 0));
      int32_t want = real && t >= e.prompt_len ? e.ids[t] : -100;
      CHECK(labels[r * b.T + t] == want);
      CHECK(targets[r * b.T + t] == (t + 1 < b.T ? labels[r * b.T + t + 1] : -100));
    }
  }
  auto nomask = sft_batch(sft, pick, false, 96);
  CHECK(nomask.T == 96);
  CHECK(ints(nomask.labels)[1] == sft[pick[0]].ids[1]);  // the prompt trains without mask_prompt
  CHECK_THROWS_AS(sft_batch(sft, pick, false, 10), std::invalid_argument);

  // token 0 is a real token when it lies inside a row's length: nothing keys on the pad id
  std::vector<sft_example> zeros = {{{bos, 0, 7, eos}, 1, false}, {{bos, eos}, 1, false}};
  auto zb = sft_batch(zeros, {0, 1}, /*mask_prompt=*/true);
  CHECK(ints(zb.labels) == std::vector<int32_t>{-100, 0, 7, eos, -100, eos, -100, -100});
  CHECK(ints(zb.mask) == std::vector<int32_t>{1, 1, 1, 1, 1, 1, 0, 0});
  CHECK(zb.n_target_tokens == 4);

  // RM pairs: both answers end with EOS, lengths per row, padding masked
  auto rm = make_rm_examples(rows, *tok, ts, &rep);
  MESSAGE("RM, max_seq_len 96: " << rep.summary());
  for (const auto& e : rm) {
    CHECK(e.chosen.back() == eos);
    CHECK(e.rejected.back() == eos);
    CHECK(static_cast<int64_t>(std::max(e.chosen.size(), e.rejected.size())) <= 96);
  }
  auto rb = rm_batch(rm, {3, 4, 5});
  auto cl = ints(rb.chosen_len), rl = ints(rb.rejected_len), cm = ints(rb.chosen_mask);
  for (int64_t r = 0; r < 3; ++r) {
    CHECK(cl[r] == static_cast<int32_t>(rm[3 + r].chosen.size()));
    CHECK(rl[r] == static_cast<int32_t>(rm[3 + r].rejected.size()));
    for (int64_t t = 0; t < rb.T; ++t) CHECK(cm[r * rb.T + t] == (t < cl[r] ? 1 : 0));
  }

  // prompt_start truncation: the oldest prompt tokens go first, the same count for both
  // answers, so the answers survive and the pair still differs
  const int64_t identical_end = rep.identical;
  ts.truncation = truncation_mode::prompt_start;
  auto rm2 = make_rm_examples(rows, *tok, ts, &rep);
  MESSAGE("RM, max_seq_len 96, prompt_start: " << rep.summary());
  CHECK(rep.identical < identical_end);
  CHECK(rep.identical == 0);
  int tails = 0;
  for (size_t i = 0; i < rm2.size(); ++i) {
    const auto& e = rm2[i];
    CHECK(static_cast<int64_t>(std::max(e.chosen.size(), e.rejected.size())) <= 96);
    CHECK(e.chosen.front() == bos);
    CHECK(e.chosen.back() == eos);
    CHECK(e.rejected.back() == eos);
    auto full = tok->encode(rows[i].prompt + rows[i].chosen);
    full.push_back(eos);
    // when both answers fit with room to spare, chosen = BOS + the tail of the full sequence
    if (std::max(tok->encode(rows[i].chosen).size(), tok->encode(rows[i].rejected).size()) + 8 < 96) {
      ++tails;
      CHECK(std::equal(e.chosen.begin() + 1, e.chosen.end(), full.end() - (e.chosen.size() - 1)));
    }
  }
  CHECK(tails > 20);
  auto sft2 = make_sft_examples(rows, *tok, ts, &rep);
  for (size_t i = 0; i < sft2.size(); ++i) {
    auto full = tok->encode(rows[i].prompt + rows[i].chosen);
    full.push_back(eos);
    CHECK(sft2[i].ids.back() == eos);
    if (sft2[i].prompt_len > 1)  // some prompt left: nothing of the answer was cut
      CHECK(std::equal(sft2[i].ids.begin() + 1, sft2[i].ids.end(), full.end() - (sft2[i].ids.size() - 1)));
  }
  ts.truncation = truncation_mode::end;

  // step 3 prompts: DS-Chat drops the long ones; keep_end keeps BOS and the last tokens
  ts.max_prompt_seq_len = 64;
  auto kept = make_prompt_examples(rows, *tok, ts, &rep);
  MESSAGE("prompts, max_prompt_seq_len 64, drop: " << rep.summary());
  int64_t longer = 0;
  for (const auto& r : rows) longer += static_cast<int64_t>(tok->encode(r.prompt).size()) + 1 > 64;
  CHECK(rep.filtered == longer);
  CHECK(rep.kept == 64 - longer);
  ts.overflow = prompt_overflow::keep_end;
  auto cut = make_prompt_examples(rows, *tok, ts, &rep);
  CHECK(rep.kept == 64);
  CHECK(rep.truncated == longer);
  for (size_t i = 0; i < rows.size(); ++i) {
    auto full = tok->encode(rows[i].prompt);
    CHECK(cut[i].ids.front() == bos);
    CHECK(static_cast<int64_t>(cut[i].ids.size()) <= 64);
    CHECK(std::equal(cut[i].ids.begin() + 1, cut[i].ids.end(), full.end() - (cut[i].ids.size() - 1)));
  }
  // left padding: the prompt ends at the last column; the mask marks it
  std::vector<prompt_example> pe = {{{bos, 10, 11}, false, {}}, {{bos, 0, 12, 13, 14}, false, {}}};
  auto pb = prompt_batch(pe, {0, 1});
  CHECK(pb.P == 5);
  CHECK(ints(pb.ids) == std::vector<int32_t>{0, 0, bos, 10, 11, bos, 0, 12, 13, 14});
  CHECK(ints(pb.mask) == std::vector<int32_t>{0, 0, 1, 1, 1, 1, 1, 1, 1, 1});
  CHECK(ints(pb.lengths) == std::vector<int32_t>{3, 5});
  CHECK(prompt_batch(pe, {0}, 8).P == 8);
}

TEST_CASE("settings: update counts, LoRA mapping, the engine's settings") {
  dschat_settings s;
  s.per_device_train_batch_size = 8;
  s.gradient_accumulation_steps = 2;
  s.num_train_epochs = 3;
  CHECK(total_update_steps(100, s) == 3 * 7);  // ceil(ceil(100/8)/2) = 7 per epoch
  s.lora_dim = 4;
  auto lc = lora_from(s);
  CHECK(lc.lora_r == 4);
  CHECK(lc.lora_alpha == 1.0f);
  CHECK(lc.target_modules == std::vector<std::string>{"all-linear"});  // "decoder.layers.": every Linear of the blocks
  s.lora_module_name = "q_proj, v_proj";
  CHECK(lora_from(s).target_modules == std::vector<std::string>{"q_proj", "v_proj"});
  CHECK(rm_defaults().learning_rate == doctest::Approx(5e-5f));

  // the engine: DS-Chat's names mapped, and LinearLayer_LoRA's frozen weights as ranges
  decoder m = clone_decoder(test::stories260k());
  dschat_settings e;
  e.zero_stage = 2;
  e.per_device_train_batch_size = 4;
  e.gradient_accumulation_steps = 3;
  e.lora_dim = 2;
  e.lora_module_name = "foo_proj";  // matches nothing: the error names the setting, not only the decoder's words
  {
    decoder bad = clone_decoder(test::stories260k());
    CHECK_THROWS_WITH_AS(apply_lora(bad, e),
                         doctest::Contains("lora_module_name = \"foo_proj\" (step 3: actor_lora_module_name / "
                                           "critic_lora_module_name): target module 'foo_proj' matches no Linear"),
                         std::invalid_argument);
  }
  {  // a rank above the width names lora_dim (it named lora_module_name)
    decoder wide = clone_decoder(test::stories260k());
    dschat_settings r = e;
    r.lora_module_name = "q_proj,v_proj";
    r.lora_dim = 128;  // stories260K's dim is 64
    CHECK_THROWS_WITH_AS(apply_lora(wide, r),
                         doctest::Contains("lora_dim = 128 (step 3: actor_lora_dim / critic_lora_dim): LoRA rank must be "
                                           "<= the model's dim (64"),
                         std::invalid_argument);
  }
  e.lora_module_name = "q_proj,v_proj";
  apply_lora(m, e);  // only_optimize_lora false: the base trains, the adapted weights do not
  auto z = engine_settings(m, e);
  CHECK(z.stage == 2);
  CHECK(z.micro_batch == 4);
  CHECK(z.gradient_accumulation_steps == 3);
  CHECK(z.gradient_clipping == doctest::Approx(1.0));
  CHECK(z.adamw.beta2 == doctest::Approx(0.95f));
  const int64_t L = m.config().n_layers;
  REQUIRE(z.frozen_ranges.size() == static_cast<size_t>(2 * L));
  for (int64_t l = 0; l < L; ++l)
    for (const char* w : {"q_proj", "v_proj"}) {
      const std::string name = "model.layers." + std::to_string(l) + ".self_attn." + w + ".weight";
      const auto it = std::find_if(m.params().begin(), m.params().end(), [&](const param_entry& p) { return p.name == name; });
      REQUIRE(it != m.params().end());
      CHECK(std::find(z.frozen_ranges.begin(), z.frozen_ranges.end(),
                      std::pair<int64_t, int64_t>{it->offset, it->offset + it->numel}) != z.frozen_ranges.end());
    }
  e.zero_stage = 4;
  CHECK_THROWS_AS(engine_settings(m, e), std::invalid_argument);
  e.zero_stage = 0;
  e.only_optimize_lora = true;  // a frozen base needs no ranges
  decoder m2 = clone_decoder(test::stories260k());
  apply_lora(m2, e);
  CHECK(engine_settings(m2, e).frozen_ranges.empty());
  // only_optimize_lora without LoRA trained the whole model: refused, naming both settings
  dschat_settings no_lora = e;
  no_lora.lora_dim = 0;
  decoder m2b = clone_decoder(test::stories260k());
  CHECK(error_of([&] { apply_lora(m2b, no_lora); }).find("only_optimize_lora = true trains only the LoRA weights, and "
                                                          "lora_dim = 0 adds none") != std::string::npos);

  // a global batch of the wrong size is refused, naming the setting
  auto tok = load_tokenizer(test::tokenizer_path());
  auto src = load_source(dschat_path());
  tokenize_settings ts;
  ts.max_seq_len = 48;
  auto ex = make_sft_examples(std::vector<sample>(src.rows.begin(), src.rows.begin() + 4), *tok, ts);
  decoder m3 = clone_decoder(test::stories260k());
  dschat_settings st_s;
  st_s.gradient_accumulation_steps = 2;
  auto group = comm::make_inproc_group(1);
  auto c = comm::inproc_communicator(group, 0);
  zero_engine eng(m3, *c, engine_settings(m3, st_s));
  const std::vector<sft_batch_data> one = {sft_batch(ex, {0, 1})};
  CHECK(error_of([&] { sft_update(eng, one, 1e-3); }).find("gradient_accumulation_steps 2") != std::string::npos);
  const std::vector<sft_batch_data> two = {sft_batch(ex, {0, 1}), sft_batch(ex, {2, 3})};
  auto r = sft_update(eng, two, 1e-3);
  CHECK(eng.step_count() == 1);
  CHECK(r.grad_norm > 0);
  CHECK(r.tokens == two[0].n_target_tokens + two[1].n_target_tokens);
}

TEST_CASE("settings: a user's DeepSpeed JSON (deepspeed_config) and dtype reach the engine") {
  // DS-Chat's own --zero_stage 3 --dtype bf16 config shape (ds_utils.py get_train_ds_config),
  // with an optimizer section as a user's config has
  const std::string json = R"({
    "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2,
    "zero_optimization": {"stage": 3, "offload_param": {"device": "none"}},
    "bf16": {"enabled": true}, "gradient_clipping": 0.5,
    "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "betas": [0.9, 0.99], "eps": 1e-6, "weight_decay": 0.1}}
  })";
  dschat::dschat_settings d;
  dschat::apply_ds_config(d, parse_ds_config(json, 1));
  CHECK(d.zero_stage == 3);
  CHECK(d.dtype == "bf16");
  CHECK(d.per_device_train_batch_size == 4);
  CHECK(d.gradient_accumulation_steps == 2);
  CHECK(d.gradient_clipping == doctest::Approx(0.5));
  CHECK(d.learning_rate == doctest::Approx(3e-4));
  CHECK(d.adam_beta2 == doctest::Approx(0.99));
  CHECK(d.adam_eps == doctest::Approx(1e-6));
  CHECK(d.weight_decay == doctest::Approx(0.1));
  decoder m = load_llama2c(test::model_path());
  const zero_settings z = dschat::engine_settings(m, d);
  CHECK(z.stage == 3);
  CHECK(z.precision == dtype::bf16);
  CHECK(z.micro_batch == 4);
  CHECK(z.gradient_accumulation_steps == 2);
  CHECK(z.adamw.weight_decay == doctest::Approx(0.1f));
  CHECK(!z.loss_scaler);
  // fp16: DeepSpeed's dynamic loss scaler, starting at 2^16
  d.dtype = "fp16";
  const zero_settings h = dschat::engine_settings(m, d);
  REQUIRE(h.loss_scaler);
  CHECK(h.precision == dtype::f16);
  CHECK(h.loss_scaler->scale() == 65536.0);
  d.dtype = "fp8";
  CHECK_THROWS_WITH_AS(dschat::engine_settings(m, d), doctest::Contains("fp32, bf16 or fp16"), std::invalid_argument);
  // no scheduler section: DS-Chat's lr_scheduler_type (cosine over the run, warmup 0: the base lr first)
  CHECK(d.ds_scheduler.type.empty());
  CHECK(dschat::schedule_from(d, 10).lr_at(0, 3e-4) == doctest::Approx(3e-4));
  // a scheduler section wins over lr_scheduler_type, as DeepSpeed prefers a configured scheduler to the
  // client's: WarmupLR, linear warmup 0 -> 4e-3 over 4 updates (deepspeed/runtime/lr_schedules.py WarmupLR:
  // lr = min + (max - min) * i / warmup_num_steps at last_batch_iteration i = update - 1, clamped at 0, so
  // updates 0 and 1 run at min (models/train/lr_schedule.h's step convention); max from update 5), by hand
  dschat::dschat_settings w;
  dschat::apply_ds_config(w, parse_ds_config(R"({"train_batch_size": 8,
    "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 4e-3, "warmup_num_steps": 4,
                                                  "warmup_type": "linear"}}})", 1));
  CHECK(w.ds_scheduler.type == "WarmupLR");
  const lr_schedule ws = dschat::schedule_from(w, 10);
  const double lr = w.learning_rate;
  CHECK(ws.lr_at(0, lr) == doctest::Approx(0.0));
  CHECK(ws.lr_at(1, lr) == doctest::Approx(0.0));
  CHECK(ws.lr_at(2, lr) == doctest::Approx(1e-3));
  CHECK(ws.lr_at(3, lr) == doctest::Approx(2e-3));
  CHECK(ws.lr_at(4, lr) == doctest::Approx(3e-3));
  CHECK(ws.lr_at(5, lr) == doctest::Approx(4e-3));
  CHECK(ws.lr_at(9, lr) == doctest::Approx(4e-3));
  // Adam with L2 decay (adam_w_mode false) is not what the engine runs: refused, naming the file
  dschat::dschat_settings e;
  CHECK_THROWS_WITH_AS(dschat::apply_ds_config(e, parse_ds_config(R"({"train_batch_size": 8, "optimizer": {"type": "Adam", "params": {"adam_w_mode": false}}})", 1, "user.json")),
                       doctest::Contains("user.json"), std::invalid_argument);
}

TEST_CASE("lr_schedule: transformers.get_scheduler and DeepSpeed's schedules, hand-worked") {
  // one scheduler: DeepSpeed's JSON fills the same type
  static_assert(std::is_same_v<decltype(ds_config::scheduler), lr_schedule>);
  // transformers/optimization.py (v4.46): update k runs at base_lr · lr_lambda(k), with
  //   warmup (every type but constant): k / max(1, W) for k < W;
  //   linear: max(0, (total - k) / max(1, total - W));
  //   cosine: progress = (k - W) / max(1, total - W), max(0, 0.5 (1 + cos(π · 2 · 0.5 · progress)));
  //   constant_with_warmup: 1 after the warmup; constant: 1 always (get_constant_schedule has no warmup).
  auto hf = [](const char* type, int64_t W, int64_t total, int64_t k) {
    return lr_schedule::transformers(type, W, total).lr_at(k, 1.0);
  };
  CHECK(hf("linear", 2, 10, 0) == 0.0);                        // 0 / 2
  CHECK(hf("linear", 2, 10, 1) == doctest::Approx(0.5));       // 1 / 2
  CHECK(hf("linear", 2, 10, 2) == doctest::Approx(1.0));       // (10 - 2) / 8
  CHECK(hf("linear", 2, 10, 6) == doctest::Approx(0.5));       // (10 - 6) / 8
  CHECK(hf("linear", 2, 10, 10) == doctest::Approx(0.0));
  CHECK(hf("linear", 2, 10, 12) == 0.0);                       // max(0, -2 / 8)
  CHECK(hf("cosine", 0, 10, 0) == doctest::Approx(1.0));
  CHECK(hf("cosine", 0, 10, 2) == doctest::Approx(0.9045084972));  // 0.5 (1 + cos(0.2π)) = 0.5 (1 + 0.8090169944)
  CHECK(hf("cosine", 0, 10, 5) == doctest::Approx(0.5));
  CHECK(hf("cosine", 0, 10, 10) == doctest::Approx(0.0));
  CHECK(hf("cosine", 4, 12, 2) == doctest::Approx(0.5));           // warmup 2 / 4
  CHECK(hf("cosine", 4, 12, 6) == doctest::Approx(0.8535533906));  // progress 2/8: 0.5 (1 + cos(π/4))
  CHECK(hf("constant", 5, 10, 0) == 1.0);
  CHECK(hf("constant_with_warmup", 4, 10, 1) == doctest::Approx(0.25));
  CHECK(hf("constant_with_warmup", 4, 10, 4) == 1.0);
  CHECK(lr_schedule::transformers("linear", 2, 10).lr_at(6, 2e-3) == doctest::Approx(1e-3));
  CHECK(error_of([] { lr_schedule::transformers("polynomial", 0, 10); }).find("cosine, linear") != std::string::npos);
  // DS-Chat's settings reach it
  dschat_settings s;
  s.lr_scheduler_type = "linear";
  s.num_warmup_steps = 2;
  CHECK(schedule_from(s, 10).lr_at(6, 1.0) == doctest::Approx(0.5));

  // DeepSpeed (deepspeed/runtime/lr_schedules.py WarmupDecayLR, warmup_type linear): the update after
  // `step` applied updates runs at get_lr() with last_batch_iteration it = step - 1; gamma = it / W for
  // it < W, then max(0, (total - it) / max(1, total - W)); lr = min_lr + (max_lr - min_lr) · gamma;
  // before the first step (it = -1) the lr is warmup_min_lr.
  lr_schedule d;
  d.type = "WarmupDecayLR";
  d.warmup_min_lr = 0;
  d.warmup_max_lr = 1e-3;
  d.warmup_num_steps = 4;
  d.warmup_type = "linear";
  d.total_num_steps = 12;
  CHECK(d.lr_at(0, 5.0) == 0.0);                           // it = -1
  CHECK(d.lr_at(1, 5.0) == 0.0);                           // it = 0: 0 / 4
  CHECK(d.lr_at(3, 5.0) == doctest::Approx(5e-4));         // it = 2: 2 / 4
  CHECK(d.lr_at(5, 5.0) == doctest::Approx(1e-3));         // it = 4: (12 - 4) / 8
  CHECK(d.lr_at(9, 5.0) == doctest::Approx(5e-4));         // it = 8: (12 - 8) / 8
  CHECK(d.lr_at(13, 5.0) == 0.0);                          // it = 12
  lr_schedule none;
  none.type = "";
  CHECK(none.lr_at(7, 3e-4) == 3e-4);
  CHECK_THROWS_AS(d.lr_at(-1, 1.0), std::invalid_argument);
}

namespace {

// Runs `world` ranks (threads) of a zero_engine over `step(rank engine)`: each rank a copy of
// `make_model()`; returns rank 0's per-update results and its final params + adapter.
struct engine_run {
  std::vector<step_result> steps;
  tensor params, adapter;
};

engine_run run_engine(int world, const dschat_settings& s, const std::function<decoder()>& make_model,
                      const std::function<step_result(zero_engine&, int64_t update)>& update, int64_t updates) {
  std::vector<engine_run> per(world);
  test::on_inproc_ranks(world, [&](int r, comm::communicator& c) {
    decoder m = make_model();
    zero_engine eng(m, c, engine_settings(m, s));
    for (int64_t u = 0; u < updates; ++u) per[r].steps.push_back(update(eng, u));
    per[r].params = eng.gather_full_params();
    per[r].adapter = eng.adapter_params();
  });
  for (int r = 1; r < world; ++r)
    for (size_t i = 0; i < per[0].steps.size(); ++i) CHECK(per[r].steps[i].loss == per[0].steps[i].loss);
  return per[0];
}

double max_abs_diff(const tensor& a, const tensor& b) {
  REQUIRE(a.numel() == b.numel());
  double m = 0;
  for (int64_t i = 0; i < a.numel(); ++i)
    m = std::max(m, static_cast<double>(std::fabs(a.data<float>()[i] - b.data<float>()[i])));
  return m;
}

// The equivalence tests step AdamW with eps 1 (and a larger lr): with DS-Chat's eps 1e-8 the first
// update of an element is lr·g/(|g| + 1e-8), i.e. ±lr even where g is rounding noise (|g| ~ 1e-9),
// so a different summation order moves 2 of stories260K's 260K parameters by 7e-5 at lr 2e-3. With
// eps 1 the update is about lr·g: the parameters then compare the gradients themselves (a wrong
// normalization, e.g. a sum over ranks instead of the mean, moves them by ~lr·g).
constexpr float kEquivLr = 0.05f, kEquivEps = 1.0f;

void check_same_updates(const engine_run& got, const engine_run& want, const std::string& what) {
  INFO(what);
  REQUIRE(got.steps.size() == want.steps.size());
  for (size_t i = 0; i < want.steps.size(); ++i) {
    CHECK(got.steps[i].tokens == want.steps[i].tokens);
    CHECK(std::fabs(got.steps[i].loss - want.steps[i].loss) < 1e-5);
    CHECK(std::fabs(got.steps[i].grad_norm - want.steps[i].grad_norm) < 1e-5 * std::max(1.0, want.steps[i].grad_norm));
  }
  CHECK(max_abs_diff(got.params, want.params) < 1e-5);
  if (want.adapter.numel() > 0) CHECK(max_abs_diff(got.adapter, want.adapter) < 1e-5);
}

}  // namespace

TEST_CASE("engine: a non-finite gradient stops the step before anything is updated") {
  decoder m = clone_decoder(test::stories260k());
  auto group = comm::make_inproc_group(1);
  auto c = comm::inproc_communicator(group, 0);
  zero_settings z;
  zero_engine eng(m, *c, z);
  const tensor before = eng.gather_full_params();
  batch_loss l;
  l.units = [](int64_t) { return int64_t{1}; };
  l.forward = [](int64_t, decoder& model, activations& a) {
    model.forward(a, tensor::zeros({1, 4}, dtype::i32), tensor{});
    micro_loss r;
    r.loss = 1.0;
    r.dout = tensor::zeros(a.logits.shape());  // dlogits (1, 4, V) with one NaN
    r.dout.data<float>()[3] = std::nanf("");
    return r;
  };
  const std::string e = error_of([&] { eng.train_step(l, 1e-3); });
  CHECK(e.find("non-finite gradient norm") != std::string::npos);
  CHECK(e.find("nothing was updated") != std::string::npos);
  CHECK(eng.step_count() == 0);
  CHECK(max_abs_diff(eng.gather_full_params(), before) == 0.0);
}

TEST_CASE("engine: the pairwise RM loss at 2 ranks, stages 0-3, updates as 1 rank on the same global batch") {
  auto tok = load_tokenizer(test::tokenizer_path());
  auto sources = load_sources({dschat_path()});
  dschat_settings s = rm_defaults();
  s.adam_eps = kEquivEps;
  split_settings sp{s.data_split, s.seed, s.eval_fraction};
  auto rows = rows_for_step(sources, 1, sp);
  tokenize_settings ts;
  ts.max_seq_len = 48;
  ts.truncation = truncation_mode::prompt_start;
  auto train = make_rm_examples(rows.train, *tok, ts);
  REQUIRE(train.size() >= 24);
  auto make_model = [&] {
    decoder m = clone_decoder(test::stories260k());
    m.add_value_head(s.seed);
    return m;
  };
  // global batches of 8 pairs: update u uses pairs [8u, 8u + 8)
  auto batch = [&](int64_t u, int64_t lo, int64_t hi) { return rm_batch(train, iota(8 * u + lo, 8 * u + hi), 48); };
  const int64_t updates = 3;
  s.per_device_train_batch_size = 8;
  auto one = run_engine(1, s, make_model, [&](zero_engine& e, int64_t u) {
    return e.train_step(rm_loss({batch(u, 0, 8)}), kEquivLr);
  }, updates);

  // the 1-rank engine's first loss and gradient norm, from the decoder alone: rm_forward's dvalues, backward, global norm
  {
    decoder m = make_model();
    activations a;
    tensor dv;
    auto res = rm_forward(m, a, batch(0, 0, 8), &dv);
    m.zero_grad();
    m.backward(a, dv);
    CHECK(std::fabs(res.loss - one.steps[0].loss) < 1e-6);
    const double norm = ops::global_norm({m.grads().flat, m.grads().adapter_flat});
    CHECK(std::fabs(norm - one.steps[0].grad_norm) < 1e-6 * std::max(1.0, norm));
    MESSAGE("RM update 1: loss " << res.loss << ", gradient norm " << norm);
  }
  s.per_device_train_batch_size = 4;
  for (int stage = 0; stage <= 3; ++stage) {
    s.zero_stage = stage;
    auto two = run_engine(2, s, make_model, [&](zero_engine& e, int64_t u) {
      const std::vector<rm_batch_data> micro = {batch(u, 0, 4), batch(u, 4, 8)};  // rank r runs micro[r]
      return e.train_step(rm_loss(micro), kEquivLr);
    }, updates);
    check_same_updates(two, one, "2 ranks, stage " + std::to_string(stage));
  }
}

TEST_CASE("engine: the SFT loss with gradient_accumulation_steps 2 updates as 1 with a doubled micro-batch") {
  auto tok = load_tokenizer(test::tokenizer_path());
  auto sources = load_sources({dschat_path()});
  dschat_settings s;
  s.adam_eps = kEquivEps;
  split_settings sp{s.data_split, s.seed, s.eval_fraction};
  auto rows = rows_for_step(sources, 0, sp);
  tokenize_settings ts;
  ts.max_seq_len = 96;
  auto train = make_sft_examples(rows.train, *tok, ts);
  REQUIRE(train.size() >= 24);
  auto make_model = [] { return clone_decoder(test::stories260k()); };
  auto batch = [&](int64_t u, int64_t lo, int64_t hi) { return sft_batch(train, iota(8 * u + lo, 8 * u + hi)); };
  const int64_t updates = 3;
  s.per_device_train_batch_size = 8;
  auto one = run_engine(1, s, make_model, [&](zero_engine& e, int64_t u) {
    return sft_update(e, {batch(u, 0, 8)}, kEquivLr);
  }, updates);

  // the same 3 updates without the engine: forward, backward, clip_grad_norm, plain AdamW (ops::adamw_step)
  {
    decoder m = make_model();
    auto mom = tensor::zeros({m.num_parameters()}), vel = tensor::zeros({m.num_parameters()});
    ops::adamw_config oc = adamw_from(s);
    oc.lr = static_cast<float>(kEquivLr);
    activations a;
    for (int64_t u = 0; u < updates; ++u) {
      auto b = batch(u, 0, 8);
      m.zero_grad();
      const double loss = m.forward(a, b.ids, b.targets);
      m.backward(a);
      std::vector<tensor> g = {m.grads().flat};
      const double norm = ops::clip_grad_norm(g, s.gradient_clipping);
      test::reference_adamw_step(m, mom, vel, u + 1, oc);
      CHECK(std::fabs(loss - one.steps[u].loss) < 1e-5);
      CHECK(std::fabs(norm - one.steps[u].grad_norm) < 1e-6 * std::max(1.0, norm));
    }
    CHECK(max_abs_diff(m.w().flat, one.params) < 1e-6);
  }
  // the halves hold different token counts: the loss is the mean over all target tokens
  int64_t unequal = 0;
  for (int64_t u = 0; u < updates; ++u) unequal += batch(u, 0, 4).n_target_tokens != batch(u, 4, 8).n_target_tokens;
  REQUIRE(unequal > 0);
  s.per_device_train_batch_size = 4;
  s.gradient_accumulation_steps = 2;
  for (int stage : {0, 2}) {
    s.zero_stage = stage;
    auto acc = run_engine(1, s, make_model, [&](zero_engine& e, int64_t u) {
      return sft_update(e, {batch(u, 0, 4), batch(u, 4, 8)}, kEquivLr);
    }, updates);
    check_same_updates(acc, one, "1 rank, gradient_accumulation_steps 2, stage " + std::to_string(stage));
  }
  // and 2 ranks x 2 accumulation steps of 2 rows at stage 3
  s.per_device_train_batch_size = 2;
  s.zero_stage = 3;
  auto both = run_engine(2, s, make_model, [&](zero_engine& e, int64_t u) {
    return sft_update(e, {batch(u, 0, 2), batch(u, 2, 4), batch(u, 4, 6), batch(u, 6, 8)}, kEquivLr);
  }, updates);
  check_same_updates(both, one, "2 ranks x gradient_accumulation_steps 2, stage 3");
}

TEST_CASE("step 1: SFT of stories260K on HH-RLHF (prompt + chosen) lowers the held-out loss") {
  auto t0 = std::chrono::steady_clock::now();
  auto tok = load_tokenizer(test::tokenizer_path());
  auto sources = load_sources({dschat_path()});
  dschat_settings s;
  s.per_device_train_batch_size = 8;
  s.per_device_eval_batch_size = 16;
  s.max_seq_len = 128;
  s.learning_rate = 2e-3f;
  s.num_warmup_steps = 0;
  split_settings sp{s.data_split, s.seed, s.eval_fraction};
  auto rows = rows_for_step(sources, 0, sp);
  MESSAGE(rows.summary);
  tokenize_settings ts;
  ts.max_seq_len = s.max_seq_len;
  auto train = make_sft_examples(rows.train, *tok, ts);
  auto eval = make_sft_examples(rows.eval, *tok, ts);
  std::vector<sft_batch_data> eval_batches;
  for (auto& idx : epoch_batches(static_cast<int64_t>(eval.size()), s.per_device_eval_batch_size, s.seed, 0, false))
    eval_batches.push_back(sft_batch(eval, idx));

  auto m = load_llama2c(test::model_path());
  auto before = sft_eval(m, eval_batches);
  auto group = comm::make_inproc_group(1);
  auto c = comm::inproc_communicator(group, 0);
  zero_engine eng(m, *c, engine_settings(m, s));
  const int64_t steps = 30;
  const lr_schedule sched = schedule_from(s, steps);
  auto batches = epoch_batches(static_cast<int64_t>(train.size()), s.per_device_train_batch_size, s.seed, 0);
  double first = 0, last = 0;
  for (int64_t i = 0; i < steps; ++i) {
    double loss = sft_update(eng, {sft_batch(train, batches[i % batches.size()])},
                             sched.lr_at(eng.step_count(), s.learning_rate)).loss;
    if (i < 5) first += loss / 5;
    if (i >= steps - 5) last += loss / 5;
  }
  auto after = sft_eval(m, eval_batches);
  MESSAGE("SFT " << steps << " steps (B 8, T<=128, lr 2e-3 cosine): train " << first << " -> " << last
                 << "; held-out (" << after.rows << " rows, " << after.tokens << " tokens) loss " << before.loss
                 << " -> " << after.loss << ", perplexity " << before.perplexity << " -> " << after.perplexity
                 << " [" << seconds_since(t0) << " s]");
  CHECK(eng.step_count() == steps);
  CHECK(after.perplexity == doctest::Approx(std::exp(after.loss)));
  CHECK(after.loss < before.loss - 0.3);
}

TEST_CASE("step 2: a reward model from stories260K + value head trains, and its scores ignore batch mates and padding") {
  auto t0 = std::chrono::steady_clock::now();
  auto tok = load_tokenizer(test::tokenizer_path());
  auto sources = load_sources({dschat_path()});
  dschat_settings s = rm_defaults();
  s.per_device_train_batch_size = 8;
  s.per_device_eval_batch_size = 16;
  s.max_seq_len = 64;
  s.learning_rate = 2e-3f;
  split_settings sp{s.data_split, s.seed, s.eval_fraction};
  auto rows = rows_for_step(sources, 1, sp);
  MESSAGE(rows.summary);
  tokenize_settings ts;
  ts.max_seq_len = s.max_seq_len;
  ts.truncation = truncation_mode::prompt_start;  // keep the answers (HH prompts are long)
  process_report rep;
  auto train = make_rm_examples(rows.train, *tok, ts, &rep);
  MESSAGE("train pairs: " << rep.summary());
  auto eval = make_rm_examples(rows.eval, *tok, ts);
  std::vector<rm_batch_data> eval_batches;
  for (auto& idx : epoch_batches(static_cast<int64_t>(eval.size()), s.per_device_eval_batch_size, s.seed, 0, false))
    eval_batches.push_back(rm_batch(eval, idx));

  auto m = load_llama2c(test::model_path());
  m.add_value_head(s.seed);

  // a score depends on its own sequence only: alone, among batch mates, with extra padding
  {
    activations a;
    auto alone = rm_forward(m, a, rm_batch(train, {5}));
    auto mates = rm_forward(m, a, rm_batch(train, {0, 5, 9, 12}));
    auto padded = rm_forward(m, a, rm_batch(train, {5, 9}, ts.max_seq_len + 9));
    CHECK(std::fabs(alone.chosen_scores[0] - mates.chosen_scores[1]) < 1e-5);
    CHECK(std::fabs(alone.rejected_scores[0] - mates.rejected_scores[1]) < 1e-5);
    CHECK(std::fabs(alone.chosen_scores[0] - padded.chosen_scores[0]) < 1e-5);
    CHECK(std::fabs(alone.rejected_scores[0] - padded.rejected_scores[0]) < 1e-5);
    CHECK(std::fabs(mates.chosen_scores[2] - padded.chosen_scores[1]) < 1e-5);
  }

  // the pairwise loss reads the shorter row's padding (DS-Chat averages to the end of the longer row), where DS-Chat's
  // attention_mask lets a padding position see the real tokens only: its value does not change with the padding
  // before it (without the mask, as before, it did)
  {
    int64_t k = 0;  // a pair whose rows differ by 2 tokens or more
    while (k + 1 < static_cast<int64_t>(train.size())) {
      auto b = rm_batch(train, {k});
      if (std::abs(b.chosen_len.data<int32_t>()[0] - b.rejected_len.data<int32_t>()[0]) >= 2) break;
      ++k;
    }
    auto b = rm_batch(train, {k});
    const bool chosen_shorter = b.chosen_len.data<int32_t>()[0] < b.rejected_len.data<int32_t>()[0];
    const int64_t T = b.T, shorter = chosen_shorter ? b.chosen_len.data<int32_t>()[0] : b.rejected_len.data<int32_t>()[0];
    const int64_t row = chosen_shorter ? 0 : 1;  // rm_forward's rows: the chosen, then the rejected
    REQUIRE(shorter + 2 <= T);
    activations a;
    (void)rm_forward(m, a, b);
    const float before = a.values.to(device::cpu()).data<float>()[row * T + T - 1];
    tensor& ids = chosen_shorter ? b.chosen_ids : b.rejected_ids;
    ids.data<int32_t>()[shorter] = 7;  // the first padding position holds another id
    (void)rm_forward(m, a, b);
    CHECK(a.values.to(device::cpu()).data<float>()[row * T + T - 1] == before);
    // the unmasked forward (the padding attending to the padding) gives the last position another value
    tensor both = tensor::empty({2, T}, dtype::i32);
    std::memcpy(both.data<int32_t>(), b.chosen_ids.data<int32_t>(), sizeof(int32_t) * T);
    std::memcpy(both.data<int32_t>() + T, b.rejected_ids.data<int32_t>(), sizeof(int32_t) * T);
    m.forward(a, both, tensor{});
    CHECK(std::fabs(a.values.to(device::cpu()).data<float>()[row * T + T - 1] - before) > 1e-6);
  }

  // a fixed probe of training pairs measures the loss before and after
  std::vector<rm_batch_data> probe;
  for (int64_t i = 0; i < 4; ++i) probe.push_back(rm_batch(train, iota(i * 16, i * 16 + 16)));
  auto probe_before = rm_eval(m, probe);
  auto before = rm_eval(m, eval_batches);
  auto group = comm::make_inproc_group(1);
  auto c = comm::inproc_communicator(group, 0);
  zero_engine eng(m, *c, engine_settings(m, s));
  const int64_t steps = 40;
  const lr_schedule sched = schedule_from(s, steps);
  double first = 0, last = 0;
  for (int64_t i = 0; i < steps; ++i) {
    auto r = rm_update(eng, {rm_batch(train, iota((i % 8) * 8, (i % 8) * 8 + 8))},
                       sched.lr_at(eng.step_count(), s.learning_rate));
    REQUIRE(std::isfinite(r.loss));
    if (i < 8) first += r.loss / 8;
    if (i >= steps - 8) last += r.loss / 8;
  }
  auto probe_after = rm_eval(m, probe);
  auto after = rm_eval(m, eval_batches);
  MESSAGE("RM " << steps << " steps over 64 pairs (B 8, T<=64, lr 2e-3 cosine): train loss " << first << " -> "
                << last << "; probe loss " << probe_before.loss << " -> " << probe_after.loss << " (acc "
                << probe_after.accuracy << "); held-out " << after.pairs << " pairs: acc " << before.accuracy
                << " -> " << after.accuracy << " +- " << after.accuracy_stderr << ", chosen " << after.chosen_mean
                << ", rejected " << after.rejected_mean << " [" << seconds_since(t0) << " s]");
  CHECK(probe_after.loss < probe_before.loss - 0.05);
  CHECK(last < first);
  CHECK(after.pairs == static_cast<int64_t>(eval.size()));
  CHECK(after.accuracy >= 0.0);
  CHECK(after.accuracy <= 1.0);
  CHECK(after.accuracy_stderr == doctest::Approx(std::sqrt(after.accuracy * (1 - after.accuracy) / after.pairs)));
}

TEST_CASE("describe_model_file names a folder by its newest file's time, not the folder's own") {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("flowrun_describe_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  { std::ofstream(dir / "model.safetensors") << "x"; }
  const auto old_time = fs::file_time_type::clock::now() - std::chrono::hours(30 * 24);
  fs::last_write_time(dir / "model.safetensors", old_time);
  { std::ofstream(dir / "tmp") << "y"; }  // a file made and renamed away moves the folder's time to now
  fs::rename(dir / "tmp", dir.parent_path() / ("flowrun_describe_moved_" + std::to_string(::getpid())));
  fs::remove(dir.parent_path() / ("flowrun_describe_moved_" + std::to_string(::getpid())));
  const std::string d = flowrun::actors::describe_model_file(dir.string());
  // the file's time, 30 days ago: not today's date (the folder's)
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char today[16];
  std::strftime(today, sizeof today, "%Y-%m-%d", &tm);
  INFO(d);
  CHECK(d.find("(modified ") != std::string::npos);
  CHECK(d.find(std::string("(modified ") + today) == std::string::npos);
  fs::remove_all(dir);
}

TEST_CASE("prompt_start truncation: examples that keep no prompt token are counted in the report") {
  // answers alone at max_seq_len: the whole prompt went, and the report said only "truncated"
  auto tok = load_tokenizer(test::tokenizer_path());
  sample shortish;
  shortish.prompt = "Human: hi Assistant:";
  shortish.chosen = " Once upon a time there was a little girl who liked to play in the park with her dog.";
  shortish.rejected = " no";
  sample fits = shortish;
  fits.chosen = fits.rejected = " ok";
  fits.rejected = " no";
  tokenize_settings ts;
  ts.max_seq_len = 12;
  ts.truncation = truncation_mode::prompt_start;
  process_report rep;
  const auto sft = make_sft_examples({shortish, fits}, *tok, ts, &rep);
  REQUIRE(sft.size() == 2);
  CHECK(sft[0].prompt_len == 1);  // BOS alone
  CHECK(sft[1].prompt_len > 1);
  CHECK(rep.prompt_lost == 1);
  CHECK(rep.summary().find(" truncated (1 of them kept no prompt token: their answers alone reach max_seq_len") !=
        std::string::npos);
  const auto rm = make_rm_examples({shortish, fits}, *tok, ts, &rep);
  REQUIRE(rm.size() == 2);
  CHECK(rep.prompt_lost == 1);
  ts.max_seq_len = 64;  // room for every prompt: none lost, and no note
  make_sft_examples({shortish, fits}, *tok, ts, &rep);
  CHECK(rep.prompt_lost == 0);
  CHECK(rep.summary().find("kept no prompt token") == std::string::npos);
}
