// Rows -> chat messages -> token ids (dschat::tokenize_settings::chat, the trainers' apply_chat_template):
// hand-made DS-Chat / HH-RLHF rows and a GSM8K question, rendered with the tiny Llama 3 and Qwen2
// folders' chat templates and tokenized with their tokenizer.json. The expected messages, texts and
// ids are transformers' apply_chat_template(tokenize=True) on the same folders
// (tests/fixtures/hf_chat/expected.json, written by tests/fixtures/make_hf_chat_fixtures.py).
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "models/chat_format.h"
#include "models/rlhf/dschat_data.h"
#include "models/tokenizer.h"

using namespace flowrun;

namespace {

const std::string kDir = std::string(FLOWRUN_FIXTURES_DIR) + "/hf_chat";

nlohmann::ordered_json expected() {
  std::ifstream f(kDir + "/expected.json");
  REQUIRE(f);
  return nlohmann::ordered_json::parse(f);
}

dschat::sample row_of(const nlohmann::ordered_json& c) {
  dschat::sample s;
  if (c.contains("question")) {
    s.prompt = c["question"].get<std::string>();
    s.chosen = c["answer"].get<std::string>();
    s.question = true;
  } else {
    s.prompt = c["prompt"].get<std::string>();
    s.chosen = c["chosen"].get<std::string>();
    s.rejected = c["rejected"].get<std::string>();
  }
  return s;
}

std::vector<int32_t> ids_of(const nlohmann::ordered_json& a) { return a.get<std::vector<int32_t>>(); }

}  // namespace

TEST_CASE("apply_chat_template: rows become transformers' messages, texts and ids (Llama 3.1, Qwen2.5 templates)") {
  const auto exp = expected();
  for (const char* name : {"llama3", "qwen2"}) {
    CAPTURE(name);
    const auto& m = exp["models"][name];
    const std::string dir = kDir + "/" + name;
    auto tok = load_tokenizer(dir);
    REQUIRE(tok->vocab_size() == m["vocab_size"].get<int>());
    REQUIRE(tok->eos_id() == m["eos_id"].get<int>());
    dschat::tokenize_settings ts;
    ts.max_seq_len = 512;
    ts.max_prompt_seq_len = 512;
    ts.chat = std::make_shared<const chat_formatter>(dir);
    for (const auto& c : m["cases"]) {
      CAPTURE(c["name"].get<std::string>());
      const auto row = row_of(c);
      CHECK(dschat::row_messages(row) == c["messages"]);
      CHECK(dschat::prompt_text(row, ts) == c["prompt_text"].get<std::string>());
      CHECK(dschat::prompt_answer_text(row, row.chosen, ts).full == c["full_text"].get<std::string>());
      const auto p_ids = ids_of(c["prompt_ids"]), f_ids = ids_of(c["full_ids"]);

      // step 3: the prompt's ids, no BOS added on top of the template's
      auto pe = dschat::make_prompt_examples({row}, *tok, ts);
      REQUIRE(pe.size() == 1);
      CHECK(pe[0].ids == p_ids);
      // step 1: the whole conversation; both templates end the reply with the EOS token
      // (<|eot_id|> = 4, <|im_end|> = 2), so no second EOS; the prompt tokens are the generation prompt's
      auto se = dschat::make_sft_examples({row}, *tok, ts);
      REQUIRE(se.size() == 1);
      CHECK(se[0].ids == f_ids);
      CHECK(se[0].prompt_len == static_cast<int64_t>(p_ids.size()));
      CHECK(std::count(f_ids.begin() + static_cast<std::ptrdiff_t>(p_ids.size()), f_ids.end(), tok->eos_id()) == 1);
      CHECK_FALSE(se[0].truncated);
      // step 2: chosen and rejected share the rendered prompt
      if (!row.rejected.empty()) {
        auto re = dschat::make_rm_examples({row}, *tok, ts);
        REQUIRE(re.size() == 1);
        CHECK(re[0].chosen == f_ids);
        CHECK(re[0].chosen_prompt_len == static_cast<int64_t>(p_ids.size()));
        CHECK(re[0].rejected_prompt_len == static_cast<int64_t>(p_ids.size()));
        CHECK(std::equal(p_ids.begin(), p_ids.end(), re[0].rejected.begin()));
        CHECK(re[0].rejected != re[0].chosen);
      }
    }
  }
}

TEST_CASE("apply_chat_template: truncation keeps the template's BOS, and the end of a long prompt") {
  const auto exp = expected();
  const auto& c = exp["models"]["llama3"]["cases"][0];
  const std::string dir = kDir + "/llama3";
  auto tok = load_tokenizer(dir);
  dschat::tokenize_settings ts;
  ts.chat = std::make_shared<const chat_formatter>(dir);
  const auto row = row_of(c);
  const auto p_ids = ids_of(c["prompt_ids"]), f_ids = ids_of(c["full_ids"]);
  REQUIRE(p_ids.at(0) == tok->bos_id());  // <|begin_of_text|>, written by the template
  // step 3, keep_end to 10 tokens: BOS, then the prompt's last 9 (the assistant header)
  ts.max_prompt_seq_len = 10;
  ts.overflow = dschat::prompt_overflow::keep_end;
  auto pe = dschat::make_prompt_examples({row}, *tok, ts);
  REQUIRE(pe.size() == 1);
  std::vector<int32_t> want = {p_ids[0]};
  want.insert(want.end(), p_ids.end() - 9, p_ids.end());
  CHECK(pe[0].ids == want);
  CHECK(pe[0].truncated);
  // step 1, prompt_start to 20 tokens: BOS, the prompt's last tokens, the whole answer (EOS last)
  ts.max_seq_len = 20;
  ts.truncation = dschat::truncation_mode::prompt_start;
  auto se = dschat::make_sft_examples({row}, *tok, ts);
  REQUIRE(se.size() == 1);
  const int64_t answer = static_cast<int64_t>(f_ids.size() - p_ids.size());
  std::vector<int32_t> want_s = {f_ids[0]};
  want_s.insert(want_s.end(), f_ids.end() - 19, f_ids.end());
  CHECK(se[0].ids == want_s);
  CHECK(se[0].prompt_len == 20 - answer);
  CHECK(se[0].ids.back() == tok->eos_id());
}

TEST_CASE("apply_chat_template: a row that is not HH-RLHF turns is an error naming the row and the cause") {
  const std::string dir = kDir + "/qwen2";
  auto tok = load_tokenizer(dir);
  dschat::tokenize_settings ts;
  ts.chat = std::make_shared<const chat_formatter>(dir);
  dschat::sample ok{"\n\nHuman: hi\n\nAssistant:", " hello", " go away"};
  dschat::sample bad{"Tell me a story.", " Once upon a time.", " No."};
  try {
    dschat::make_sft_examples({ok, bad}, *tok, ts);
    FAIL("a prompt without turns was accepted");
  } catch (const std::invalid_argument& e) {
    const std::string w = e.what();
    CHECK(w.rfind("row 1: ", 0) == 0);
    CHECK(w.find("no \"\\n\\nHuman:\" or \"\\n\\nAssistant:\" turn") != std::string::npos);
  }
  // the same text as a GSM8K question is the user's message
  bad.question = true;
  CHECK(dschat::row_messages(bad) == nlohmann::ordered_json::parse(R"([{"role":"user","content":"Tell me a story."}])"));
  // a template that raises (Qwen2.5's does not; this one refuses an assistant turn first)
  hf_chat_template t{chat_template::parse("{% if messages[0]['role'] != 'user' %}{{ raise_exception('first "
                                          "message must be the user') }}{% endif %}{{ messages[0]['content'] }}",
                                          "raising.jinja"),
                     nlohmann::ordered_json::object()};
  ts.chat = std::make_shared<const chat_formatter>(t);
  dschat::sample assistant_first{"\n\nAssistant: I start.\n\nHuman: ok\n\nAssistant:", " fine", ""};
  try {
    dschat::make_prompt_examples({ok, assistant_first}, *tok, ts);
    FAIL("a template's raise_exception was not surfaced");
  } catch (const std::invalid_argument& e) {
    const std::string w = e.what();
    CHECK(w.rfind("row 1: raising.jinja:", 0) == 0);
    CHECK(w.find("first message must be the user") != std::string::npos);
  }
}

// A TRL conversational row renders as transformers' apply_chat_template renders its messages: every message's
// content as written, the last (assistant) one too, where a DS-Chat answer is stripped. Qwen2's ChatML template
// writes "<|im_start|>ROLE\nCONTENT<|im_end|>\n" per message (transformers 5.25 gives this very string for the
// row). The last answer lost its spaces (a break-it review, 2026-12-07).
TEST_CASE("apply_chat_template: a {messages} row's last answer is rendered as written, a DS-Chat answer stripped") {
  namespace fs = std::filesystem;
  const std::string dir = kDir + "/qwen2";
  dschat::tokenize_settings ts;
  ts.chat = std::make_shared<const chat_formatter>(dir);
  const fs::path file = fs::temp_directory_path() / ("flowrun_chat_rows_" + std::to_string(::getpid()) + ".jsonl");
  std::ofstream(file) << R"({"messages": [{"role": "system", "content": "  Be nice. "}, )"
                      << R"({"role": "user", "content": "\n hi  there \n"}, {"role": "assistant", "content": " ok  "}, )"
                      << R"({"role": "user", "content": "again?"}, {"role": "assistant", "content": " final answer\n"}]})"
                      << "\n";
  const auto src = dschat::load_source(file.string());
  fs::remove(file);
  REQUIRE(src.rows.size() == 1);
  const auto& row = src.rows[0];
  CHECK(dschat::prompt_answer_text(row, row.chosen, ts).full ==
        "<|im_start|>system\n  Be nice. <|im_end|>\n<|im_start|>user\n\n hi  there \n<|im_end|>\n<|im_start|>"
        "assistant\n ok  <|im_end|>\n<|im_start|>user\nagain?<|im_end|>\n<|im_start|>assistant\n final answer\n"
        "<|im_end|>\n");
  // a DS-Chat row's answer " Hello. " is stripped, as its prompt's turns are
  const dschat::sample ds{"\n\nHuman: hi\n\nAssistant:", " Hello. ", ""};
  const std::string full = dschat::prompt_answer_text(ds, ds.chosen, ts).full, end = "<|im_start|>assistant\nHello.<|im_end|>\n";
  REQUIRE(full.size() >= end.size());
  CHECK(full.substr(full.size() - end.size()) == end);
}

// An HF tokenizer.json without tokenizer_config.json has no EOS (eos_id -1): steps 1-2 append none
// (tokenizer::encode's rule) rather than the id -1, which failed in embedding_forward at the first batch.
TEST_CASE("tokenization: a tokenizer without EOS appends none to SFT and RM sequences") {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("flowrun_noeos_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  fs::copy_file(kDir + "/qwen2/tokenizer.json", dir / "tokenizer.json", fs::copy_options::overwrite_existing);
  auto tok = load_tokenizer(dir.string());
  REQUIRE(tok->eos_id() < 0);
  dschat::sample row;
  row.prompt = "\n\nHuman: What is two plus two?\n\nAssistant:";
  row.chosen = " Four, of course, as anyone can count.";
  row.rejected = " Five.";
  for (const int64_t max_len : {int64_t{96}, int64_t{8}}) {  // whole, and cut
    CAPTURE(max_len);
    dschat::tokenize_settings ts;
    ts.max_seq_len = max_len;
    const auto sft = dschat::make_sft_examples({row}, *tok, ts);
    REQUIRE(sft.size() == 1);
    auto want = tok->encode(row.prompt + row.chosen, /*add_bos=*/true);
    if (static_cast<int64_t>(want.size()) > max_len) want.resize(static_cast<size_t>(max_len));
    CHECK(sft[0].ids == want);  // no -1 anywhere
    CHECK(sft[0].prompt_len <= static_cast<int64_t>(sft[0].ids.size()));
    const auto rm = dschat::make_rm_examples({row}, *tok, ts);
    REQUIRE(rm.size() == 1);
    for (const auto* v : {&rm[0].chosen, &rm[0].rejected})
      CHECK(std::all_of(v->begin(), v->end(), [&](int32_t id) { return id >= 0 && id < tok->vocab_size(); }));
  }
  fs::remove_all(dir);
}
