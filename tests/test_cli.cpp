// The flowrun program as a user runs it.
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <regex>
#include <string>
#include <vector>

#include <unistd.h>

#include "test_util.h"

// The graphs whose inputs a fresh checkout lacks (dpo.graph reads step 1's output, grpo.graph the generated
// addition data), pointed at the assets, so that their checks run past the files (a missing file stops them)
#define DPO_MODEL " --set node.dpo.model=model/stories260K/stories260K.bin"
#define GRPO_DATA " --set node.sft.data=data/gsm8k/test.jsonl --set node.prompts.data=data/gsm8k/test.jsonl"

namespace {

// Run a command; return its standard output and set *rc to its exit status.
std::string run(const std::string& cmd, int* rc) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  std::array<char, 4096> buf{};
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
  int st = pclose(p);
  *rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return out;
}

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// stories260K as an HF folder (flowrun convert) in a fresh temporary folder NAME.
std::filesystem::path stories_hf_folder(const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() / name;
  std::filesystem::remove_all(dir);
  int rc = -1;
  run(std::string(FLOWRUN_BIN) + " convert --from llama2c model/stories260K/stories260K.bin --to hf " + dir.string() +
          " --tokenizer model/stories260K/tok512.model 2>&1",
      &rc);
  REQUIRE(rc == 0);
  return dir;
}

}  // namespace

TEST_CASE("flowrun generate with temperature 0 prints greedy_from_bos_text") {
  auto ref = flowrun::test::load_json_asset("ref/stories260K_forward_reference.json");
  auto want = ref["greedy_from_bos_text"].get<std::string>();
  int rc = -1;
  auto out = run(std::string(FLOWRUN_BIN) + " generate --temperature 0 --max_new_tokens 200 2>/dev/null", &rc);
  CHECK(rc == 0);
  CHECK(out == want + "\n");
}

TEST_CASE("flowrun generate: an empty prompt without a BOS, and a length past the context, are said") {
  int rc = -1;
  // Qwen2's tokenizer has no BOS: "empty prompt (add a BOS token)" came from inside generate()
  auto out = run(std::string(FLOWRUN_BIN) + " generate --model " + FLOWRUN_SOURCE_DIR +
                     "/tests/fixtures/hf_chat/qwen2 --prompt '' 2>&1",
                 &rc);
  CHECK(rc != 0);
  CHECK(has(out, "--prompt is empty and the tokenizer"));
  CHECK(has(out, "has no BOS token to start from: give a prompt"));
  // 1000 new tokens after 2 in a 512-token context: it stopped at the context without a word
  // --temperature 0 (greedy) beside a sampling filter: refused, as a generation_config.json's do_sample with
  // temperature 0 is (the filter was ignored without a word)
  out = run(std::string(FLOWRUN_BIN) + " generate --prompt Once --temperature 0 --top_k 5 2>&1", &rc);
  CHECK(rc == 1);
  CHECK(has(out, "--top_p / --top_k shape sampling, but the temperature is 0 (--temperature 0): greedy decoding "
                 "would ignore them"));
  // a prompt that fills the context: one error naming it and the limit (a warning of "at most 0 new tokens" came first)
  out = run(std::string(FLOWRUN_BIN) + " generate --prompt \"$(printf 'the cat sat on the mat. %.0s' $(seq 200))\" 2>&1",
            &rc);
  CHECK(rc == 1);
  CHECK(has(out, "--prompt is "));
  CHECK(has(out, "tokens, which fill "));
  CHECK_FALSE(has(out, "after at most 0 new tokens"));
  out = run(std::string(FLOWRUN_BIN) + " generate --prompt Once --temperature 0 --max_new_tokens 1000 2>&1", &rc);
  CHECK(rc == 0);
  CHECK(has(out, "--max_new_tokens 1000: 2 prompt tokens (--prompt) + 1000 new ones pass "));
  CHECK(has(out, "generation stops at the context, after at most 510 new tokens"));
}

TEST_CASE("flowrun generate --test_path answers every line, as --prompt alone with --seed + the line's index") {
  // TencentPretrain's generate_lm reads --test_path and writes --prediction_path; generate took one --prompt
  namespace fs = std::filesystem;
  const auto dir = fs::temp_directory_path() / "flowrun_cli_test_path";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::vector<std::string> lines = {"Once upon a time", "The cat", "Lily had a", "Tom", "One day", "The sun",
                                          "A little", "Mom said", "The bird", "Ben and", "It was", "The dog",
                                          "She", "They went", "After", "In the park", "The big", "At night"};
  {
    std::ofstream f(dir / "prompts.txt");
    for (const auto& l : lines) f << l << "\r\n";  // a Windows file's line ends too
  }
  const std::string bin = std::string(FLOWRUN_BIN), opts = " --max_new_tokens 10 --temperature 0.9 --top_p 0.9";
  int rc = -1;
  run(bin + " generate --test_path " + (dir / "prompts.txt").string() + " --prediction_path " +
          (dir / "out.txt").string() + opts + " 2>/dev/null",
      &rc);
  REQUIRE(rc == 0);
  std::stringstream got;
  got << std::ifstream(dir / "out.txt").rdbuf();
  // each prompt's text then an empty line; 18 lines are two batches (16 + 2), line i sampling with seed 42 + i
  std::string want;
  for (size_t i = 0; i < lines.size(); ++i)
    want += run(bin + " generate --prompt '" + lines[i] + "' --seed " + std::to_string(42 + i) + opts + " 2>/dev/null",
                &rc) +
            "\n";
  CHECK(got.str() == want);
  CHECK(has(got.str(), "Lily had a"));
  // refused before the model loads: with --prompt, no file, no line, the prompts' own file, a missing folder
  auto out = run(bin + " generate --test_path " + (dir / "prompts.txt").string() + " --prompt x 2>&1", &rc);
  CHECK(rc == 2);
  CHECK(has(out, "--prompt excludes --test_path"));
  { std::ofstream(dir / "empty.txt"); }
  out = run(bin + " generate --test_path " + (dir / "empty.txt").string() + " 2>&1", &rc);
  CHECK(has(out, "holds no line: give one prompt per line"));
  out = run(bin + " generate --test_path " + (dir / "prompts.txt").string() + " --prediction_path " +
                (dir / "prompts.txt").string() + " 2>&1",
            &rc);
  CHECK(has(out, "is the --test_path file: the prompts would be overwritten"));
  out = run(bin + " generate --test_path " + (dir / "prompts.txt").string() + " --prediction_path " +
                (dir / "no" / "out.txt").string() + " 2>&1",
            &rc);
  CHECK(has(out, "does not exist: create it or write elsewhere"));
  out = run(bin + " generate --test_path " + dir.string() + " 2>&1", &rc);
  CHECK(has(out, "is a folder: give a text file, one prompt per line"));
  // line i samples with --seed + i, which must stay a seed --seed can say
  out = run(bin + " generate --test_path " + (dir / "prompts.txt").string() + " --seed 4294967290 2>&1", &rc);
  CHECK(rc == 1);
  CHECK(has(out, "past the largest --seed (4294967295); give --seed at most 4294967278"));
  out = run(bin + " generate --test_path " + (dir / "prompts.txt").string() + " --prediction_path " + dir.string() +
                " 2>&1",
            &rc);
  CHECK(has(out, "is a folder: give a file to write"));
  // a UTF-8 byte order mark (Windows editors write one) is no part of the first prompt
  {
    std::ofstream f(dir / "bom.txt");
    f << "\xEF\xBB\xBF" << lines[0] << "\n";
  }
  CHECK(run(bin + " generate --test_path " + (dir / "bom.txt").string() + opts + " 2>/dev/null", &rc) ==
        run(bin + " generate --test_path " + (dir / "prompts.txt").string() + opts + " 2>/dev/null", &rc)
            .substr(0, run(bin + " generate --test_path " + (dir / "bom.txt").string() + opts + " 2>/dev/null", &rc).size()));
  // an empty line of a tokenizer without BOS is named by its line
  {
    std::ofstream f(dir / "qwen.txt");
    f << "hi\n\nthere\n";
  }
  out = run(bin + " generate --model " + FLOWRUN_SOURCE_DIR + "/tests/fixtures/hf_chat/qwen2 --test_path " +
                (dir / "qwen.txt").string() + " 2>&1",
            &rc);
  CHECK(rc != 0);
  CHECK(has(out, "qwen.txt line 2 is empty and the tokenizer"));
  fs::remove_all(dir);
}

TEST_CASE("flowrun generate --num_beams searches beams, eval prompts --num_beams too, sampling options beside it refused") {
  // DS-Chat's prompt_eval.py and transformers take --num_beams; there was no beam search (its tokens equal
  // transformers': test_generate "beam search gives transformers' tokens ...")
  const std::string bin = std::string(FLOWRUN_BIN);
  int rc = -1;
  auto beams = run(bin + " generate --prompt 'Once upon a time' --num_beams 4 --max_new_tokens 40 2>/dev/null", &rc);
  CHECK(rc == 0);
  auto greedy = run(bin + " generate --prompt 'Once upon a time' --temperature 0 --max_new_tokens 40 2>/dev/null", &rc);
  CHECK(beams.rfind("Once upon a time", 0) == 0);
  CHECK(beams != greedy);  // 4 beams find another continuation than greedy decoding here
  // the sampling defaults do not apply; a sampling option given does not mix with beams
  auto out = run(bin + " generate --prompt Once --num_beams 2 --temperature 0.8 2>&1", &rc);
  CHECK(rc == 1);
  CHECK(has(out, "--num_beams 2 searches beams deterministically (transformers' num_beams without do_sample): drop "
                 "--temperature / --top_p / --top_k"));
  out = run(bin + " eval prompts --baseline model/stories260K/stories260K.bin --finetuned model/stories260K/stories260K.bin "
                  "--n 1 --max_new_tokens 8 --num_beams 2 2>/dev/null",
            &rc);
  CHECK(rc == 0);
  CHECK(has(out, "beam search (2 beams) answers, at most 8 tokens"));
  // an HF folder's generation_config.json num_beams and length_penalty, as transformers takes them (decoded greedily);
  // beam sampling refused; --length_penalty without beams refused (it did nothing)
  const auto dir = stories_hf_folder("flowrun_cli_beams_config");
  std::ofstream(dir / "generation_config.json") << R"({"bos_token_id": 1, "eos_token_id": [2, 1], "num_beams": 4,
                                                     "length_penalty": -1.0})";
  const std::string prompt = " --prompt 'The cat' --max_new_tokens 20 2>/dev/null";
  const auto from_file = run(bin + " generate --model " + dir.string() + prompt, &rc);
  CHECK(rc == 0);
  CHECK(from_file == run(bin + " generate --num_beams 4 --length_penalty -1" + prompt, &rc));
  CHECK(from_file != run(bin + " generate --model " + dir.string() + " --num_beams 1" + prompt, &rc));
  std::ofstream(dir / "generation_config.json") << R"({"eos_token_id": [2, 1], "num_beams": 4, "do_sample": true})";
  out = run(bin + " generate --model " + dir.string() + " --prompt x 2>&1", &rc);
  CHECK(rc == 1);
  CHECK(has(out, "do_sample true with num_beams 4: beam sampling is not supported here"));
  out = run(bin + " generate --prompt x --length_penalty 2 2>&1", &rc);
  CHECK(rc == 1);
  CHECK(has(out, "--length_penalty scores the beams of beam search, and there is none here"));
  // chat has no beam search: a file's num_beams (and its beam keys) are said as not applied, not left out silently
  std::ofstream(dir / "generation_config.json") << R"({"eos_token_id": [2, 1], "num_beams": 3, "early_stopping": true})";
  out = run("printf 'The cat\\nquit\\n' | " + bin + " chat --model " + dir.string() + " --max_new_tokens 8 2>&1", &rc);
  CHECK(rc == 0);
  CHECK(has(out, "early_stopping true, num_beams 3 shape transformers' decoding and are not applied here"));
  CHECK_FALSE(has(out, "repetition_penalty, num_beams, length_penalty"));  // not listed as applied by chat
  // eval prompts takes each folder's token masks beside its greedy search (transformers' generate() applies them):
  // the same weights answer "Anna, I'm sorr"; with the comma (432) suppressed the fine-tuned folder's answer has none
  std::ofstream(dir / "generation_config.json") << R"({"eos_token_id": [2, 1], "suppress_tokens": [432]})";
  out = run(bin + " eval prompts --baseline model/stories260K/stories260K.bin --finetuned " + dir.string() +
                " --n 1 --max_new_tokens 12 2>&1",
            &rc);
  CHECK(rc == 0);
  CHECK(has(out, dir.string() + ": suppress_tokens [432] (" + (dir / "generation_config.json").string() + ")"));
  const auto b = out.find("---------- baseline"), t = out.find("---------- fine-tuned"), e = out.find("[flowrun eval]");
  REQUIRE(b < t);
  REQUIRE(t < e);
  CHECK(has(out.substr(b, t - b), "Anna,"));
  CHECK_FALSE(has(out.substr(t, e - t), ","));
  std::filesystem::remove_all(dir);
}

TEST_CASE("flowrun generate: an HF folder without a tokenizer is warned about before the default reads its text") {
  // AutoTokenizer refuses such a folder; the default tok512.model read it silently
  int rc = -1;
  auto out = run(std::string(FLOWRUN_BIN) + " generate --model " + FLOWRUN_SOURCE_DIR +
                     "/tests/fixtures/hf/llama --prompt hi --temperature 0 --max_new_tokens 2 2>&1",
                 &rc);
  CHECK(has(out, "tests/fixtures/hf/llama holds no tokenizer (tokenizer.json, tokenizer.model or vocab.json + "
                 "merges.txt): its text is read with model/stories260K/tok512.model"));
  CHECK(rc != 0);  // and then refused: tok512's 512 ids do not fit the fixture's 96 embedding rows
  CHECK(has(out, "has 96 embedding rows: it is not the model's tokenizer"));
}


TEST_CASE("flowrun chat stops where an HF folder's generation_config.json says, as generate does") {
  // chat and eval stopped at the tokenizer's EOS alone
  const auto dir = stories_hf_folder("flowrun_cli_chat_stops");
  int rc = -1;
  const std::string chat = "printf 'Once upon a time\\nquit\\n' | " + std::string(FLOWRUN_BIN) + " chat --model " +
                           dir.string() + " --max_new_tokens 60 2>/dev/null";
  // convert from a llama2.c file: the folder stops where the file does, at EOS or a new BOS (run.c's rule)
  {
    std::ifstream in(dir / "generation_config.json");
    REQUIRE(in);
    CHECK(nlohmann::json::parse(in)["eos_token_id"] == nlohmann::json::array({2, 1}));
  }
  const auto free_run = run(chat, &rc);
  REQUIRE(rc == 0);
  REQUIRE(has(free_run, "to the park. Anna"));  // without the list: on past the full stop (id 426)
  std::ofstream(dir / "generation_config.json") << R"({"bos_token_id": 1, "eos_token_id": [2, 426]})";
  const auto stopped = run(chat, &rc);
  CHECK(rc == 0);
  CHECK(has(stopped, "to the park.\n"));
  CHECK_FALSE(has(stopped, "to the park. Anna"));
  // train-lm from it keeps its generation_config.json beside the output (it was dropped)
  const auto out = std::filesystem::temp_directory_path() / "flowrun_cli_chat_stops_tl";
  std::filesystem::remove_all(out);
  run(std::string(FLOWRUN_BIN) + " train-lm --init " + dir.string() + " --steps 1 --output " + out.string() + " 2>&1", &rc);
  CHECK(rc == 0);
  CHECK(std::filesystem::exists(out / "generation_config.json"));
  std::filesystem::remove_all(out);
  std::filesystem::remove_all(dir);
}

TEST_CASE("convert from an HF folder keeps the folder's tokenizer and generation_config.json") {
  // hf -> hf (another dtype) and hf -> llama2c dropped the tokenizer unless --tokenizer named it, and
  // hf -> hf dropped generation_config.json: the new folder neither tokenized nor stopped as its source
  const auto src = stories_hf_folder("flowrun_cli_convert_keeps");
  std::ofstream(src / "generation_config.json") << R"({"bos_token_id": 1, "eos_token_id": [2, 426]})";
  const auto dst = std::filesystem::temp_directory_path() / "flowrun_cli_convert_keeps_bf16";
  const auto bin = std::filesystem::temp_directory_path() / "flowrun_cli_convert_keeps_c" / "m.bin";
  std::filesystem::remove_all(dst);
  std::filesystem::remove_all(bin.parent_path());
  int rc = -1;
  auto out = run(std::string(FLOWRUN_BIN) + " convert --from hf " + src.string() + " --to hf " + dst.string() +
                     " --dtype bf16 2>&1",
                 &rc);
  REQUIRE(rc == 0);
  CHECK(has(out, "tokenizer: " + src.string() + "'s own (--tokenizer for another)"));
  CHECK(std::filesystem::exists(dst / "tokenizer.model"));
  {
    std::ifstream in(dst / "generation_config.json");
    REQUIRE(in);
    CHECK(nlohmann::json::parse(in)["eos_token_id"] == nlohmann::json::array({2, 426}));
  }
  // the new folder generates with its own tokenizer, stopping at the source's full stop (id 426)
  out = run(std::string(FLOWRUN_BIN) + " generate --model " + dst.string() +
                " --prompt 'Once upon a time' --temperature 0 --max_new_tokens 60 2>/dev/null",
            &rc);
  CHECK(rc == 0);
  CHECK(has(out, "there was a little girl named Lily.\n"));  // without the list: on into the next sentence
  CHECK_FALSE(has(out, "Lily. "));
  run(std::string(FLOWRUN_BIN) + " convert --from hf " + src.string() + " --to llama2c " + bin.string() + " 2>&1", &rc);
  REQUIRE(rc == 0);
  CHECK(std::filesystem::exists(bin.parent_path() / "tokenizer.model"));
  // written over with another model, the folder keeps nothing of the one before: the Qwen2 fixture has no
  // generation_config.json (the stories one stayed, and its bos 1 / eos [2, 426] were read as Qwen2's)...
  const std::string qwen = std::string(FLOWRUN_SOURCE_DIR) + "/tests/fixtures/hf_chat/qwen2";
  out = run(std::string(FLOWRUN_BIN) + " convert --from hf " + qwen + " --to hf " + dst.string() + " 2>&1", &rc);
  REQUIRE(rc == 0);
  CHECK_FALSE(std::filesystem::exists(dst / "generation_config.json"));
  CHECK(has(out, "removed " + (dst / "generation_config.json").string() + ", an earlier model's"));
  CHECK(std::filesystem::exists(dst / "tokenizer.json"));
  CHECK_FALSE(std::filesystem::exists(dst / "tokenizer.model"));
  // ... and a model without a tokenizer (a llama2.c file alone in its folder) leaves none of the earlier one's
  const auto alone = dst.parent_path() / "alone";
  std::filesystem::create_directories(alone);
  std::filesystem::copy_file(flowrun::test::model_path(), alone / "m.bin",
                             std::filesystem::copy_options::overwrite_existing);
  out = run(std::string(FLOWRUN_BIN) + " convert --from llama2c " + (alone / "m.bin").string() + " --to hf " +
                dst.string() + " 2>&1",
            &rc);
  REQUIRE(rc == 0);
  CHECK_FALSE(std::filesystem::exists(dst / "tokenizer.json"));
  CHECK(has(out, "removed the tokenizer an earlier model left in " + dst.string()));
  // a llama2.c file read with the tokenizer convert wrote beside it (tok512 read a BPE model's file silently)
  const auto bpe_hf = std::filesystem::temp_directory_path() / "flowrun_cli_convert_keeps_bpe";
  const auto bpe_bin = std::filesystem::temp_directory_path() / "flowrun_cli_convert_keeps_bpe_c" / "m.bin";
  std::filesystem::remove_all(bpe_hf);
  std::filesystem::remove_all(bpe_bin.parent_path());
  run(std::string(FLOWRUN_BIN) + " convert --from llama2c model/stories260K/stories260K.bin --to hf " + bpe_hf.string() +
          " --tokenizer " + FLOWRUN_SOURCE_DIR + "/tests/fixtures/bpe/vocab.json 2>&1",
      &rc);
  REQUIRE(rc == 0);
  run(std::string(FLOWRUN_BIN) + " convert --from hf " + bpe_hf.string() + " --to llama2c " + bpe_bin.string() + " 2>&1",
      &rc);
  REQUIRE(rc == 0);
  CHECK(std::filesystem::exists(bpe_bin.parent_path() / "vocab.json"));
  out = run(std::string(FLOWRUN_BIN) + " generate --model " + bpe_bin.string() + " --max_new_tokens 2 2>&1", &rc);
  CHECK(rc == 0);
  CHECK(has(out, "tokenizer: " + bpe_bin.parent_path().string() + " (the model's own; --tokenizer to use another)"));
  // back to HF without --tokenizer: the tokenizer beside the llama2.c file goes along (it was dropped, and
  // llama2.c's BOS 1 / EOS 2 written whatever the tokenizer's were)
  const auto back = std::filesystem::temp_directory_path() / "flowrun_cli_convert_keeps_back";
  std::filesystem::remove_all(back);
  out = run(std::string(FLOWRUN_BIN) + " convert --from llama2c " + bpe_bin.string() + " --to hf " + back.string() +
                " 2>&1",
            &rc);
  REQUIRE(rc == 0);
  CHECK(has(out, "tokenizer: " + bpe_bin.parent_path().string() + ", beside the llama2.c file (--tokenizer for another)"));
  CHECK(std::filesystem::exists(back / "vocab.json"));
  CHECK(has(run(std::string(FLOWRUN_BIN) + " generate --model " + back.string() + " --max_new_tokens 2 2>&1", &rc),
            "tokenizer: " + back.string() + " (the model's own"));
  // another model's llama2.c file into that folder is refused before anything is written (its tokenizer was
  // copied beside the BPE one, and neither file read its text again: a review, 2026-12-06)
  const auto other = bpe_bin.parent_path() / "other.bin";
  out = run(std::string(FLOWRUN_BIN) + " convert --from hf " + src.string() + " --to llama2c " + other.string() + " 2>&1",
            &rc);
  CHECK(rc != 0);
  CHECK(has(out, "convert: " + bpe_bin.parent_path().string() + " already holds another model's tokenizer ("));
  CHECK(has(out, "write " + other.string() + " into a folder of its own"));
  CHECK_FALSE(std::filesystem::exists(other));
  CHECK_FALSE(std::filesystem::exists(bpe_bin.parent_path() / "tokenizer.model"));
  // the same tokenizer's model again, under another name, is welcome there
  run(std::string(FLOWRUN_BIN) + " convert --from hf " + bpe_hf.string() + " --to llama2c " +
          (bpe_bin.parent_path() / "again.bin").string() + " 2>&1",
      &rc);
  CHECK(rc == 0);
}

TEST_CASE("train-lm --init an HF folder trains on the folder's own tokenizer unless --tokenizer is given") {
  // it trained a Qwen2 folder (vocab 902) on tok512's ids and wrote tok512 over its tokenizer in --output
  const std::string qwen = std::string(FLOWRUN_SOURCE_DIR) + "/tests/fixtures/hf_chat/qwen2";
  const auto out = std::filesystem::temp_directory_path() / "flowrun_cli_tl_own_tok";
  std::filesystem::remove_all(out);
  int rc = -1;
  auto log = run(std::string(FLOWRUN_BIN) + " train-lm --init " + qwen + " --steps 1 --output " + out.string() + " 2>&1", &rc);
  CHECK(rc == 0);
  CHECK(has(log, "tokenizer: " + qwen + " (the model's own; --tokenizer to use another)"));
  CHECK(std::filesystem::exists(out / "tokenizer.json"));
  CHECK_FALSE(std::filesystem::exists(out / "tokenizer.model"));  // tok512's file, which it wrote before
  std::filesystem::remove_all(out);
}

TEST_CASE("train-lm refuses an --output that is its data or its base model, and a tokenizer the model cannot read") {
  // --output over --data turned the training text into a model file, over --init lost the base, with exit 0;
  // a tokenizer with more ids than the embedding failed at its first such id inside embedding_forward
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("flowrun_cli_tl_inputs_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  fs::copy_file(std::string(FLOWRUN_SOURCE_DIR) + "/graphs/rlhf.graph", dir / "d.txt");  // any text
  const std::string tl = std::string(FLOWRUN_BIN) + " train-lm --steps 1 --seq_length 16 ";
  int rc = -1;
  auto out = run(tl + "--data " + (dir / "d.txt").string() + " --output " + (dir / "d.txt").string() + " 2>&1", &rc);
  CHECK(rc != 0);
  CHECK(has(out, "is the training data (--data " + (dir / "d.txt").string() + "): it would be overwritten by the model"));
  CHECK(fs::file_size(dir / "d.txt") == fs::file_size(std::string(FLOWRUN_SOURCE_DIR) + "/graphs/rlhf.graph"));
  run(tl + "--data " + (dir / "d.txt").string() + " --output " + (dir / "m.bin").string() + " 2>&1", &rc);
  REQUIRE(rc == 0);
  const auto before = fs::file_size(dir / "m.bin");
  out = run(tl + "--data " + (dir / "d.txt").string() + " --init " + (dir / "m.bin").string() + " --output " +
                (dir / "." / "m.bin").string() + " 2>&1",
            &rc);
  CHECK(rc != 0);
  CHECK(has(out, "is the model it starts from (--init " + (dir / "m.bin").string() + "): the base would be lost"));
  CHECK(fs::file_size(dir / "m.bin") == before);
  // the Qwen2 fixture's tokenizer (902 ids) against stories260K (512 rows): named before training
  const std::string qwen = std::string(FLOWRUN_SOURCE_DIR) + "/tests/fixtures/hf_chat/qwen2";
  out = run(tl + "--data " + (dir / "d.txt").string() + " --init model/stories260K/stories260K.bin --tokenizer " + qwen +
                " 2>&1",
            &rc);
  CHECK(rc != 0);
  CHECK(has(out, "the tokenizer " + qwen + " has 902 tokens, and the model model/stories260K/stories260K.bin has 512 "
                 "embedding rows"));
  // a random model gets an embedding row per token of its tokenizer
  out = run(tl + "--data " + (dir / "d.txt").string() + " --init random --tokenizer " + qwen + " 2>&1", &rc);
  CHECK(rc == 0);
  CHECK(has(out, "vocab=902"));
  fs::remove_all(dir);
}

TEST_CASE("pretraining refuses a data tokenizer that is not the model folder's own, when checked") {
  // zero_rank checked only that the data's ids fit the embedding, mid-run: tok512's ids trained a Qwen2
  // folder whose own tokenizer is another (902 tokens) without a word, and its export shipped that folder's
  // tokenizer with a model trained on other ids (a break-it review, 2026-12-06)
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("flowrun_cli_pt_tok_" + std::to_string(::getpid()));
  const std::string qwen = std::string(FLOWRUN_SOURCE_DIR) + "/tests/fixtures/hf_chat/qwen2";
  const std::string pt = std::string(FLOWRUN_BIN) + " run " + FLOWRUN_SOURCE_DIR +
                         "/graphs/pretrain.graph --no-progress -q --set node.ranks.model=" + qwen +
                         " --set node.ranks.output_dir=" + dir.string() + " --set node.data.output_dir=" + dir.string() +
                         " --set node.ranks.export_hf= --set node.data.total_steps=1 --set node.ranks.total_steps=1";
  int rc = -1;
  auto out = run(pt + " 2>&1", &rc);
  CHECK(rc == 2);
  CHECK(has(out, "node 'ranks' trains on the tokens of its data node 'data', which reads them with the tokenizer "));
  CHECK(has(out, "has a tokenizer of its own in its folder: they differ (902 tokens against 512)"));
  CHECK(has(out, "give node 'data' the model's own tokenizer (for a Hugging Face folder: --set node.data.tokenizer=FOLDER)"));
  CHECK_FALSE(fs::exists(dir / "step_00000001"));
  // the folder's own tokenizer passes the check and trains
  out = run(pt + " --set node.data.tokenizer=" + qwen + " 2>&1", &rc);
  CHECK_MESSAGE(rc == 0, out);
  CHECK(fs::exists(dir / "step_00000001"));
  fs::remove_all(dir);
  // a llama2.c model's vocab_size is its tokenizer's: a smaller tokenizer (the 400-token BPE fixture against
  // stories260K's 512 rows) trained on other ids without a word; refused for pretraining and for the trainers
  const std::string bpe = std::string(FLOWRUN_SOURCE_DIR) + "/tests/fixtures/bpe/vocab.json";
  out = run(std::string(FLOWRUN_BIN) + " run " + FLOWRUN_SOURCE_DIR + "/graphs/pretrain.graph --check --set "
                "node.data.tokenizer=" + bpe + " 2>&1",
            &rc);
  CHECK(rc == 2);
  CHECK(has(out, "which reads them with the tokenizer " + bpe + " (400 tokens), and the llama2.c model "));
  CHECK(has(out, "has vocab_size 512, which a llama2.c model shares with its tokenizer: it is not the model's "
                 "tokenizer"));
  out = run(std::string(FLOWRUN_BIN) + " run " + FLOWRUN_SOURCE_DIR + "/graphs/sft.graph --check --set "
                "node.sft.tokenizer=" + bpe + " 2>&1",
            &rc);
  CHECK(rc == 2);
  CHECK(has(out, "node 'sft' reads its data with the tokenizer " + bpe + " (400 tokens), and the llama2.c model"));
}

TEST_CASE("a graph whose model output is a file or folder it reads is refused when checked") {
  // zero_rank's export_hf over its HF base folder replaced the weights it started from (its rerun then
  // refused its own checkpoint: the model's bytes had changed); sft's output over its model alike
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("flowrun_cli_out_in_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  fs::copy(std::string(FLOWRUN_SOURCE_DIR) + "/tests/fixtures/hf_chat/qwen2", dir / "q", fs::copy_options::recursive);
  const auto weights = fs::file_size(dir / "q" / "model.safetensors");
  const std::string bin = std::string(FLOWRUN_BIN) + " run " + FLOWRUN_SOURCE_DIR + "/graphs/";
  int rc = -1;
  auto out = run(bin + "pretrain.graph --no-progress --set node.ranks.model=" + (dir / "q").string() +
                     " --set node.data.tokenizer=" + (dir / "q").string() + " --set node.ranks.export_hf=" +
                     (dir / "q").string() + "/ 2>&1",
                 &rc);
  CHECK(rc == 2);
  CHECK(has(out, "error: setting 'export_hf' of node 'ranks' saves to the place 'tokenizer' of node 'data' reads"));
  CHECK(has(out, "the save would overwrite what the run starts from"));
  CHECK(fs::file_size(dir / "q" / "model.safetensors") == weights);
  fs::copy_file(flowrun::test::model_path(), dir / "m.bin");
  out = run(bin + "sft.graph --no-progress --set node.sft.model=" + (dir / "m.bin").string() + " --set node.sft.output=" +
                (dir / "m.bin").string() + " 2>&1",
            &rc);
  CHECK(rc == 2);
  CHECK(has(out, "error: setting 'output' of node 'sft' saves to the place 'model' of node 'sft' reads"));
  // directly into a folder it reads: the base model's (a file beside its weights, or its weights' own name)
  for (const std::string into : {"hf", "model.safetensors"}) {
    out = run(bin + "pretrain.graph --no-progress --set node.ranks.model=" + (dir / "q").string() +
                  " --set node.data.tokenizer=" + (dir / "q").string() + " --set node.ranks.export_hf=" +
                  (dir / "q" / into).string() + " 2>&1",
              &rc);
    CHECK(rc == 2);
    CHECK_MESSAGE(has(out, "error: setting 'export_hf' of node 'ranks' saves into the folder 'tokenizer' of node "
                           "'data' reads"),  // the first node to read it
                  out);
    CHECK(has(out, "the save would add to or replace the files the run starts from"));
    CHECK(has(out, "hint: give export_hf a path outside '" + (dir / "q").string() + "'"));
  }
  CHECK(fs::file_size(dir / "q" / "model.safetensors") == weights);
  // into a step folder of the run's checkpoints, or their commit file: the next commit prunes it
  for (const std::string into : {"step_00000001/hf", "latest"}) {
    out = run(bin + "pretrain.graph --no-progress --set node.ranks.output_dir=" + (dir / "ck").string() +
                  " --set node.data.output_dir=" + (dir / "ck").string() + " --set node.ranks.save_lora=" +
                  (dir / "ck" / into).string() + " 2>&1",
              &rc);
    CHECK(rc == 2);
    CHECK_MESSAGE(has(out, "error: setting 'save_lora' of node 'ranks' saves into " +
                               std::string(into == std::string("latest") ? "the commit file `latest`" : "a step folder") +
                               " of the checkpoints in output_dir of node 'ranks' ('" + (dir / "ck").string() + "')"),
                  out);
    CHECK(has(out, "the run's checkpoints write, replace or prune it"));
  }
  // deeper than the checkpoint folder's own step folders and `latest`, a folder of its own: a save like any other
  for (const std::string into : {"exports/latest", "hf/step_00000001"}) {
    out = run(bin + "pretrain.graph --check --set node.ranks.output_dir=" + (dir / "ck").string() +
                  " --set node.data.output_dir=" + (dir / "ck").string() + " --set node.ranks.export_hf=" +
                  (dir / "ck" / into).string() + " 2>&1",
              &rc);
    CHECK_MESSAGE(rc == 0, out);
  }
  // [graph] checkpoint_dir holds a folder per step-3 trainer: a policy output there passed, and the run failed at
  // its end, after training
  out = run(bin + "rlhf.graph --check --set graph.checkpoint_dir=" + (dir / "g").string() + " --set node.policy.output=" +
                (dir / "g" / "policy").string() + " 2>&1",
            &rc);
  CHECK(rc == 2);
  CHECK(has(out, "error: setting 'output' of node 'policy' saves into the folder of node 'policy' of the checkpoints "
                 "in [graph] checkpoint_dir ('" + (dir / "g").string() + "')"));
  CHECK_FALSE(fs::exists(dir / "ck" / "latest"));
  // the folder's lock file (dir_lock rewrote a model saved there) and a node's settings record are the checkpoints' too
  for (const std::string into : {".flowrun.lock", "data.settings.json"}) {
    out = run(bin + "pretrain.graph --check --set node.ranks.output_dir=" + (dir / "ck").string() +
                  " --set node.data.output_dir=" + (dir / "ck").string() + " --set node.ranks.export_hf=" +
                  (dir / "ck" / into).string() + " 2>&1",
              &rc);
    CHECK(rc == 2);
    CHECK(has(out, into[0] == '.' ? "saves into the folder's lock file of the checkpoints"
                                  : "saves into the record of node 'data' of the checkpoints"));
  }
  // a folder of its own beside the step folders, and one deeper inside an input folder, are saves like any other
  out = run(bin + "pretrain.graph --check --set node.ranks.output_dir=" + (dir / "ck").string() +
                " --set node.data.output_dir=" + (dir / "ck").string() + " --set node.ranks.export_hf=" +
                (dir / "ck" / "hf").string() + " 2>&1",
            &rc);
  CHECK_MESSAGE(rc == 0, out);
  fs::remove_all(dir);
}

TEST_CASE("step 3: max_prompt_seq_len + max_answer_seq_len past the policy's context is refused when checked") {
  // it passed the check and stopped the run at the generator's first batch, after step 1 had trained (a break-it
  // review, 2026-12-07); the policy's model is read from the node that sends it (sft_trainer's base here)
  int rc = -1;
  const std::string rlhf = std::string(FLOWRUN_BIN) + " run " + FLOWRUN_SOURCE_DIR + "/graphs/rlhf.graph --check";
  auto out = run(rlhf + " --set node.prompts.max_prompt_seq_len=500 2>&1", &rc);
  CHECK(rc == 2);
  CHECK(has(out, "error: node 'generator': max_prompt_seq_len 500 (node 'prompts') + max_answer_seq_len 32 = 532 exceed "
                 "the policy's context, 512 positions ("));
  CHECK(has(out, "from node 'sft'): a prompt of more than 480 tokens would stop step 3 at its batch"));
  CHECK(has(out, "hint: lower max_answer_seq_len to 12 or max_prompt_seq_len to 480"));
  out = run(rlhf + " --set node.prompts.max_prompt_seq_len=480 2>&1", &rc);  // 480 + 32 = 512: fits
  CHECK_MESSAGE(rc == 0, out);
}

TEST_CASE("a --set given twice with two values is said: the later one holds") {
  // flowrun train --actor-zero-stage 3 with a --set node.sft.zero_stage=1 after it trained at stage 1 without a word
  int rc = -1;
  const std::string sft = std::string(FLOWRUN_BIN) + " run " + FLOWRUN_SOURCE_DIR + "/graphs/sft.graph --check";
  auto out = run(sft + " --set node.sft.steps=3 --set node.sft.steps=2 2>&1", &rc);
  CHECK(rc == 0);
  CHECK(has(out, "--set node.sft.steps is given twice, as 3 and then 2: the later one holds"));
  out = run(sft + " --set node.sft.steps=2 --set node.sft.steps=2 2>&1", &rc);  // the same value: nothing to say
  CHECK(rc == 0);
  CHECK_FALSE(has(out, "given twice"));
  out = run(sft + " --set node.sft.learning_rate=1e-3 --set node.sft.learning_rate=0.001 2>&1", &rc);  // nor here
  CHECK(rc == 0);
  CHECK_FALSE(has(out, "given twice"));
  // a bare word and the TOML string of it are one value (they were compared as text and warned as two)
  out = run(sft + " --set node.sft.data_split=2,4,4 --set 'node.sft.data_split=\"2,4,4\"' --set node.sft.learning_rate=1"
                  " --set node.sft.learning_rate=1.0 2>&1", &rc);
  CHECK(rc == 0);
  CHECK_FALSE(has(out, "given twice"));
  out = run(sft + " --set node.sft.data_split=2,4,4 --set 'node.sft.data_split=\"2,4,5\"' 2>&1", &rc);
  CHECK(has(out, "--set node.sft.data_split is given twice, as 2,4,4 and then \"2,4,5\": the later one holds"));
  // compared as stored: a path setting keeps the text, so 1e3 and 1000 are two folders, 1 and "1" one
  out = run(sft + " --set node.sft.output=out1e3 --set node.sft.output=1e3 --set node.sft.output=1000 2>&1", &rc);
  CHECK(has(out, "--set node.sft.output is given twice, as 1e3 and then 1000: the later one holds"));
  out = run(sft + " --set node.sft.output=1 --set 'node.sft.output=\"1\"' 2>&1", &rc);
  CHECK_FALSE(has(out, "given twice"));
  out = run(sft + " --set graph.seed=9007199254740993 --set graph.seed=9007199254740992 2>&1", &rc);  // not as doubles
  CHECK(has(out, "--set graph.seed is given twice"));
}

TEST_CASE("eval prompts with a chat template shows the prompt as rendered, its end-of-turn tokens too") {
  // the prompt was shown decoded, which drops <|im_end|> (Qwen2's EOS) and kept <|im_start|> (a review)
  const std::string q = std::string(FLOWRUN_SOURCE_DIR) + "/tests/fixtures/hf_chat/qwen2";
  int rc = -1;
  const std::string eval = std::string(FLOWRUN_BIN) + " eval prompts --baseline " + q + " --finetuned " + q +
                           " --tokenizer " + q + " --apply_chat_template --n 1 --max_new_tokens 2";
  auto out = run(eval + " --max_prompt_seq_len 200 2>&1", &rc);
  CHECK_MESSAGE(rc == 0, out);
  CHECK(has(out, "<|im_end|>\n<|im_start|>user\n"));
  CHECK(has(out, "<|im_end|>\n<|im_start|>assistant\n"));
  // a prompt max_prompt_seq_len cut is shown as the models got it: its last tokens, the system turn gone
  out = run(eval + " --max_prompt_seq_len 6 2>&1", &rc);
  CHECK_MESSAGE(rc == 0, out);
  const auto a = out.find("= prompt 1 ="), b = out.find("---------- baseline");
  REQUIRE(a != std::string::npos);
  REQUIRE(b != std::string::npos);
  CHECK_FALSE(has(out.substr(a, b - a), "<|im_start|>system"));
  CHECK(has(out.substr(a, b - a), "<|im_start|>assistant"));
}

TEST_CASE("convert onto its own source is refused, the source kept") {
  // --from hf X --to hf X --dtype bf16 replaced an fp32 folder's weights with bf16 ones without a word (a review)
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("flowrun_cli_self_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  fs::copy(std::string(FLOWRUN_SOURCE_DIR) + "/tests/fixtures/hf/llama", dir / "m", fs::copy_options::recursive);
  const auto bytes = fs::file_size(dir / "m" / "model.safetensors");
  int rc = -1;
  const auto out = run(std::string(FLOWRUN_BIN) + " convert --from hf " + (dir / "m").string() + " --to hf " +
                           (dir / "m").string() + "/ --dtype bf16 2>&1",
                       &rc);
  CHECK(rc != 0);
  CHECK(has(out, "convert: --to hf " + (dir / "m").string() + "/ is the source itself: the conversion would replace "
                 "the model it reads"));
  CHECK(fs::file_size(dir / "m" / "model.safetensors") == bytes);
  // ... nor into the adapter it merges (transformers loads a model beside adapter_config.json with that adapter)
  fs::copy(std::string(FLOWRUN_SOURCE_DIR) + "/tests/fixtures/peft/gpt2_lora", dir / "lo", fs::copy_options::recursive);
  const auto lora = run(std::string(FLOWRUN_BIN) + " convert --from hf " + FLOWRUN_SOURCE_DIR +
                            "/tests/fixtures/hf/gpt2 --lora " + (dir / "lo").string() + " --to hf " + (dir / "lo").string() +
                            " 2>&1",
                        &rc);
  CHECK(rc != 0);
  CHECK(has(lora, "is the --lora adapter's folder"));
  CHECK_FALSE(fs::exists(dir / "lo" / "config.json"));
  fs::remove_all(dir);
}

TEST_CASE("a misspelt kind is the error, not the other end's port its edge leaves unconnected") {
  // `kind = "zero_ranks"` first said the data node's required out port 'batch' was not connected (a review)
  int rc = -1;
  const auto out = run(std::string(FLOWRUN_BIN) + " run " + FLOWRUN_SOURCE_DIR +
                           "/graphs/pretrain.graph --check --set node.ranks.kind=zero_ranks 2>&1",
                       &rc);
  CHECK(rc == 2);
  CHECK(has(out, "error: unknown node kind 'zero_ranks'"));
  CHECK(has(out, "did you mean 'zero_rank'?"));
  CHECK_FALSE(has(out, "is not connected"));
}

TEST_CASE("a placement without a cluster is named: every node runs in this process") {
  // on = "w1" with the --cluster forgotten ran everything here without a word (docs/scaling.md: not interpreted)
  int rc = -1;
  const auto out = run(std::string(FLOWRUN_BIN) + " run " + FLOWRUN_SOURCE_DIR +
                           "/graphs/examples/generate.graph --no-progress --set node.generator.on=w1 2>&1",
                       &rc);
  CHECK(rc == 0);
  CHECK(has(out, "node 'generator': on = \"w1\" places it on a cluster node, but the run has no cluster"));
}

TEST_CASE("a missing model file is named, with exit code 2") {
  int rc = -1;
  auto out = run(std::string(FLOWRUN_BIN) + " generate --model no/such/model.bin 2>&1", &rc);
  CHECK(rc == 2);
  CHECK(out.find("no/such/model.bin") != std::string::npos);
}

TEST_CASE("flowrun generate: a ZeRO folder or an adapter given as --model, and bad --zero_checkpoint values, say what to do") {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("flowrun_gen_hints_" + std::to_string(::getpid()));
  fs::create_directories(dir / "ck" / "step_00000005");
  std::ofstream((dir / "ck" / "step_00000005" / "shard_00000-of-00001.msgpack").string()) << "x";
  fs::create_directories(dir / "ad");
  std::ofstream((dir / "ad" / "adapter_config.json").string()) << "{}";
  const std::string gen = std::string(FLOWRUN_BIN) + " generate --max_new_tokens 2 ";
  int rc = -1;
  auto out = run(gen + "--model " + (dir / "ck" / "step_00000005").string() + " 2>&1", &rc);
  CHECK(rc != 0);
  CHECK(out.find("(it is a ZeRO checkpoint: `flowrun generate --zero_checkpoint") != std::string::npos);
  out = run(gen + "--model " + (dir / "ad").string() + " 2>&1", &rc);
  CHECK(out.find("(it is a LoRA adapter, which goes on top of its base model: `flowrun generate --model BASE --lora") !=
        std::string::npos);
  out = run(gen + "--zero_checkpoint " + (dir / "nothing").string() + " 2>&1", &rc);
  CHECK(out.find("no such folder (zero_rank's output_dir, a trainer's CHECKPOINT_DIR/NODE, or one of their step_NNNNNNNN folders)") != std::string::npos);
  out = run(gen + "--zero_checkpoint " + (dir / "ck").string() + " 2>&1", &rc);  // no 'latest' file: the steps named
  CHECK(out.find("no committed checkpoint there (no 'latest' file); it holds 1 step folder(s): pass the one you mean, e.g. "
                 "--zero_checkpoint " + (dir / "ck" / "step_00000005").string()) != std::string::npos);
  out = run(gen + "--zero_checkpoint " + (dir / "ck").string() + " --world_size 0 2>&1", &rc);
  CHECK(rc == 2);
  CHECK(out.find("--world_size: Value 0 not in range 1 to 256") != std::string::npos);
  out = run(gen + "--zero_checkpoint " + (dir / "ck").string() + " --lora " + (dir / "ad").string() + " 2>&1", &rc);
  CHECK(out.find("--lora goes with --model (the base model), not --zero_checkpoint") != std::string::npos);
  // (--model beside --zero_checkpoint: pretrain_small.sh, on real checkpoints: a LoRA run's base, else refused)
  fs::remove_all(dir);
}

TEST_CASE("flowrun chat --apply_chat_template renders the conversation with the folder's template") {
  // chat knew only DS-Chat's Human:/Assistant: turns, so a model trained with apply_chat_template = true was
  // chatted with a format it never saw. A template that writes BOS and the messages as they are: the first
  // answer is the greedy continuation of the user's text, what generate gives for the same prompt.
  const auto dir = stories_hf_folder("flowrun_cli_chat_template");
  int rc = -1;
  const std::string chat = "printf 'Once upon a time\\nquit\\n' | " + std::string(FLOWRUN_BIN) + " chat --model " +
                           dir.string() + " --apply_chat_template --max_new_tokens 20 2>&1";
  auto out = run(chat, &rc);  // no template in the folder: refused, naming the file
  CHECK(rc != 0);
  CHECK(has(out, "tokenizer_config.json"));
  CHECK(has(out, "drop --apply_chat_template"));
  {
    std::ifstream in(dir / "tokenizer_config.json");
    auto cfg = nlohmann::json::parse(in);
    cfg["chat_template"] = "{{ bos_token }}{% for m in messages %}{{ m['content'] }}{% endfor %}";
    std::ofstream(dir / "tokenizer_config.json") << cfg.dump(1);
  }
  out = run(chat, &rc);
  REQUIRE(rc == 0);
  const auto gen = run(std::string(FLOWRUN_BIN) + " generate --model " + dir.string() +
                           " --prompt 'Once upon a time' --temperature 0 --max_new_tokens 20 2>/dev/null",
                       &rc);
  REQUIRE(rc == 0);
  const std::string story = ", there was a little girl named Lily.";
  REQUIRE(has(gen, "Once upon a time" + story));
  CHECK(has(out, "Assistant: " + story));
  CHECK_FALSE(has(out, "Human:"));
}

TEST_CASE("flowrun chat refuses --max_new_tokens that leave the conversation no room, naming the bound") {
  int rc = -1;
  // stories260K's context is 512 tokens: 512 crashed (a negative room cut the history past its end)
  auto out = run("printf 'Hi there\\nquit\\n' | " + std::string(FLOWRUN_BIN) + " chat --model model/stories260K/stories260K.bin --max_new_tokens 512 2>&1", &rc);
  CHECK(rc == 1);  // as chat's other option checks (--max_new_tokens -1)
  CHECK(out.find("--max_new_tokens 512 leaves no room for the conversation") != std::string::npos);
  CHECK(out.find("use at most 510") != std::string::npos);
  out = run("printf 'Hi there\\nquit\\n' | " + std::string(FLOWRUN_BIN) + " chat --model model/stories260K/stories260K.bin --max_new_tokens 510 2>&1", &rc);
  CHECK(rc == 0);
  CHECK(out.find("Assistant:") != std::string::npos);
}

TEST_CASE("flowrun chat samples with --temperature, through generate's sampler: turn k draws with seed + k") {
  // chat decoded greedily only (TRL's chat samples: --do_sample, --temperature, --top_k, --top_p)
  const std::string bin = std::string(FLOWRUN_BIN), model = " --model model/stories260K/stories260K.bin";
  auto reply = [](const std::string& out, int k) {  // the k-th reply of a chat's output
    std::size_t at = 0;
    for (int i = 0; i <= k; ++i) {
      at = out.find("Assistant: ", at);
      if (at == std::string::npos) return std::string();
      at += 11;
    }
    return out.substr(at, out.find('\n', at) - at);
  };
  auto chat = [&](const std::string& lines, const std::string& opts) {
    int rc = -1;
    auto out = run("printf '" + lines + "' | " + bin + " chat" + model + " --max_new_tokens 16" + opts + " 2>/dev/null", &rc);
    CHECK(rc == 0);
    return out;
  };
  auto gen = [&](const std::string& prompt, const std::string& opts) {  // generate's continuation (its text after the prompt)
    int rc = -1;
    auto out = run(bin + " generate" + model + " --max_new_tokens 16 --prompt \"$(printf '" + prompt + "')\"" + opts +
                       " 2>/dev/null",
                   &rc);
    CHECK(rc == 0);
    const std::string tail = "Assistant:";
    return out.substr(out.find(tail) + tail.size());
  };
  const std::string turn1 = "\\n\\nHuman: Once upon a time\\n\\nAssistant:";
  const auto greedy = chat("Once upon a time\\nquit\\n", "");
  const auto s1 = chat("Once upon a time\\nquit\\n", " --temperature 0.8 --top_p 0.9 --seed 1");
  const auto s2 = chat("Once upon a time\\nquit\\n", " --temperature 0.8 --top_p 0.9 --seed 2");
  REQUIRE_FALSE(reply(s1, 0).empty());
  CHECK(reply(greedy, 0) == reply(chat("Once upon a time\\nquit\\n", " --temperature 0"), 0));  // the default is greedy
  CHECK(reply(s1, 0) != reply(s2, 0));
  CHECK(reply(s1, 0) != reply(greedy, 0));
  // the same draws as generate on DS-Chat's turn text; the second turn with seed + 1
  std::string g1 = gen(turn1, " --temperature 0.8 --top_p 0.9 --seed 1");
  while (!g1.empty() && (g1.back() == '\n' || g1.back() == ' ')) g1.pop_back();
  CHECK(" " + reply(s1, 0) == g1.substr(0, reply(s1, 0).size() + 1));
  const auto two = chat("Once upon a time\\nThe end\\nquit\\n", " --temperature 0.8 --top_p 0.9 --seed 1");
  CHECK(reply(two, 0) == reply(s1, 0));
  std::string said;  // the first reply as printf's text inside '...': its quotes, percents and backslashes kept
  for (char c : reply(two, 0)) said += c == '\'' ? std::string("'\\''") : c == '%' ? "%%" : c == '\\' ? "\\\\" : std::string(1, c);
  const std::string turn2 = turn1 + " " + said + "\\n\\nHuman: The end\\n\\nAssistant:";
  std::string g2 = gen(turn2, " --temperature 0.8 --top_p 0.9 --seed 2");
  g2 = g2.substr(g2.find("The end\n\nAssistant:") + 19);
  REQUIRE_FALSE(reply(two, 1).empty());
  CHECK(" " + reply(two, 1) == g2.substr(0, reply(two, 1).size() + 1));
  // a CRLF terminal or file: "quit\r" ended nothing and "\r" went into the prompt; 'clear' starts the turns again
  CHECK(reply(chat("Once upon a time\\r\\nquit\\r\\nThe end\\r\\n", ""), 0) == reply(greedy, 0));
  CHECK(reply(chat("Once upon a time\\r\\nquit\\r\\nThe end\\r\\n", ""), 1).empty());
  const auto again = chat("Once upon a time\\nclear\\nOnce upon a time\\nquit\\n", " --temperature 0.8 --top_p 0.9 --seed 1");
  CHECK(reply(again, 1) == reply(s1, 0));
  // a filter alone would be ignored by the greedy default: refused
  int rc = -1;
  auto out = run("printf 'hi\\nquit\\n' | " + bin + " chat" + model + " --top_k 5 2>&1", &rc);
  CHECK(rc == 1);
  CHECK(has(out, "--top_p / --top_k shape sampling, but the temperature is 0 (the default here)"));
}

TEST_CASE("steps 1-2 and DPO: a share with no training rows, and SFT answers all cut under mask_prompt, say why") {
  // (a break-it review) DPO's empty share said "every one of the 0 training pairs has chosen equal to rejected ...";
  // SFT's said "0 rows, too few for a batch of 8: lower per_device_train_batch_size"; an SFT run whose answers were
  // all cut at max_seq_len trained with mask_prompt on nothing but the forced EOS (loss 25.8) without a word
  const std::string bin = std::string(FLOWRUN_BIN) + " ", src = std::string(FLOWRUN_SOURCE_DIR) + "/graphs/";
  const std::string quiet = " --no-progress --set graph.checkpoint_dir= 2>&1";
  int rc = -1;
  // a share of weight 0: refused when the graph is checked
  auto out = run(bin + src + "dpo.graph --set node.dpo.model=model/stories260K/stories260K.bin --set node.dpo.output= "
                     "--set node.dpo.data_split=10,0,0" + quiet,
                 &rc);
  CHECK(rc == 2);
  CHECK(has(out, "node 'dpo': data_split \"10,0,0\" gives step 2, whose share this node reads, weight 0"));
  // a share too small to hold a training row: refused as the data is split
  out = run(bin + src + "dpo.graph --set node.dpo.model=model/stories260K/stories260K.bin --set node.dpo.output= "
                "--set node.dpo.data_split=100000,1,0" + quiet,
            &rc);
  CHECK(rc != 0);
  CHECK(has(out, "node 'dpo': its share of the data has no training rows: give this step a larger data_split share, "
                 "or lower eval_fraction"));
  CHECK_FALSE(has(out, "chosen equal to rejected"));
  out = run(bin + src + "sft.graph --set node.sft.output= --set node.sft.eval_fraction=0.9999" + quiet, &rc);
  CHECK(rc != 0);
  CHECK(has(out, "node 'sft': its share of the data has no training rows"));
  out = run(bin + src + "sft.graph --set node.sft.output= --set node.sft.mask_prompt=true --set node.sft.truncation=end "
                        "--set node.sft.max_seq_len=16" + quiet,
            &rc);
  CHECK(rc != 0);
  CHECK(has(out, "training examples lost its whole answer at max_seq_len 16 (truncation \"end\"), and mask_prompt = "
                 "true leaves the loss only the forced EOS"));
  // learning_rate 0 beside LoRA: the LoRA rate is a ratio to it on the schedule (it trained at a constant
  // lora_learning_rate, the log printing lr 0)
  out = run(bin + src + "sft.graph --set node.sft.output= --set node.sft.lora_dim=4 --set node.sft.only_optimize_lora=true "
                        "--set node.sft.learning_rate=0" + quiet,
            &rc);
  CHECK(rc == 2);
  CHECK(has(out, "learning_rate = 0 with lora_learning_rate = 0.0005: the LoRA weights follow the schedule as a ratio"));
  // dpo.graph before sft.graph: the missing model is what the graph beside it writes (it said to fix the path)
  {
    namespace fs = std::filesystem;
    const auto dir = fs::temp_directory_path() / "flowrun_cli_graph_order" / "graphs";
    fs::remove_all(dir.parent_path());
    fs::create_directories(dir);
    for (const char* g : {"dpo.graph", "sft.graph"}) fs::copy_file(src + g, dir / g);
    out = run(bin + (dir / "dpo.graph").string() + quiet, &rc);
    CHECK(rc == 2);
    CHECK(has(out, "hint: sft.graph beside it writes this file: run `flowrun " + (dir / "sft.graph").string() + "` first"));
    fs::remove_all(dir.parent_path());
  }
  // a batch larger than the share: planned at the rows a batch holds (100,000 on 14 pairs was refused for 848 GB)
  {
    namespace fs = std::filesystem;
    const auto small = fs::temp_directory_path() / "flowrun_cli_small_pairs.jsonl";
    std::ifstream in(flowrun::asset_path("data/hh-rlhf/harmless-base-test.dschat.jsonl"));
    std::ofstream o(small);
    std::string line;
    for (int i = 0; i < 40 && std::getline(in, line); ++i) o << line << "\n";
    o.close();
    out = run(bin + src + "dpo.graph --set node.dpo.model=model/stories260K/stories260K.bin --set node.dpo.output= "
                          "--set node.dpo.steps=1 --set node.dpo.per_device_train_batch_size=100000 --set node.dpo.data=" +
                  small.string() + quiet,
              &rc);
    CHECK(rc == 0);
    CHECK_FALSE(has(out, "the plan needs about"));
    CHECK(has(out, "per_device_train_batch_size = 100000 but this step's share has 14 training rows: every batch holds "
                   "all of them"));
    fs::remove(small);
  }
  // a warmup longer than the run: said, as step 3 says it (the run never reached its peak rate)
  out = run(bin + src + "sft.graph --set node.sft.output= --set node.sft.steps=2 --set node.sft.num_warmup_steps=10" + quiet,
            &rc);
  CHECK(rc == 0);
  CHECK(has(out, "num_warmup_steps = 10 and the run has 2 updates: every update is in warmup, the last at 1.00e-04, "
                 "10% of learning_rate"));
}

TEST_CASE("usage errors exit with code 2 and say what is wrong, --help exits 0") {
  int rc = -1;
  auto out = run(std::string(FLOWRUN_BIN) + " generate --no-such-option 2>&1", &rc);
  CHECK(rc == 2);
  CHECK(out.find("--no-such-option") != std::string::npos);
  out = run(std::string(FLOWRUN_BIN) + " generate --temperature notanumber 2>&1", &rc);
  CHECK(rc == 2);
  out = run(std::string(FLOWRUN_BIN) + " generate --help 2>&1", &rc);
  CHECK(rc == 0);
  CHECK(out.find("--temperature") != std::string::npos);
  // a word that is no command (CLI11 said only "A subcommand is required")
  out = run(std::string(FLOWRUN_BIN) + " genrate 2>&1", &rc);
  CHECK(rc == 2);
  CHECK(out.find("flowrun: 'genrate' is not a command (did you mean 'generate'?); the commands are generate, ") !=
        std::string::npos);
}

TEST_CASE("flowrun train refuses a missing GPU and multi_node with what to change") {
  int rc = -1;
  auto out = run(std::string(FLOWRUN_BIN) + " train --step 1 --deployment-type multi_node 2>&1", &rc);
  CHECK(rc == 2);
  CHECK(out.find("use --deployment-type single_node") != std::string::npos);
  CHECK(out.find("flowrun run graphs/rlhf.graph --cluster CLUSTER.toml") != std::string::npos);  // what spreads it
}

TEST_CASE("a training plan that cannot fit in memory is refused with what to change") {
  int rc = -1;
  auto out = run(std::string(FLOWRUN_BIN) + " " + FLOWRUN_SOURCE_DIR +
                     "/graphs/sft.graph --no-progress --set node.sft.output= --set graph.checkpoint_dir= "
                     "--set node.sft.per_device_train_batch_size=100000000 --set node.sft.memory_limit_gb=0.05 2>&1",
                 &rc);
  // (the plan counts the rows a batch holds, all of the share's here: memory_limit_gb makes them too many)
  CHECK(rc == 1);
  CHECK(out.find("node 'sft'") != std::string::npos);
  CHECK(out.find("lower per_device_train_batch_size or max_seq_len") != std::string::npos);
}

TEST_CASE("flowrun launch refuses a rendezvous it cannot use, naming it") {
  int rc = -1;
  const std::string bin = FLOWRUN_BIN;
  auto out = run(bin + " launch --nproc 2 --rendezvous caf --store /tmp/x no_such.graph 2>&1", &rc);
  CHECK(rc == 1);
  CHECK(out.find("--store is a folder for --rendezvous file") != std::string::npos);
  // 203.0.113.1 (TEST-NET-3) is no address of this host: the CAF store cannot be published there
  out = run(bin + " launch --nproc 2 --rendezvous-host 203.0.113.1 no_such.graph 2>&1", &rc);
  CHECK(rc == 1);
  CHECK(out.find("cannot publish the store on 203.0.113.1:0") != std::string::npos);
  out = run(bin + " launch --nproc 2 --rendezvous tcp no_such.graph 2>&1", &rc);
  CHECK(rc != 0);
  CHECK(out.find("--rendezvous") != std::string::npos);
}

// ------------------------------------------------------------ settings checked by the registry (issue 17)

namespace {


// The folders temp_folder() made, removed when the test process ends (each ran 15 a suite run,
// and /tmp kept every one).
struct temp_folders {
  std::vector<std::filesystem::path> made;
  ~temp_folders() {
    for (const auto& p : made) {
      std::error_code ec;
      std::filesystem::remove_all(p, ec);
    }
  }
};

// A fresh folder for this test run's files, removed when the test process ends.
std::filesystem::path temp_folder() {
  static temp_folders folders;
  std::string tmpl = (std::filesystem::temp_directory_path() / "flowrun_cli_XXXXXX").string();
  REQUIRE(mkdtemp(tmpl.data()) != nullptr);
  folders.made.emplace_back(tmpl);
  return tmpl;
}

// A graph file that includes one of the repository's graphs and sets one value of one node.
std::string graph_setting(const std::filesystem::path& dir, const std::string& base, const std::string& node,
                          const std::string& line) {
  const auto path = dir / (node + "_" + base);
  std::ofstream(path) << "include = [\"" << FLOWRUN_SOURCE_DIR << "/graphs/" << base << "\"]\n[node." << node << "]\n"
                      << line << "\n";
  return path.string();
}

}  // namespace

TEST_CASE("step 2 on a pairs file whose first line lacks rejected names that line") {
  // the first line decides a file's layout: its missing "rejected" made 3 pairs prompt/chosen rows, and the refusal
  // named no line (a break-it review, 2026-12-07)
  const auto dir = temp_folder();
  std::ofstream(dir / "pairs.jsonl") << R"({"prompt": "\n\nHuman: a?\n\nAssistant:", "chosen": " b"})" << "\n"
                                     << R"({"prompt": "\n\nHuman: c?\n\nAssistant:", "chosen": " d", "rejected": " e"})"
                                     << "\n"
                                     << R"({"prompt": "\n\nHuman: f?\n\nAssistant:", "chosen": " g", "rejected": " h"})"
                                     << "\n";
  int rc = -1;
  const auto out = run(std::string(FLOWRUN_BIN) + " run " + FLOWRUN_SOURCE_DIR +
                           "/graphs/rm.graph --no-progress --set graph.checkpoint_dir= --set node.rm.output=" +
                           (dir / "rm").string() + " --set node.rm.data=" + (dir / "pairs.jsonl").string() + " 2>&1",
                       &rc);
  CHECK(rc != 0);
  CHECK(has(out, "holds prompt/chosen rows (a file's layout is that of its first JSON line); 2 of its lines hold "
                 "prompt/chosen/rejected rows, but line 1, the first, decides the layout: give it the keys of the "
                 "others"));
  // step 1 alike, where the first line holds a prompt alone
  std::ofstream(dir / "prompts_first.jsonl") << R"({"prompt": "\n\nHuman: a?\n\nAssistant:"})" << "\n"
                                             << R"({"prompt": "\n\nHuman: c?\n\nAssistant:", "chosen": " d"})" << "\n";
  const auto sft = run(std::string(FLOWRUN_BIN) + " run " + FLOWRUN_SOURCE_DIR +
                           "/graphs/sft.graph --no-progress --set graph.checkpoint_dir= --set node.sft.output=" +
                           (dir / "s.bin").string() + " --set node.sft.data=" + (dir / "prompts_first.jsonl").string() +
                           " 2>&1",
                       &rc);
  CHECK(rc != 0);
  CHECK(has(sft, "(a file's layout is that of its first JSON line); 1 of its lines hold prompt/chosen rows, but line 1, "
                 "the first, decides the layout"));
  // a file that is one JSON list (json.dump(rows)) is read as rows: the refusal names items
  std::ofstream(dir / "pairs.json") << "[\n  " << R"({"prompt": "\n\nHuman: a?\n\nAssistant:", "chosen": " b"})" << ",\n  "
                                    << R"({"prompt": "\n\nHuman: c?\n\nAssistant:", "chosen": " d", "rejected": " e"})"
                                    << ",\n  "
                                    << R"({"prompt": "\n\nHuman: f?\n\nAssistant:", "chosen": " g", "rejected": " h"})"
                                    << "\n]\n";
  const auto list = run(std::string(FLOWRUN_BIN) + " run " + FLOWRUN_SOURCE_DIR +
                            "/graphs/rm.graph --no-progress --set graph.checkpoint_dir= --set node.rm.output=" +
                            (dir / "rm").string() + " --set node.rm.data=" + (dir / "pairs.json").string() + " 2>&1",
                        &rc);
  CHECK(rc != 0);
  CHECK(has(list, "holds prompt/chosen rows (a file's layout is that of its first JSON item); 2 of its items hold "
                  "prompt/chosen/rejected rows, but item 1, the first, decides the layout: give it the keys of the "
                  "others"));
}

TEST_CASE("an HF Trainer DeepSpeed JSON: its \"auto\" values come from the trainer node's settings, as HF Trainer's") {
  // they were refused one key per try, the fix naming auto_values, which no graph setting reaches
  const std::string sft = std::string(FLOWRUN_BIN) + " run " + FLOWRUN_SOURCE_DIR +
                          "/graphs/sft.graph --no-progress --set node.sft.steps=2 --set node.sft.print_every=1 "
                          "--set node.sft.per_device_train_batch_size=4 --set node.sft.gradient_accumulation_steps=2 "
                          "--set node.sft.learning_rate=0.002 --set node.sft.output=" +
                          (std::filesystem::temp_directory_path() / "flowrun_cli_auto.bin").string() +
                          " --set node.sft.deepspeed_config=" + FLOWRUN_SOURCE_DIR + "/tests/fixtures/ds/hf_trainer_auto.json";
  int rc = -1;
  auto out = run(sft + " 2>&1", &rc);
  CHECK(rc == 0);
  CHECK(has(out, "\"auto\" filled from the node's settings (as HF Trainer fills it): fp16.enabled=false, bf16.enabled=false, "
                 "optimizer.params.lr=0.002, optimizer.params.betas=[0.9, 0.95]"));
  CHECK(has(out, "scheduler.params.total_num_steps=2, gradient_clipping=1.0, train_batch_size=8, "
                 "train_micro_batch_size_per_gpu=4, gradient_accumulation_steps=2"));
  CHECK(has(out, "[step 1 sft] step 2/2 loss"));
  CHECK_FALSE(has(out, "and the JSON wins"));  // "auto" took the node's own values: nothing was replaced
  // a JSON whose values replace written settings says so, one line each (a zero_stage = 1 ran at the JSON's
  // stage 3 without a word: a break-it review, 2026-12-07); the kind's defaults it replaces are not named
  out = run(std::string(FLOWRUN_BIN) + " run " + FLOWRUN_SOURCE_DIR +
                "/graphs/sft.graph --no-progress --set node.sft.steps=1 --set node.sft.zero_stage=1 --set "
                "node.sft.output=" + (std::filesystem::temp_directory_path() / "flowrun_cli_auto.bin").string() +
                " --set node.sft.deepspeed_config=" + FLOWRUN_SOURCE_DIR + "/configs/ds_zero3.json 2>&1",
            &rc);
  CHECK(rc == 0);
  const std::string json = std::string(FLOWRUN_SOURCE_DIR) + "/configs/ds_zero3.json";
  CHECK(has(out, "node 'sft': zero_stage = 1, but " + json + " makes it 3 (its zero_optimization.stage), and the JSON "
                 "wins: set one of the two"));
  CHECK(has(out, "node 'sft': per_device_train_batch_size = 8, but " + json + " makes it 2 (its "
                 "train_micro_batch_size_per_gpu)"));  // sft.graph writes 8
  CHECK(has(out, "rank 0/1 stage 3"));
  CHECK_FALSE(has(out, "gradient_clipping = "));  // the kind's default, replaced by the JSON's equal 1.0
  CHECK_FALSE(has(out, "weight_decay = "));       // the default 0 the JSON's 0.1 replaces: not written
  std::filesystem::remove(std::filesystem::temp_directory_path() / "flowrun_cli_auto.bin");
}

TEST_CASE("sft_trainer warns when its DeepSpeed JSON's decaying scheduler ends before its last update") {
  // a WarmupDecayLR over 4 steps left 14 of 20 updates at lr 0 without a word (zero_rank said so)
  const auto dir = temp_folder();
  std::ofstream(dir / "short.json")
      << R"({"train_micro_batch_size_per_gpu": 8, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}, )"
      << R"("scheduler": {"type": "WarmupDecayLR", "params": {"warmup_max_lr": 1e-3, "warmup_num_steps": 2, "total_num_steps": 4}}})";
  auto sft = [&](int steps) {
    return std::string(FLOWRUN_BIN) + " run " + FLOWRUN_SOURCE_DIR + "/graphs/sft.graph --no-progress --set node.sft.steps=" +
           std::to_string(steps) + " --set node.sft.output=" + (dir / "out.bin").string() +
           " --set node.sft.deepspeed_config=" + (dir / "short.json").string() + " 2>&1";
  };
  int rc = -1;
  auto out = run(sft(6), &rc);
  CHECK(rc == 0);
  CHECK(has(out, "6 updates but the DeepSpeed config's WarmupDecayLR is over at total_num_steps = 4: the steps past it "
                 "train at the schedule's end (learning rate 0 at step 6), as in DeepSpeed; set "
                 "scheduler.params.total_num_steps to 6 in " + (dir / "short.json").string()));
  out = run(sft(4), &rc);
  CHECK(rc == 0);
  CHECK_FALSE(has(out, "is over at total_num_steps"));
}

TEST_CASE("step 3 takes a DeepSpeed JSON's scheduler, its auto total_num_steps the run's updates") {
  // "auto" was filled with total_num_steps 1 (step 3 then ignored the scheduler): with the schedule taken,
  // the policy's rate fell to 0 after its second update
  const auto dir = temp_folder();
  std::ofstream(dir / "auto.json")
      << R"({"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto", )"
      << R"("scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto", )"
      << R"("warmup_num_steps": "auto", "total_num_steps": "auto"}}})";
  int rc = -1;
  const std::string out = run(std::string(FLOWRUN_BIN) + " run " + FLOWRUN_SOURCE_DIR + "/graphs/rlhf.graph --no-progress " +
                                  "--set graph.checkpoint_dir= --set node.sft.steps=2 --set node.rm.steps=2 " +
                                  "--set node.prompts.iterations=6 --set node.prompts.eval_prompts=0 " +
                                  "--set node.sft.output=" + (dir / "sft.bin").string() +
                                  " --set node.rm.output=" + (dir / "rm").string() +
                                  " --set node.policy.output=" + (dir / "ppo.bin").string() +
                                  " --set node.policy.num_warmup_steps=2 --set node.policy.deepspeed_config=" +
                                  (dir / "auto.json").string() + " 2>&1",
                              &rc);
  REQUIRE(rc == 0);
  CHECK(has(out, "[step 3 ppo] policy: learning rate WarmupDecayLR of " + (dir / "auto.json").string() +
                     " (total_num_steps \"auto\": the run's updates) over this run's 6 updates (6 iterations x 1 "
                     "ppo_epochs x 1 mini-batches of 8 rows)"));
  // the printed rates, one update per iteration: DeepSpeed's WarmupDecayLR over 6 updates, warmup 2 (the
  // policy's num_warmup_steps, for its "auto"), from warmup_min_lr 0 to warmup_max_lr 1e-4 (actor_learning_rate),
  // worked by hand from deepspeed/runtime/lr_schedules.py: update k runs at get_lr() with
  // last_batch_iteration k - 1 (0 below 0); warmup (log): log(k) / log(2) for k - 1 < 2; then decay
  // (6 - (k - 1)) / (6 - 2)
  const std::vector<double> want = {0, 0, 1e-4, 1e-4, 0.75e-4, 0.5e-4};
  std::vector<double> got;
  static const std::regex line(R"(\[step 3 ppo\] iter \d+ .* lr (\S+) )");
  for (std::sregex_iterator it(out.begin(), out.end(), line), end; it != end; ++it) got.push_back(std::stod((*it)[1]));
  REQUIRE(got.size() == 6);
  for (size_t k = 0; k < 6; ++k) {
    CAPTURE(k);
    CHECK(got[k] == doctest::Approx(want[k]).epsilon(0.005));
  }
  CHECK(got[5] > 0);  // the end of the decay, not past it
  // the policy's written num_warmup_steps filled the JSON's "auto": no warning that the JSON replaced it
  CHECK_FALSE(has(out, "replaces num_warmup_steps"));
  // a JSON whose batch triple contradicts the update's rows: refused when checked (its accumulation was
  // taken, its batch not: 3-row updates cut into 4 micro-batches, one empty)
  const std::string bad = run(std::string(FLOWRUN_BIN) + " run " + FLOWRUN_SOURCE_DIR + "/graphs/rlhf.graph --no-progress " +
                                  "--set node.policy.deepspeed_config=" + FLOWRUN_SOURCE_DIR + "/configs/ds_zero3.json " +
                                  "--set node.policy.per_device_training_batch_size=3 2>&1",
                              &rc);
  CHECK(rc == 2);
  CHECK(has(bad, "ds_zero3.json resolves train_batch_size to 8 (train_micro_batch_size_per_gpu 2 x "
                 "gradient_accumulation_steps 4 x 1 rank(s)), but per_device_training_batch_size = 3"));
}

TEST_CASE("a warmup with the constant schedule is named: transformers' constant schedule takes none") {
  const std::string bin = std::string(FLOWRUN_BIN) + " run " + FLOWRUN_SOURCE_DIR + "/graphs/";
  int rc = -1;
  // transformers' constant schedule takes no warmup: said when the graph is checked (the bad dtype stops
  // the run there)
  for (const std::string node : {"sft", "policy"}) {
    CAPTURE(node);
    auto out = run(bin + (node == "sft" ? "sft.graph" : "rlhf.graph") + " --no-progress --set node." + node +
                       ".lr_scheduler_type=constant --set node." + node + ".num_warmup_steps=3 --set node." + node +
                       ".dtype=fp8 2>&1",
                   &rc);
    CHECK(rc == 2);
    CHECK(has(out, "node '" + node + "': num_warmup_steps = 3 does nothing with lr_scheduler_type = \"constant\""));
  }
}

TEST_CASE("a trainer's or a reward's settings that failed in start, or did nothing, are named when the graph is checked") {
  // DPO failed in its start, after tokenizing the data, on these (exit 1); the idle ones passed in silence
  const std::string bin = std::string(FLOWRUN_BIN) + " run " + FLOWRUN_SOURCE_DIR + "/graphs/";
  int rc = -1;
  struct refused {
    const char* set;
    const char* error;
  };
  for (const refused& c : std::initializer_list<refused>{
           {"dpo.graph --set node.dpo.truncation=start" DPO_MODEL, "error: truncation = \"start\" is not a way to cut a long example"},
           {"dpo.graph --set node.dpo.apply_chat_template=true" DPO_MODEL, "is not a folder: set tokenizer to the model folder"},
           {"dpo.graph --set node.dpo.only_optimize_lora=true" DPO_MODEL,
            "error: only_optimize_lora = true trains only the LoRA weights, and lora_dim = 0 adds none: nothing would train"},
           {"rlhf.graph --set node.critic.only_optimize_lora=true", "and critic_lora_dim = 0 adds none"}}) {
    CAPTURE(c.set);
    const auto out = run(bin + c.set + " --no-progress 2>&1", &rc);
    CHECK(rc == 2);
    CHECK(has(out, c.error));
  }
  // said, not refused (the bad dtype stops these runs when the graph is checked)
  auto out = run(bin + "sft.graph --no-progress --set node.sft.only_optimize_lora=true --set node.sft.lora_dim=8 "
                       "--set node.sft.learning_rate=0.5 --set node.sft.dtype=fp8 2>&1",
                 &rc);
  CHECK(has(out, "node 'sft': learning_rate = 0.5 is the frozen base's rate with only_optimize_lora = true"));
  out = run(bin + "grpo.graph --no-progress" GRPO_DATA " --set node.reward.reward=format --set node.reward.format_score=0.5 "
                  "--set node.reward.on_error=zero --set node.policy.dtype=fp8 2>&1",
            &rc);
  CHECK(rc == 2);
  CHECK(has(out, "node 'reward': format_score = 0.5 changes nothing with reward = \"format\""));
  CHECK(has(out, "node 'reward': on_error = \"zero\" changes nothing with reward = \"format\""));
}

TEST_CASE("DS-Chat's, TRL's, OpenRLHF's and veRL's own flag names: the hint says what they are here") {
  // they were answered with the list of valid settings only (policy.learning_rate: "a setting of [node.sft]")
  const std::string bin = std::string(FLOWRUN_BIN) + " run " + FLOWRUN_SOURCE_DIR + "/graphs/";
  int rc = -1;
  struct named {
    const char* set;   // GRAPH --set node.NAME.KEY=VALUE
    const char* hint;  // what the refusal's hint says
  };
  for (const named& n : std::initializer_list<named>{
           {"sft.graph --set node.sft.num_train_epochs=1", "DS-Chat's --num_train_epochs is steps here: optimizer updates"},
           {"rm.graph --set node.rm.model_name_or_path=x", "DS-Chat's --model_name_or_path is model here"},
           {"rlhf.graph --set node.prompts.num_train_epochs=1",
            "DS-Chat's step-3 --num_train_epochs (passes over the prompts) is iterations here"},
           {"rlhf.graph --set node.policy.unsupervised_dataset_name=x",
            "DS-Chat's --unsupervised_dataset_name is unsup_data here"},
           {"rlhf.graph --set node.critic.lora_dim=4", "step 3's LoRA rank is critic_lora_dim here"},
           {"rlhf.graph --set node.experience.gamma=NaN", "write gamma = 1.0 (`flowrun explain experience_maker`)"},
           {"dpo.graph --set node.dpo.max_prompt_length=64",
            "TRL's max_prompt_length has no separate setting here: max_seq_len bounds prompt + answer"},
           {"dpo.graph --set node.dpo.max_length=64", "TRL's max_length is max_seq_len here"},
           {"rlhf.graph --set node.ppo_controller.async_train=true", "OpenRLHF's --async_train is max_staleness >= 1 here"},
           {"rlhf.graph --set node.generator.n_samples_per_prompt=4", "OpenRLHF's --n_samples_per_prompt is num_generations here"},
           {"rlhf.graph --set node.policy.ppo_mini_batch_size=4",
            "veRL's ppo_mini_batch_size counts prompts (its workers multiply it by rollout.n): "
            "per_device_training_batch_size here counts rows, ppo_mini_batch_size x num_generations"},
           {"rlhf.graph --set node.policy.learning_rate=1e-5", "the policy's rate is actor_learning_rate here"},
           {"rlhf.graph --set node.critic.learning_rate=1e-5", "the critic's rate is critic_learning_rate here"},
           {"rlhf.graph --set node.policy.num_ppo_epochs=2", "TRL's num_ppo_epochs is ppo_epochs here"},
           {"sft.graph --set node.sft.warmup_ratio=0.1",
            "HF Trainer's and TRL's warmup_ratio (a share of the run) is num_warmup_steps here"},
           {"dpo.graph --set node.dpo.lr_scheduler=cosine", "the schedule is lr_scheduler_type here"},
           // DS-Chat's script flags with no setting here: why, from what the models and engine do
           {"sft.graph --set node.sft.dropout=0.0", "DS-Chat's --dropout: flowrun's models have no dropout layers"},
           {"rlhf.graph --set node.policy.actor_dropout=0.0", "DS-Chat's --actor_dropout: flowrun's models have no dropout"},
           {"rlhf.graph --set node.critic.critic_dropout=0.0", "DS-Chat's --critic_dropout: flowrun's models have no dropout"},
           {"rm.graph --set node.rm.num_padding_at_beginning=1", "DS-Chat's --num_padding_at_beginning (1 for OPT)"},
           {"rlhf.graph --set node.reward.num_padding_at_beginning=1", "DS-Chat's --num_padding_at_beginning (1 for OPT)"},
           {"rlhf.graph --set node.critic.num_padding_at_beginning=1", "DS-Chat's --num_padding_at_beginning (1 for OPT)"},
           {"rlhf.graph --set node.generator.enable_hybrid_engine=true", "DS-Chat's hybrid engine (its faster generation"},
           {"rlhf.graph --set node.policy.inference_tp_size=2", "DS-Chat's hybrid engine (its faster generation"},
           {"rlhf.graph --set node.ppo_controller.test_stop_step=3", "DS-Chat's --enable_test_mode --test_stop_step N is the prompt loader's iterations"},
           {"rlhf.graph --set node.reference.offload_reference_model=true", "DS-Chat's --offload_reference_model"},
           {"sft.graph --set node.sft.end_of_conversation_token=x", "DS-Chat's end-of-conversation token is the tokenizer's EOS"},
           {"rlhf.graph --set node.policy.compute_fp32_loss=true", "the losses are computed in fp32 here in every dtype"},
           {"rm.graph --set node.rm.offload=true", "DS-Chat's --offload (ZeRO's states in CPU memory) has no setting here"},
           {"sft.graph --set node.sft.lora_alpha=16", "DS-Chat's LoRA scales by 1 / lora_dim"},
           {"sft.graph --set node.sft.lora_dropout=0.1", "DS-Chat's LoRA has no dropout"},
           {"rlhf.graph --set node.reward.offload_reward_model=true", "DS-Chat's --offload_reward_model has no setting"},
           {"rlhf.graph --set node.prompts.test_stop_step=2", "DS-Chat's --enable_test_mode --test_stop_step N is "
                                                              "iterations = N here"},
           {"rlhf.graph --set node.generator.release_inference_cache=true", "DS-Chat's hybrid-engine memory options"},
           {"rlhf.graph --set node.policy.disable_actor_dropout=true", "flowrun's models have no dropout layers"},
           // a break-it review's (2026-12-07): TRL's loss_type was hinted as kl_loss_type, the others got the list
           {"grpo.graph --set node.policy.loss_type=dr_grpo", "TRL's loss_type is loss_agg_mode here: grpo is "
                                                              "seq-mean-token-mean, dapo token-mean (over the whole "
                                                              "mini-batch; bnpo's is per micro-batch"},
           {"grpo.graph --set node.prompts.max_prompt_length=64", "TRL's and veRL's max_prompt_length is "
                                                                   "max_prompt_seq_len here"},
           {"grpo.graph --set node.policy.num_iterations=2", "TRL's num_iterations (the updates on each generated batch, GRPO's mu) is ppo_epochs here"},
           {"rlhf.graph --set node.critic.max_grad_norm=1", "HF Trainer's and TRL's max_grad_norm is gradient_clipping here"},
           {"grpo.graph --set node.policy.kl_estimator=k3", "OpenRLHF's --kl_estimator is kl_loss_type here"},
           {"rlhf.graph --set node.experience.init_kl_coef=0.1", "OpenRLHF's --init_kl_coef is kl_ctl here, the KL in "
                                                                 "the reward (a fixed coefficient); with its "
                                                                 "--use_kl_loss it weighs the KL loss"},
           {"grpo.graph --set node.prompts.train_batch_size=8", "veRL's data.train_batch_size (prompts per step) is per_device_generation_batch_size here"},
           {"grpo.graph --set node.generator.max_new_tokens=8", "transformers' max_new_tokens is max_answer_seq_len"},
           {"grpo.graph --set node.reward.reward_funcs=x", "TRL's reward_funcs is reward here"},
           {"grpo.graph --set node.policy.entropy_coeff=0.001", "veRL's entropy_coeff (an entropy bonus in the actor loss) has no setting here"},
           {"rlhf.graph --set node.policy.zero_stage=2", "DS-Chat's --actor_zero_stage is actor_zero_stage here"},
           {"rlhf.graph --set node.critic.zero_stage=2", "DS-Chat's --critic_zero_stage is critic_zero_stage here"},
           {"rlhf.graph --set node.policy.align_overflow=true", "DS-Chat's --align_overflow"},
           {"rm.graph --set node.rm.eval_interval=10", "DS-Chat's --eval_interval has no setting here"}}) {
    INFO(n.set);
    const auto out = run(bin + n.set + " --no-progress 2>&1", &rc);
    CHECK(rc == 2);
    CHECK(has(out, std::string("hint: ") + n.hint));
  }
  // DS-Chat's scheduler names: one it does not know is refused when the graph is checked, at the
  // setting (steps 1-2 and DPO failed in the node's start, after the steps before had trained)
  for (const char* set : {"rlhf.graph --no-progress --set node.critic.lr_scheduler_type=cosin",
                          "sft.graph --no-progress --set node.sft.lr_scheduler_type=cosin",
                          "dpo.graph --no-progress --set node.dpo.lr_scheduler_type=cosin" DPO_MODEL}) {
    CAPTURE(set);
    const auto out = run(bin + set + " 2>&1", &rc);
    CHECK(rc == 2);
    CHECK(has(out, "lr_scheduler_type=cosin:1:"));
    CHECK(has(out, "error: lr_scheduler_type \"cosin\" is not supported; use cosine, linear, constant or constant_with_warmup"));
  }
}

TEST_CASE("format_score of 1 or more is refused: a well-formed wrong answer would score as a right one, or above") {
  // format_score = 2 (a typo for 0.2) trained toward wrong answers and printed a held-out "gain"
  const std::string grpo = std::string(FLOWRUN_BIN) + " run " + FLOWRUN_SOURCE_DIR + "/graphs/grpo.graph --no-progress";
  int rc = -1;
  auto out = run(grpo + " --set node.reward.format_score=2 2>&1", &rc);
  CHECK(rc == 2);
  CHECK(has(out, "--set node.reward.format_score=2:1:26: error: setting 'format_score' of node 'reward' (kind "
                 "reward_function) must be finite, < 1, got 2.0"));
  CHECK(has(out, "training learns the format only: reward = \"format\" says so"));
  out = run(grpo + " --set node.reward.format_score=1 2>&1", &rc);
  CHECK(has(out, "must be finite, < 1, got 1.0"));
  // 0.1 is taken; greedy sampling is refused beside it, so that the check runs and nothing trains (the job ran
  // whole where out/grpo/addition.jsonl existed, into the source's out/grpo)
  out = run(grpo + GRPO_DATA " --set node.reward.format_score=0.1 --set node.generator.temperature=0 2>&1", &rc);
  CHECK(rc == 2);
  CHECK(has(out, "temperature = 0"));
  CHECK_FALSE(has(out, "format_score' of node"));
}

// The tensors of a .safetensors file, each name -> its dtype, shape and bytes.
static std::map<std::string, std::string> safetensors_bytes(const std::filesystem::path& file) {
  std::ifstream f(file, std::ios::binary);
  const std::string b((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  REQUIRE(b.size() >= 8);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(b[static_cast<size_t>(i)]);
  const auto header = nlohmann::json::parse(b.substr(8, n));
  std::map<std::string, std::string> out;
  for (const auto& [name, e] : header.items()) {
    if (name == "__metadata__") continue;
    const auto at = e.at("data_offsets");
    out[name] = e.at("dtype").dump() + e.at("shape").dump() +
                b.substr(8 + n + at[0].get<size_t>(), at[1].get<size_t>() - at[0].get<size_t>());
  }
  return out;
}

TEST_CASE("convert keeps a TRL reward model (ForSequenceClassification) one, and refuses it as a llama2.c file") {
  // it wrote a CausalLM with v_head.weight: transformers' AutoModelForSequenceClassification found no score.weight
  // and initialised it at random; as a llama2.c file the embedding became an LM head and generate told stories
  namespace fs = std::filesystem;
  const fs::path dir = temp_folder() / "seqcls_convert";
  fs::remove_all(dir);
  for (const char* family : {"llama", "qwen2", "gpt2"}) {
    CAPTURE(family);
    const fs::path src = fs::path(FLOWRUN_SOURCE_DIR) / "tests/fixtures/hf" / (std::string("seqcls_") + family);
    const fs::path out = dir / family;
    int rc = -1;
    auto log = run(std::string(FLOWRUN_BIN) + " convert --from hf " + src.string() + " --to hf " + out.string() + " 2>&1", &rc);
    INFO(log);
    REQUIRE(rc == 0);
    const auto read = [](const fs::path& p) { return nlohmann::json::parse(std::ifstream(p)); };
    const auto a = read(src / "config.json"), b = read(out / "config.json");
    CHECK(b.at("architectures") == a.at("architectures"));
    CHECK(b.value("tie_word_embeddings", true) == a.value("tie_word_embeddings", std::string(family) == "gpt2"));
    if (a.contains("id2label")) CHECK(b.at("id2label") == a.at("id2label"));
    // every tensor, by name, dtype, shape and bytes: score.weight among them, no v_head.weight or lm_head.weight
    const auto ta = safetensors_bytes(src / "model.safetensors"), tb = safetensors_bytes(out / "model.safetensors");
    CHECK(tb.count("score.weight") == 1);
    CHECK(ta == tb);
    log = run(std::string(FLOWRUN_BIN) + " convert --from hf " + src.string() + " --to llama2c " +
                  (dir / (std::string(family) + ".bin")).string() + " 2>&1",
              &rc);
    CHECK(rc != 0);
    if (std::string(family) == "llama")
      CHECK(has(log, "is a reward or value model (a value head, no LM head): a llama2.c file holds a language model"));
    CHECK_FALSE(fs::exists(dir / (std::string(family) + ".bin")));
  }
}

TEST_CASE("max_answer_seq_len 1 is refused for one answer per prompt and taken for a group") {
  // DS-Chat drops training answers of at most one token, so PPO at 1 would train on nothing; a GRPO group keeps
  // them (grpo_small runs it: the held-out passes score every prompt)
  int rc = -1;
  auto out = run(std::string(FLOWRUN_BIN) + " run " + FLOWRUN_SOURCE_DIR +
                     "/graphs/rlhf.graph --no-progress --set node.generator.max_answer_seq_len=1 2>&1",
                 &rc);
  CHECK(rc == 2);
  CHECK(has(out, "node 'generator': max_answer_seq_len = 1 with num_generations = 1: DS-Chat drops answers of at most "
                 "one token, so 1 would train on nothing"));
  // GRPO: the check passes it (greedy sampling refused beside it, so nothing trains)
  out = run(std::string(FLOWRUN_BIN) + " run " + FLOWRUN_SOURCE_DIR + "/graphs/grpo.graph --no-progress" GRPO_DATA
                " --set node.generator.max_answer_seq_len=1 --set node.generator.temperature=0 2>&1",
            &rc);
  CHECK(rc == 2);
  CHECK(has(out, "temperature = 0"));
  CHECK_FALSE(has(out, "max_answer_seq_len"));
}

TEST_CASE("flowrun generate says that a padded vocabulary's rows past the tokenizer are never generated") {
  // OPT's 304 output rows over a 301-token tokenizer (tests/fixtures/hf/opt): transformers may pick rows 301-303
  int rc = -1;
  const std::string gen = std::string(FLOWRUN_BIN) + " generate --prompt Hello --max_new_tokens 2 --model ";
  CHECK(has(run(gen + FLOWRUN_SOURCE_DIR + "/tests/fixtures/hf/opt 2>&1", &rc),
            "the model's 3 output rows past the tokenizer's 301 tokens are never generated"));
  CHECK(rc == 0);
  CHECK_FALSE(has(run(gen + FLOWRUN_SOURCE_DIR + "/tests/fixtures/hf_chat/qwen2 2>&1", &rc), "never generated"));
}

TEST_CASE("flowrun generate takes a model folder's generation_config.json sampling defaults, the command line's winning") {
  // it always sampled at its own defaults (temperature 1, top_p 0.9), where transformers' generate() reads the
  // folder's: a folder that says do_sample = false, or says nothing of it, decodes greedily there
  namespace fs = std::filesystem;
  const fs::path dir = temp_folder() / "gen_defaults";
  fs::remove_all(dir);
  fs::copy(std::string(FLOWRUN_SOURCE_DIR) + "/tests/fixtures/hf_chat/qwen2", dir, fs::copy_options::recursive);
  std::ofstream(dir / "generation_config.json") << R"({"do_sample": false, "top_k": 20})";
  const std::string gen = std::string(FLOWRUN_BIN) + " generate --model " + dir.string() + " --prompt Hello --max_new_tokens 12";
  int rc = -1;
  const auto a = run(gen + " --seed 1 2>&1", &rc);
  CHECK(rc == 0);
  CHECK(has(a, "sampling: do_sample false: greedy (" + (dir / "generation_config.json").string() +
                   "; the command line's options win)"));
  const auto text = [](const std::string& out) { return out.substr(out.rfind("]") + 1); };  // after the last log line
  CHECK(text(run(gen + " --seed 2 2>&1", &rc)) == text(a));  // greedy: the seed changes nothing
  // --temperature given: sampled, the folder's top_k still taken
  const auto b = run(gen + " --seed 1 --temperature 1 2>&1", &rc);
  CHECK(rc == 0);
  CHECK(has(b, "sampling: top_k 20, sampling (a sampling option given): temperature 1, top_k 20, top_p 1 ("));
  CHECK_FALSE(has(b, "greedy"));
  // an HF folder without do_sample decodes greedily, as transformers' generate() does (a folder with no
  // generation_config.json, or one of stop ids only, as a conversion from llama2.c writes, sampled here)
  fs::remove(dir / "generation_config.json");
  const auto c = run(gen + " --seed 1 2>&1", &rc);
  CHECK(rc == 0);
  CHECK(has(c, "sampling: no do_sample: greedy, as transformers' generate() decodes this folder (" + dir.string() +
                   " has no generation_config.json;"));
  CHECK(text(run(gen + " --seed 2 2>&1", &rc)) == text(c));
  CHECK(text(c) == text(a));
  // do_sample true: transformers' defaults for what the file leaves out (top_k 50, top_p 1, temperature 1)
  std::ofstream(dir / "generation_config.json") << R"({"do_sample": true})";
  CHECK(has(run(gen + " --seed 1 2>&1", &rc), "sampling: do_sample true: temperature 1, top_k 50, top_p 1 ("));
  // the file's values get the options' checks, naming the file (repetition_penalty 0 printed bytes of garbage)
  std::ofstream(dir / "generation_config.json") << R"({"repetition_penalty": 0})";
  auto bad = run(gen + " 2>&1", &rc);
  CHECK(rc != 0);
  CHECK(has(bad, (dir / "generation_config.json").string() + ": repetition_penalty = 0: must be finite and > 0"));
  std::ofstream(dir / "generation_config.json") << R"({"do_sample": true, "top_p": 7})";
  bad = run(gen + " 2>&1", &rc);
  CHECK(rc != 0);
  CHECK(has(bad, (dir / "generation_config.json").string() + ": top_p = 7: must be finite, in (0, 1]"));
  std::ofstream(dir / "generation_config.json") << R"({"do_sample": "true"})";  // Python reads a string as true
  CHECK(has(run(gen + " 2>&1", &rc), ": do_sample = \"true\" is not true or false"));
  std::ofstream(dir / "generation_config.json") << R"({"do_sample": true, "temperature": 0})";  // transformers refuses it
  CHECK(has(run(gen + " 2>&1", &rc), ": do_sample true with temperature 0: transformers refuses it"));
  // what transformers would apply and generate does not is said (min_new_tokens 10 stopped here after 3 tokens),
  // the keys at transformers' defaults not
  std::ofstream(dir / "generation_config.json")
      << R"({"min_new_tokens": 10, "no_repeat_ngram_size": 2, "suppress_tokens": [5], "min_length": 0, "typical_p": 1.0,
             "early_stopping": true, "bad_words_ids": null})";
  const auto skipped = run(gen + " 2>&1", &rc);
  CHECK(rc == 0);
  CHECK_FALSE(has(skipped, "are not applied here"));
  CHECK(has(skipped, "sampling: min_new_tokens 10, no_repeat_ngram_size 2, suppress_tokens [5], no do_sample: greedy"));
  CHECK(has(run(gen + " --num_beams 2 2>&1", &rc), (dir / "generation_config.json").string() +
                                                     ": early_stopping true shape transformers' decoding and are not "
                                                     "applied here"));
  // typical_p acts only when transformers samples (greedy, it says the key "may be ignored")
  std::ofstream(dir / "generation_config.json") << R"({"typical_p": 0.5, "bad_words_ids": [[7, 8]], "max_time": 3})";
  CHECK(has(run(gen + " 2>&1", &rc), ": bad_words_ids [[7,8]], max_time 3 shape transformers' decoding"));
  CHECK(has(run(gen + " --temperature 1 2>&1", &rc), ": bad_words_ids [[7,8]], max_time 3, typical_p 0.5 shape"));
  std::ofstream(dir / "generation_config.json") << R"({"suppress_tokens": [5, -1]})";
  CHECK(has(run(gen + " 2>&1", &rc), ": suppress_tokens = [5,-1] is not a list of token ids: fix or remove it"));
  CHECK(rc != 0);
  std::ofstream(dir / "generation_config.json") << R"({"min_new_tokens": 20})";  // past --max_new_tokens 12: said
  CHECK(has(run(gen + " 2>&1", &rc), "min_new_tokens 20 (generation_config.json) is above max_new_tokens 12"));
  std::ofstream(dir / "generation_config.json") << R"({"min_new_tokens": 2.5})";
  CHECK(has(run(gen + " 2>&1", &rc), ": min_new_tokens = 2.5 is not a whole number >= 0"));
  std::ofstream(dir / "generation_config.json") << R"({"do_sample": false, "min_length": 0, "typical_p": 1})";
  CHECK_FALSE(has(run(gen + " 2>&1", &rc), "are not applied here"));
  // a sampling option on a folder without do_sample: transformers' defaults for the others (top_p 1, not 0.9)
  fs::remove(dir / "generation_config.json");
  CHECK(has(run(gen + " --top_k 10 2>&1", &rc), "sampling: sampling (a sampling option given): temperature 1, top_k 10, top_p 1 ("));
  // ... beside the file's temperature 0 it decoded greedily while the log said it sampled
  std::ofstream(dir / "generation_config.json") << R"({"temperature": 0})";
  bad = run(gen + " --top_k 10 2>&1", &rc);
  CHECK(rc != 0);
  CHECK(has(bad, ": temperature 0 (greedy) with --top_p / --top_k given to sample: give --temperature too"));
  // the file's max_new_tokens, as transformers' generate() stops there (it generated to the context here); the
  // command line's --max_new_tokens wins; a value transformers refuses is refused naming the file
  std::ofstream(dir / "generation_config.json") << R"({"max_new_tokens": 2})";
  const std::string plain = std::string(FLOWRUN_BIN) + " generate --model " + dir.string() + " --prompt Hello";
  CHECK(has(run(plain + " 2>&1", &rc), "max_new_tokens 2 (" + dir.string() + "/generation_config.json; "
                                                                              "--max_new_tokens wins)"));
  CHECK(rc == 0);
  CHECK_FALSE(has(run(plain + " --max_new_tokens 3 2>&1", &rc), "max_new_tokens 2 ("));
  std::ofstream(dir / "generation_config.json") << R"({"max_new_tokens": 0})";
  CHECK(has(run(plain + " 2>&1", &rc), (dir / "generation_config.json").string() +
                                          ": max_new_tokens = 0 is not a whole number >= 1: fix or remove it"));
  CHECK(rc != 0);
  // without max_new_tokens, the file's max_length (prompt + new tokens), as transformers' generate() takes it (it
  // was not read): a prompt of n tokens gets max_length - n, each line of --test_path its own
  const std::string file = dir.string() + "/generation_config.json";
  const auto prompt_length = [&](const std::string& prompt) {  // the prompt's tokens, from the refusal at max_length 1
    std::ofstream(dir / "generation_config.json") << R"({"max_length": 1})";
    const auto out = run(plain.substr(0, plain.find(" --prompt")) + " --prompt '" + prompt + "' 2>&1", &rc);
    CHECK(rc != 0);
    const std::string head = "--prompt is ", tail = " tokens, which fill max_length = 1 (prompt + new tokens) of " +
                                                    file + ": give --max_new_tokens, or raise max_length there";
    REQUIRE_MESSAGE(has(out, tail), out);
    const auto at = out.find(head);
    REQUIRE(at != std::string::npos);
    return std::stoi(out.substr(at + head.size()));
  };
  const int short_n = prompt_length("Hello"), long_n = prompt_length("Hello there, how are you");
  REQUIRE(long_n > short_n);
  std::ofstream(dir / "generation_config.json") << "{\"max_length\": " << long_n + 3 << "}";
  const std::string bare = std::string(FLOWRUN_BIN) + " generate --model " + dir.string();
  CHECK(has(run(bare + " --prompt Hello 2>&1", &rc), "max_length " + std::to_string(long_n + 3) +
                                                       ": prompt + new tokens, as transformers' generate() takes it "
                                                       "without max_new_tokens (" + file + "; --max_new_tokens wins)"));
  CHECK(rc == 0);
  const auto alone = [&](const std::string& prompt, int new_tokens) {
    std::ofstream(dir / "generation_config.json") << R"({})";
    const auto out = run(bare + " --prompt '" + prompt + "' --max_new_tokens " + std::to_string(new_tokens) +
                             " 2>/dev/null", &rc);
    CHECK(rc == 0);
    return out;
  };
  const std::string want = alone("Hello", long_n + 3 - short_n) + "\n" + alone("Hello there, how are you", 3) + "\n";
  CHECK(want != alone("Hello", 3) + "\n" + alone("Hello there, how are you", 3) + "\n");  // the lengths show
  std::ofstream(dir / "prompts.txt") << "Hello\nHello there, how are you\n";
  std::ofstream(dir / "generation_config.json") << "{\"max_length\": " << long_n + 3 << "}";
  CHECK(run(bare + " --test_path " + (dir / "prompts.txt").string() + " 2>/dev/null", &rc) == want);
  CHECK(rc == 0);
  // past the context (512 tokens): said as the file's limit, prompt and new tokens counted apart
  std::ofstream(dir / "generation_config.json") << R"({"max_length": 600})";
  CHECK_FALSE(has(run(bare + " --prompt Hello --max_new_tokens 2 2>&1", &rc), "max_length"));  // the option wins
  CHECK(has(run(bare + " --prompt Hello 2>&1", &rc),
            "max_length = 600 (prompt + new tokens) of " + file + ": " + std::to_string(short_n) + " prompt tokens "
            "(--prompt) + " + std::to_string(600 - short_n) + " new ones pass " + dir.string() +
            "'s context of 512 tokens; generation stops at the context, after at most " +
            std::to_string(512 - short_n) + " new tokens"));
  std::ofstream(dir / "generation_config.json") << R"({"max_length": 2.5})";
  CHECK(has(run(bare + " --prompt Hello 2>&1", &rc), file + ": max_length = 2.5 is not a whole number >= 1"));
}

TEST_CASE("SFT on TRL's prompt-completion rows says that TRL trains the completion alone, unless mask_prompt is set") {
  namespace fs = std::filesystem;
  const fs::path dir = temp_folder() / "pc_mask";
  fs::create_directories(dir);
  {
    std::ofstream f(dir / "pc.jsonl");
    for (int i = 0; i < 40; ++i)
      f << R"({"prompt": "Add )" << i << R"( and 1:", "completion": " )" << i + 1 << R"("})" << "\n";
  }
  const std::string sft = std::string(FLOWRUN_BIN) + " run " + FLOWRUN_SOURCE_DIR + "/graphs/sft.graph --no-progress" +
                          " --set graph.checkpoint_dir= --set node.sft.steps=1 --set node.sft.data_split=1,0,0" +
                          " --set node.sft.data=" + (dir / "pc.jsonl").string() + " --set node.sft.output=" +
                          (dir / "sft.bin").string();
  int rc = -1;
  auto out = run(sft + " 2>&1", &rc);
  CHECK(rc == 0);
  CHECK(has(out, "rows loaded (prompt/completion (TRL))"));
  CHECK(has(out, (dir / "pc.jsonl").string() + " holds TRL's prompt-completion rows, which TRL's SFTTrainer trains on "
                 "the completion only (completion_only_loss)"));
  out = run(sft + " --set node.sft.mask_prompt=true 2>&1", &rc);
  CHECK(rc == 0);
  CHECK_FALSE(has(out, "completion_only_loss"));
}

TEST_CASE("print_every = 0 is refused when the graph is checked, at file:line:col, for every kind that has it") {
  // It killed sft_trainer, rm_trainer and zero_rank with SIGFPE (exit 136) at their first step.
  const auto dir = temp_folder();
  const std::string bin = FLOWRUN_BIN;
  struct one {
    const char* graph;
    const char* node;
    const char* kind;
  };
  for (const one& c : {one{"sft.graph", "sft", "sft_trainer"}, one{"rm.graph", "rm", "rm_trainer"},
                       one{"pretrain.graph", "ranks", "zero_rank"}}) {
    CAPTURE(std::string(c.kind));
    const std::string file = graph_setting(dir, c.graph, c.node, "print_every = 0");
    int rc = -1;
    auto out = run(bin + " run " + file + " --no-progress 2>&1", &rc);
    CHECK(rc == 2);
    CHECK(has(out, file + ":3:15: error: setting 'print_every' of node '" + c.node + "' (kind " + c.kind +
                       ") must be >= 1, got 0"));
    CHECK(has(out, "hint: print_every: print the loss every N steps"));
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("plans that train nothing are refused when the graph is checked, naming the node and the setting") {
  const std::string rlhf = std::string(FLOWRUN_BIN) + " run " + FLOWRUN_SOURCE_DIR + "/graphs/rlhf.graph --no-progress";
  int rc = -1;
  // 2 rows of each PPO mini-batch over 4 ranks: two ranks would train on nothing
  auto out = run(rlhf + " --set node.policy.replicas=4 --set node.policy.per_device_training_batch_size=2 2>&1", &rc);
  CHECK(rc == 2);
  CHECK(has(out, "per_device_training_batch_size = 2 rows cannot fill replicas (4) x gradient_accumulation_steps (1) "
                 "= 4 micro-batches: some would train on nothing"));
  CHECK(has(out, "hint: raise per_device_training_batch_size to at least 4"));
  // the same with accumulation on the critic
  out = run(rlhf + " --set node.critic.gradient_accumulation_steps=16 2>&1", &rc);
  CHECK(rc == 2);
  CHECK(has(out, "replicas (1) x gradient_accumulation_steps (16) = 16 micro-batches"));
  // data_split that is not three weights, or gives the node's step none: refused here (at the node's start before)
  out = run(rlhf + " --check --set node.prompts.data_split=2,4 2>&1", &rc);
  CHECK(rc == 2);
  CHECK(has(out, "node 'prompts': data_split \"2,4\" has 2 part(s); DS-Chat's has one per step"));
  out = run(rlhf + " --check --set node.prompts.data_split=10,0,0 2>&1", &rc);
  CHECK(rc == 2);
  CHECK(has(out, "node 'prompts': data_split \"10,0,0\" gives step 3, whose share this node reads, weight 0"));
  out = run(rlhf + " --check --set node.rm.data_split=2,x,4 2>&1", &rc);
  CHECK(rc == 2);
  CHECK(has(out, "node 'rm': data_split \"2,x,4\": part \"x\" is not a non-negative number"));
  // ptx text without a tokenizer to read it: refused here, naming the rollouts' (it failed at the node's start)
  out = run(rlhf + " --check --set node.policy.unsup_data=data/tinystories/tinystories_train_head.txt 2>&1", &rc);
  CHECK(rc == 2);
  CHECK(has(out, "node 'policy': unsup_data is read with the node's tokenizer setting, which is empty"));
  CHECK(has(out, "tok512.model\" (the rollouts' tokenizer)"));
  // step 1's lora_module_name (DS-Chat's; it was no setting there): the same check as step 3's
  out = run(rlhf + " --set node.sft.lora_dim=4 --set node.sft.lora_module_name=layers.0.self_attn.q_proj 2>&1", &rc);
  CHECK(rc == 2);
  CHECK(has(out, "LoRA target 'layers.0.self_attn.q_proj' names a module of one layer"));
  // a LoRA target of one layer: refused from its name before step 1 trains (it failed after SFT)
  out = run(rlhf + " --set node.policy.actor_lora_dim=4 --set node.policy.actor_lora_module_name=layers.0.self_attn.q_proj 2>&1",
            &rc);
  CHECK(rc == 2);
  CHECK(has(out, "LoRA target 'layers.0.self_attn.q_proj' names a module of one layer"));
  // an empty module name: refused (it was taken as the default; DS-Chat's "" adapts lm_head and v_head too)
  out = run(rlhf + " --set node.sft.lora_dim=4 --set node.sft.lora_module_name= 2>&1", &rc);
  CHECK(rc == 2);
  CHECK(has(out, "lora_module_name is empty: DS-Chat's \"\" in name adapts every Linear"));
  out = run(rlhf + " --set node.critic.critic_lora_dim=4 --set \"node.critic.critic_lora_module_name= ,\" 2>&1", &rc);
  CHECK(rc == 2);
  CHECK(has(out, "critic_lora_module_name is empty"));
  // two held-out fractions on one dataset: the steps' data_split shares would overlap (each step holds out its
  // rows first); reported once, on the node that differs from the first
  out = run(rlhf + " --set node.rm.eval_fraction=0.2 2>&1", &rc);
  CHECK(rc == 2);
  CHECK(has(out, "node 'rm': eval_fraction = 0.2 but node 'sft' takes its share of the same data (data_split 2,4,4, "
                 "seed 1234) with eval_fraction = 0.1"));
  CHECK(has(out, "hint: give the steps one eval_fraction: set eval_fraction = 0.1 on node 'rm'"));
  CHECK_FALSE(has(out, "node 'prompts': eval_fraction"));
  // the same split spelt otherwise ("2, 4, 4", "20,40,40": the same shares) is the same split
  for (const char* split : {"2, 4, 4", "20,40,40"}) {
    out = run(rlhf + " --set node.rm.eval_fraction=0.2 --set 'node.rm.data_split=" + split + "' 2>&1", &rc);
    CHECK(rc == 2);
    CHECK(has(out, "node 'rm': eval_fraction = 0.2 but node 'sft' takes its share of the same data"));
  }
  // 0 PPO iterations
  out = run(rlhf + " --set node.prompts.iterations=0 2>&1", &rc);
  CHECK(rc == 2);
  CHECK(has(out, "setting 'iterations' of node 'prompts' (kind prompt_loader) must be >= 1, got 0"));
  // an HF Trainer JSON on step 3's trainers: its "auto" keys come from their settings, the ignored
  // scheduler's too (it asked for numbers step 3 then ignored); only the iterations error is left
  const std::string hf_json = std::string(FLOWRUN_SOURCE_DIR) + "/tests/fixtures/ds/hf_trainer_auto.json";
  out = run(rlhf + " --set node.prompts.iterations=0 --set node.policy.deepspeed_config=" + hf_json +
                " --set node.critic.deepspeed_config=" + hf_json + " 2>&1",
            &rc);
  CHECK(rc == 2);
  CHECK(has(out, "must be >= 1, got 0"));
  CHECK_FALSE(has(out, "\"auto\""));
}

TEST_CASE("GRPO settings that train nothing or do nothing are refused when the graph is checked") {
  const std::string grpo = std::string(FLOWRUN_BIN) + " run " + FLOWRUN_SOURCE_DIR +
                           "/graphs/grpo.graph --no-progress --set node.sft.data=data/gsm8k/test.jsonl --set "
                           "node.prompts.data=data/gsm8k/test.jsonl";  // the graph's own data is made by a script
  int rc = -1;
  // greedy sampling: the group's answers are all the same, so every advantage is 0 (it ran, every batch dropped)
  auto out = run(grpo + " --set node.generator.temperature=0 2>&1", &rc);
  CHECK(rc == 2);
  CHECK(has(out, "samples greedily (temperature = 0): its num_generations = 8 answers are all the same, every "
                 "advantage is 0 and nothing trains"));
  out = run(grpo + " --set node.generator.top_k=1 2>&1", &rc);
  CHECK(rc == 2);
  CHECK(has(out, "samples greedily (top_k = 1)"));
  // a command without reward = "command" never ran: the built-in rule scored instead
  out = run(grpo + " --set node.reward.command=\"python3 my_reward.py\" 2>&1", &rc);
  CHECK(rc == 2);
  CHECK(has(out, "error: command is set, but reward = \"gsm8k\" scores with the built-in rule"));
  // an update every 3 batches over a run whose iterations leave 1: that batch was generated, never trained
  out = run(grpo + " --set node.prompts.iterations=10 --set node.experience.generation_batches=3 2>&1", &rc);
  CHECK(rc == 2);
  CHECK(has(out, "generation_batches = 3 trains once per 3 batches, and the loader 'prompts' runs iterations = 10: "
                 "its last 1 batch(es) would be generated and never trained"));
  // a group of 3e9 answers ran out of memory in the generator
  out = run(grpo + " --set node.generator.num_generations=3000000000 2>&1", &rc);
  CHECK(rc == 2);
  CHECK(has(out, "must be in [1, 4096], got 3000000000"));
  // DAPO's filter with groups of one dropped every row, silently: refused
  out = run(grpo + " --set node.generator.num_generations=1 --set node.experience.advantage_estimator=reinforce_plus_plus "
                   "--set node.experience.filter_groups=true 2>&1",
            &rc);
  CHECK(rc == 2);
  CHECK(has(out, "filter_groups drops the groups whose rewards are all equal, and the generator 'generator' samples "
                 "num_generations = 1 per prompt"));
  // two generators split each prompt batch in halves: at max_staleness 0 it trained on halves and held out 4 prompts
  // before and 32 after; at 1 the controller failed on a summary not in flight
  for (const char* s : {"0", "1"}) {
    out = run(grpo + " --set node.generator.replicas=2 --set node.controller.max_staleness=" + s + " 2>&1", &rc);
    CHECK(rc == 2);
    CHECK(has(out, "error: node 'generator': replicas = 2: step 3 rolls out each prompt batch on one generator"));
    CHECK(has(out, "hint: set replicas = 1; give the generator more cores with `threads`"));
  }
  // cliprange 1 or more: validation refuses it (the first update failed, naming clip_ratio_low)
  out = run(grpo + " --set node.policy.cliprange=1.5 2>&1", &rc);
  CHECK(rc == 2);
  CHECK(has(out, "setting 'cliprange' of node 'policy' (kind policy) must be finite, in (0, 1), got 1.5"));
  // each PPO clip on the node whose loss it clips: the policy took cliprange_value and the critic cliprange, and
  // ignored them (DS-Chat: the actor loss clips with cliprange, the critic loss with cliprange_value)
  const std::string ppo = std::string(FLOWRUN_BIN) + " run " + FLOWRUN_SOURCE_DIR + "/graphs/ppo.graph --check";
  out = run(ppo + " --set node.critic.cliprange=0.1 2>&1", &rc);
  CHECK(rc == 2);
  CHECK(has(out, "hint: cliprange clips the policy's ratio: set it on the policy node"));
  out = run(ppo + " --set node.policy.cliprange_value=0.1 2>&1", &rc);
  CHECK(rc == 2);
  CHECK(has(out, "hint: cliprange_value clips the critic's values: set it on the critic node"));
  // a setting under another node than its own: the hint names the node that has it
  out = run(grpo + " --set node.experience.loss_agg_mode=token-mean 2>&1", &rc);
  CHECK(rc == 2);
  CHECK(has(out, "'loss_agg_mode' is a setting of [node.policy] (kind policy): write it there"));
  // veRL's and TRL's names: the hint says what they are here (clip_ratio was offered clip_ratio_c, the dual clip)
  out = run(grpo + " --set node.policy.clip_ratio=0.2 2>&1", &rc);
  CHECK(rc == 2);
  CHECK(has(out, "hint: veRL's clip_ratio is cliprange here (clip_ratio_c is the dual clip)"));
  out = run(grpo + " --set node.experience.norm_adv_by_std_in_grpo=false 2>&1", &rc);
  CHECK(rc == 2);
  CHECK(has(out, "hint: veRL's norm_adv_by_std_in_grpo = false is scale_rewards = \"none\" here"));
  out = run(grpo + " --set node.policy.loss_agg_mode=seq-mean-token-sum-norm 2>&1", &rc);
  CHECK(rc == 2);
  CHECK(has(out, "veRL's seq-mean-token-sum-norm is seq-mean-token-sum here"));
}

TEST_CASE("pretraining's held-out loss: eval_rows below 8 and a rank count that does not divide them are measured") {
  // 1-7 rows, and 64 rows over 3 ranks, printed no held-out line and said nothing (a break-it review, 2026-12-07);
  // rows fewer than the ranks are said
  namespace fs = std::filesystem;
  const fs::path dir = temp_folder();
  std::ifstream in(std::string(FLOWRUN_SOURCE_DIR) + "/configs/ds_zero3.json");
  std::string js((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto at = js.find("\"train_batch_size\": 8");
  REQUIRE(at != std::string::npos);
  js.replace(at, std::string("\"train_batch_size\": 8").size(), "\"train_batch_size\": 6");
  std::ofstream(dir / "tb6.json") << js;
  const std::string pre = std::string(FLOWRUN_BIN) + " run " + FLOWRUN_SOURCE_DIR +
                          "/graphs/pretrain.graph --no-progress --set node.ranks.output_dir= --set "
                          "node.data.output_dir= --set node.ranks.export_hf= --set node.ranks.total_steps=1 --set "
                          "node.data.total_steps=1";
  const std::string three = " --set node.ranks.replicas=3 --set node.data.train_batch_size=6 --set "
                            "node.ranks.deepspeed_config=" + (dir / "tb6.json").string();
  int rc = -1;
  auto out = run(pre + " --set node.data.eval_rows=5 2>&1", &rc);
  CHECK_MESSAGE(rc == 0, out);
  CHECK(has(out, " before step 1 (5 instances)"));
  // the same 64 rows on 1 rank and on 3: one figure (a sum over every row's targets over their count)
  const auto loss = [](const std::string& o) {
    const auto p = o.find("[pretrain] held-out loss ");
    return p == std::string::npos ? std::string() : o.substr(p + 25, 8);
  };
  const std::string one = loss(out = run(pre + " 2>&1", &rc));
  CHECK(rc == 0);
  CHECK(has(out, " before step 1 (64 instances)"));
  out = run(pre + three + " 2>&1", &rc);
  CHECK_MESSAGE(rc == 0, out);
  CHECK(has(out, " before step 1 (64 instances)"));
  CHECK(!one.empty());
  CHECK(loss(out) == one);
  out = run(pre + three + " --set node.data.eval_rows=2 2>&1", &rc);
  CHECK(rc == 0);
  CHECK(has(out, "node 'ranks': 2 held-out instance(s) cannot give each of the 3 ranks one: no held-out loss is "
                 "measured; raise the data node's eval_rows to 3 or more"));
  CHECK_FALSE(has(out, "[pretrain] held-out loss"));
  // ... and such a run saves its checkpoints (the save read the held-out rows' count and failed at every commit)
  out = run(pre + " --set node.data.eval_rows=1 --set node.ranks.replicas=2 --set node.ranks.output_dir=" +
                (dir / "ck").string() + " --set node.data.output_dir=" + (dir / "ck").string() + " 2>&1",
            &rc);
  CHECK_MESSAGE(rc == 0, out);
  CHECK(has(out, "1 held-out instance(s) cannot give each of the 2 ranks one"));
  CHECK(std::filesystem::exists(dir / "ck" / "step_00000001"));
}

TEST_CASE("pretraining's data and ranks must agree on total_steps and seq_length, refused when the graph is checked") {
  // A data node shorter than the ranks' total_steps ended the run early with exit 0 and no export;
  // a longer one trained past it ("step 40/12"); another seq_length misled the memory plan.
  const std::string pre = std::string(FLOWRUN_BIN) + " run " + FLOWRUN_SOURCE_DIR +
                          "/graphs/pretrain.graph --no-progress -q --set node.ranks.output_dir= --set "
                          "node.data.output_dir= --set node.ranks.export_hf=";
  int rc = -1;
  auto out = run(pre + " --set node.ranks.total_steps=100 2>&1", &rc);
  CHECK(rc == 2);
  CHECK(has(out, "error: node 'ranks': total_steps = 100 but its data node 'data' has total_steps = 40: the two "
                 "must be equal"));
  CHECK(has(out, "hint: set total_steps to one value on both nodes"));
  out = run(pre + " --set node.data.seq_length=256 2>&1", &rc);
  CHECK(rc == 2);
  CHECK(has(out, "error: node 'ranks': seq_length = 64 but its data node 'data' has seq_length = 256"));
  // resume on one of them: the data resumed at the end beside ranks starting afresh (nothing trained or saved, exit 0),
  // or started over beside resumed ranks (the first batches again)
  for (const char* node : {"ranks", "data"}) {
    out = run(pre + " --set node." + node + ".resume=false 2>&1", &rc);
    CHECK(rc == 2);
    CHECK(has(out, "its data node 'data' has resume = "));
    CHECK(has(out, "so the two resume together or not at all"));
  }
  // TencentPretrain's flags on zero_rank: the hint says where each one is set here
  out = run(pre + " --set node.ranks.learning_rate=1e-4 2>&1", &rc);
  CHECK(rc == 2);
  CHECK(has(out, "hint: TencentPretrain's --learning_rate is the DeepSpeed JSON's optimizer.params.lr here"));
  out = run(pre + " --set node.ranks.accumulation_steps=2 2>&1", &rc);
  CHECK(rc == 2);
  CHECK(has(out, "hint: TencentPretrain's --accumulation_steps is the DeepSpeed JSON's gradient_accumulation_steps"));
  for (const auto& [name, here] : {std::pair<std::string, std::string>{"pretrained_model_path", "is model here"},
                                   {"output_model_path", "is output_dir here"},
                                   {"lora_pretrained_model_path", "is lora_pretrained here"}}) {
    out = run(pre + " --set node.ranks." + name + "=/x 2>&1", &rc);
    CHECK(rc == 2);
    CHECK_MESSAGE(has(out, "hint: TencentPretrain's --" + name + " " + here), out);
  }
  // a global batch other than the DeepSpeed JSON's failed at the first batch, inside the engine, naming neither
  out = run(pre + " --set node.data.train_batch_size=16 2>&1", &rc);
  CHECK(rc == 2);
  CHECK(has(out, "ds_zero3.json resolves train_batch_size to 8 (train_micro_batch_size_per_gpu 2 x "
                 "gradient_accumulation_steps 2 x 2 rank(s)), but its data node 'data' cuts batches of "
                 "train_batch_size = 16"));
  CHECK(has(out, "hint: make them equal: set node.data.train_batch_size = 8, or the JSON's train_batch_size to 16"));
  // LoRA settings without use_lora trained the whole model without a word; an empty target list meant all-linear
  out = run(pre + " --set node.ranks.lora_r=4 --set node.ranks.lora_dropout=0.1 2>&1", &rc);
  CHECK(rc == 2);
  CHECK(has(out, "error: node 'ranks': lora_r is set but use_lora = false: the whole model trains and no adapter is "
                 "read or written"));
  CHECK(has(out, "error: node 'ranks': lora_dropout is set but use_lora = false"));
  CHECK(has(out, "hint: set use_lora = true, or remove lora_r"));
  // save_lora and lora_pretrained too, when the graph is checked (they were refused by each rank's start)
  out = run(pre + " --set node.ranks.save_lora=/tmp/flowrun_no_adapter --set node.ranks.lora_pretrained=" +
                FLOWRUN_SOURCE_DIR + "/tests/fixtures 2>&1",
            &rc);
  CHECK(rc == 2);
  CHECK(has(out, "error: node 'ranks': save_lora is set but use_lora = false"));
  CHECK(has(out, "error: node 'ranks': lora_pretrained is set but use_lora = false"));
  out = run(pre + " --set node.ranks.use_lora=true --set 'node.ranks.lora_target_modules=\"\"' 2>&1", &rc);
  CHECK(rc == 2);
  CHECK(has(out, "error: node 'ranks': lora_target_modules is empty"));
  // a target that matches nothing names the setting (it began "enable_lora: target module ...")
  out = run(pre + " --set node.ranks.use_lora=true --set node.ranks.lora_target_modules=foo_proj 2>&1", &rc);
  CHECK(rc != 0);
  CHECK(has(out, "node 'ranks': lora_target_modules = \"foo_proj\": target module 'foo_proj' matches no Linear layer"));
  // a misspelt DeepSpeed key is named with the key it was likely meant as; the config's own warnings (an
  // unknown warmup_type) reach the log (they were parsed, then never shown)
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("flowrun_ds_typos_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::ifstream in(std::string(FLOWRUN_SOURCE_DIR) + "/configs/ds_zero3.json");
  std::string json((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto swap = [](std::string t, const std::string& a, const std::string& b) { return t.replace(t.find(a), a.size(), b); };
  std::ofstream((dir / "batch.json").string()) << swap(json, "\"train_batch_size\"", "\"train_batch_sizee\"");
  std::ofstream((dir / "clip.json").string())
      << swap(swap(json, "\"gradient_clipping\"", "\"gradient_clippin\""), "\"warmup_type\": \"linear\"",
              "\"warmup_type\": \"cosinee\"");
  out = run(pre + " --set node.ranks.deepspeed_config=" + (dir / "batch.json").string() + " 2>&1", &rc);
  CHECK(rc == 2);
  CHECK(has(out, "cuts batches of train_batch_size = 8; " + (dir / "batch.json").string() +
                     ":2:3: \"train_batch_sizee\" is not read: did you mean \"train_batch_size\"?"));
  out = run(pre + " --set node.ranks.deepspeed_config=" + (dir / "clip.json").string() +
                " --set node.data.total_steps=2 --set node.ranks.total_steps=2 2>&1",
            &rc);
  CHECK(rc == 0);
  CHECK(has(out, "\"gradient_clippin\" is not a setting flowrun reads, and is ignored: did you mean "
                 "\"gradient_clipping\"?"));
  CHECK(has(out, "unknown warmup_type \"cosinee\""));
  // a misspelt zero_optimization key trained at stage 0 with an info line; DeepSpeed refuses it, so do we, when
  // the graph is checked (not once per rank at start)
  std::ofstream((dir / "stage.json").string()) << swap(json, "\"stage\"", "\"stgae\"");
  out = run(pre + " --set node.ranks.deepspeed_config=" + (dir / "stage.json").string() + " 2>&1", &rc);
  CHECK(rc == 2);
  CHECK(has(out, "zero_optimization.stgae is not a zero_optimization setting (DeepSpeed rejects it too): did you mean "
                 "\"stage\"?"));
  // DS-Chat's trainers read the same JSON when the graph is checked: one error, not one per replica at start
  for (const char* node : {"sft", "rm", "policy", "critic"}) {
    CAPTURE(node);
    out = run(std::string(FLOWRUN_BIN) + " run " + FLOWRUN_SOURCE_DIR + "/graphs/rlhf.graph --no-progress --set node." +
                  node + ".deepspeed_config=" + (dir / "stage.json").string() + " --set node.policy.replicas=2 2>&1",
              &rc);
    CHECK(rc == 2);
    CHECK(has(out, std::string("error: node '") + node + "': " + (dir / "stage.json").string()));
    CHECK(out.find("failed in start") == std::string::npos);
  }
  fs::remove_all(dir);
}

TEST_CASE("with only_optimize_lora the printed lr is the LoRA group's, the one that trains") {
  // it printed learning_rate's schedule while only lora_learning_rate's group trained
  const auto out_bin = std::filesystem::temp_directory_path() / "flowrun_cli_lora_lr.bin";
  const std::string sft = std::string(FLOWRUN_BIN) + " run " + FLOWRUN_SOURCE_DIR +
                          "/graphs/sft.graph --no-progress --set node.sft.steps=2 --set node.sft.print_every=1 "
                          "--set node.sft.num_warmup_steps=0 --set node.sft.lr_scheduler_type=constant "
                          "--set node.sft.learning_rate=1e-3 --set node.sft.output=" + out_bin.string();
  int rc = -1;
  auto out = run(sft + " --set node.sft.lora_dim=4 --set node.sft.only_optimize_lora=true "
                       "--set node.sft.lora_learning_rate=5e-4 2>&1", &rc);
  REQUIRE(rc == 0);
  CHECK(has(out, "[step 1 sft] step 1/2 loss "));
  CHECK(has(out, " lr 5.00e-04 (LoRA) ("));
  out = run(sft + " 2>&1", &rc);  // the whole model trains: learning_rate's
  REQUIRE(rc == 0);
  CHECK(has(out, " lr 1.00e-03 ("));
  std::filesystem::remove(out_bin);
}

TEST_CASE("save_lora on sft_trainer and dpo_trainer writes a PEFT adapter that gives the merged output's model") {
  // TRL saves a peft model's adapter alone; DS-Chat's trainers wrote the merged model only
  const auto dir = std::filesystem::temp_directory_path() / "flowrun_cli_save_lora";
  std::filesystem::remove_all(dir);
  int rc = -1;
  const std::string sft = std::string(FLOWRUN_BIN) + " run " + FLOWRUN_SOURCE_DIR +
                          "/graphs/sft.graph --no-progress --set node.sft.steps=20 --set node.sft.output=" +
                          (dir / "merged.bin").string() + " --set node.sft.save_lora=" + (dir / "adapter").string();
  auto out = run(sft + " 2>&1", &rc);  // without LoRA there is nothing to save: refused before training
  CHECK(rc == 2);
  CHECK(has(out, "save_lora is set but lora_dim = 0: there is no adapter to save"));
  out = run(sft + " --set node.sft.lora_dim=4 2>&1", &rc);  // the base's embeddings and norms train too
  CHECK(rc == 2);
  CHECK(has(out, "save_lora with only_optimize_lora = false"));
  out = run(sft + " --set node.sft.lora_dim=4 --set node.sft.only_optimize_lora=true --set node.sft.lora_learning_rate=1e-2 2>&1",
            &rc);
  REQUIRE(rc == 0);
  CHECK(has(out, "[step 1 sft] LoRA adapter (only the LoRA weights, PEFT format) -> "));
  CHECK(std::filesystem::exists(dir / "adapter" / "adapter_config.json"));
  CHECK(std::filesystem::exists(dir / "adapter" / "adapter_model.safetensors"));
  const std::string gen = " --prompt 'Once upon' --temperature 0 --max_new_tokens 30 2>/dev/null";
  const auto merged = run(std::string(FLOWRUN_BIN) + " generate --model " + (dir / "merged.bin").string() + gen, &rc);
  REQUIRE(rc == 0);
  const auto base_lora = run(std::string(FLOWRUN_BIN) + " generate --model model/stories260K/stories260K.bin --lora " +
                                 (dir / "adapter").string() + gen,
                             &rc);
  REQUIRE(rc == 0);
  CHECK(merged == base_lora);
  const auto base = run(std::string(FLOWRUN_BIN) + " generate --model model/stories260K/stories260K.bin" + gen, &rc);
  CHECK(base != merged);  // the adapter changed something
  std::filesystem::remove_all(dir);
}

TEST_CASE("out-of-range training and sampling settings are refused before anything starts, naming the value") {
  // Each was accepted silently (a negative learning rate trains uphill; a negative warmup, a negative rank).
  const std::string sft = std::string(FLOWRUN_BIN) + " run " + FLOWRUN_SOURCE_DIR + "/graphs/sft.graph --no-progress";
  struct one {
    const char* set;
    const char* says;
  };
  for (const one& c : {one{"node.sft.learning_rate=-1", "setting 'learning_rate' of node 'sft' (kind sft_trainer) "
                                                         "must be finite, >= 0, got -1.0"},
                       one{"node.sft.learning_rate=nan", "must be finite, >= 0, got nan"},
                       one{"node.sft.num_warmup_steps=-5", "setting 'num_warmup_steps' of node 'sft' (kind "
                                                           "sft_trainer) must be >= 0, got -5"},
                       one{"node.sft.lora_dim=-1", "setting 'lora_dim' of node 'sft' (kind sft_trainer) must be >= 0, "
                                                   "got -1"},
                       one{"node.sft.replicas=100000", "node 'sft' has replicas = 100000; replicas must be <= 1024"}}) {
    CAPTURE(std::string(c.set));
    int rc = -1;
    auto out = run(sft + " --set " + c.set + " 2>&1", &rc);
    CHECK(rc == 2);
    CHECK(has(out, std::string("--set ") + c.set + ":1:"));
    CHECK(has(out, c.says));
  }
  const std::string ppo = std::string(FLOWRUN_BIN) + " run " + FLOWRUN_SOURCE_DIR + "/graphs/ppo.graph --no-progress";
  for (const char* set : {"node.generator.temperature=inf", "node.generator.temperature=-1",
                          "node.generator.top_p=-1"}) {
    CAPTURE(std::string(set));
    int rc = -1;
    auto out = run(ppo + " --set " + set + " 2>&1", &rc);
    CHECK(rc == 2);
    CHECK(has(out, "of node 'generator' (kind rollout_generator) must be finite"));
  }
}

TEST_CASE("lora_dim above the model's dim is refused at start, at once, naming the bound") {
  // lora_dim = 100000 spent over 90 s in start; 4096 took 2.3 GB for stories260K (dim 64).
  int rc = -1;
  auto out = run(std::string(FLOWRUN_BIN) + " run " + FLOWRUN_SOURCE_DIR +
                     "/graphs/sft.graph --no-progress --set node.sft.lora_dim=100000 --set node.sft.output= 2>&1",
                 &rc);
  CHECK(rc == 1);
  CHECK(has(out, "node 'sft'"));
  CHECK(has(out, "LoRA rank must be <= the model's dim (64"));
  CHECK(has(out, "got 100000"));
}

TEST_CASE("--threads and --credit are bounded, with why, exit 2") {
  const std::string run_graph = std::string(FLOWRUN_BIN) + " run " + FLOWRUN_SOURCE_DIR + "/graphs/sft.graph";
  int rc = -1;
  // --threads 5000 hung at start; --credit 1e12 failed with bad_alloc; 0 and -1 were accepted.
  auto out = run(run_graph + " --threads 5000 2>&1", &rc);
  CHECK(rc == 2);
  CHECK(has(out, "--threads"));
  CHECK(has(out, "got 5000"));
  CHECK(has(out, "more CAF workers only contend for the cores"));
  for (const char* credit : {"1e12", "0", "-1"}) {
    CAPTURE(std::string(credit));
    out = run(run_graph + " --credit=" + credit + " 2>&1", &rc);
    CHECK(rc == 2);
    CHECK(has(out, "--credit"));
    CHECK(has(out, std::string("must be in [1, 1000000] (each link keeps a slot per credit: more only costs "
                               "memory), got ") +
                       credit));
  }
  out = run(std::string(FLOWRUN_BIN) + " node --threads 5000 2>&1", &rc);
  CHECK(rc == 2);
  CHECK(has(out, "got 5000"));
}

TEST_CASE("flowrun generate checks its sampling options with the generator's ranges") {
  const std::string gen = std::string(FLOWRUN_BIN) + " generate --max_new_tokens 4";
  struct one {
    const char* args;
    const char* says;
  };
  for (const one& c : {one{"--temperature nan", "must be finite, >= 0, got nan"},
                       one{"--temperature inf", "must be finite, >= 0, got inf"},
                       one{"--temperature=-1", "must be finite, >= 0, got -1.0"},
                       one{"--top_p=-1", "must be finite, in (0, 1], got -1.0"},
                       one{"--top_p 1.5", "must be finite, in (0, 1], got 1.5"},
                       one{"--top_k=-3", "must be >= 0, got -3"}}) {
    CAPTURE(std::string(c.args));
    int rc = -1;
    auto out = run(gen + " " + c.args + " 2>&1", &rc);
    CHECK(rc == 2);
    CHECK(has(out, c.says));
    CHECK(has(out, "flowrun explain generator"));
  }
}

TEST_CASE("seeds, eval_every and chat's max_new_tokens on the command line: refused before any work") {
  // train-lm --seed -1 and --eval_every -5, generate --seed -1 and eval's --seed -1 were accepted
  const std::string bin = FLOWRUN_BIN;
  struct one {
    std::string args;
    const char* says;
  };
  for (const one& c : {one{" train-lm --steps 1 --seed -1", "--seed: Value -1 not in range 0 to 4294967295"},
                       one{" train-lm --steps 1 --seed 4294967296", "--seed: Value 4294967296 not in range 0 to 4294967295"},
                       one{" train-lm --steps 1 --eval_every -5", "--eval_every must be >= 0 (0 = only at the end)"},
                       one{" eval reward --eval_fraction 1.5", "--eval_fraction: must be in [0, 1), the held-out share"},
                       one{" generate --max_new_tokens 1 --seed -1", "--seed: Value -1 not in range 0 to 4294967295"},
                       one{" eval reward --seed -1", "--seed: Value -1 not in range 0 to 4294967295"},
                       one{" eval prompts --seed -1", "--seed: Value -1 not in range 0 to 4294967295"},
                       one{" chat --max_new_tokens 0 < /dev/null", "--max_new_tokens must be >= 1 (a reply needs a token)"}}) {
    CAPTURE(c.args);
    int rc = -1;
    auto out = run(bin + c.args + " 2>&1", &rc);
    CHECK(rc != 0);
    CHECK(has(out, c.says));
  }
}

TEST_CASE("flowrun explain prints each setting's range") {
  int rc = -1;
  auto out = run(std::string(FLOWRUN_BIN) + " explain sft_trainer", &rc);
  CHECK(rc == 0);
  CHECK(has(out, "print the loss every N steps  [>= 1]"));
  CHECK(has(out, "AdamW peak learning rate  [finite, >= 0]"));
  out = run(std::string(FLOWRUN_BIN) + " explain rollout_generator", &rc);
  CHECK(has(out, "nucleus threshold (1: off)  [finite, in (0, 1]]"));
}

TEST_CASE("text_source reads a file larger than its 64 KiB blocks: every non-blank line once, ends stripped") {
  // text_source reads in pread blocks (no stream held open, issue 17); lines cross block boundaries.
  const auto dir = temp_folder();
  std::vector<std::string> want;
  {
    std::ofstream f(dir / "lines.txt", std::ios::binary);
    for (int i = 0; i < 20000; ++i) {
      std::string line = "line " + std::to_string(i) + " " + std::string(static_cast<std::size_t>(i % 37), 'x');
      want.push_back(line);
      f << line << (i % 5 == 0 ? "\r\n" : "\n");
      if (i % 7 == 0) f << "  \n";  // blank lines are skipped
    }
    f << "last line without an end";
    want.push_back("last line without an end");
  }
  std::ofstream(dir / "ts.graph") << "edges = [\"src.lines -> out.items\"]\n[node.src]\nkind = \"text_source\"\n"
                                     "path = \"lines.txt\"\nreplicas = 3\n[node.out]\nkind = \"sink\"\npath = \"out.txt\"\n";
  int rc = -1;
  run("cd " + dir.string() + " && " + FLOWRUN_BIN + " run ts.graph --no-progress -q 2>&1", &rc);
  CHECK(rc == 0);
  std::ifstream in(dir / "out.txt");
  std::vector<std::string> got;
  for (std::string line; std::getline(in, line);) got.push_back(line);
  std::sort(got.begin(), got.end());
  std::sort(want.begin(), want.end());
  CHECK(got.size() == want.size());
  CHECK(got == want);
  std::filesystem::remove_all(dir);
}

TEST_CASE("flowrun train --step 2 3 from a folder without graphs/: step 3 reads the very reward model step 2 wrote") {
  // The bug (issue 17): step 2 wrote ./out/rlhf/reward_model, and step 3 silently loaded the repository's older
  // one. Now a relative --set path resolves against the working directory, and step 3 is handed step 2's output.
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("flowrun_train_paths_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  int rc = -1;
  auto out = run("cd " + dir.string() + " && " + std::string(FLOWRUN_BIN) +
                     " train --step 2 3 --actor-model model/stories260K/stories260K.bin --set node.rm.steps=2"
                     " --set node.rm.output=runs/my_rm --set node.policy.output=runs/my_ppo.bin"
                     " --set node.prompts.iterations=1 --set node.prompts.eval_prompts=2 --set graph.checkpoint_dir="
                     " 2>&1",
                 &rc);
  INFO(out);
  REQUIRE(rc == 0);
  const fs::path rm = fs::canonical(dir) / "runs" / "my_rm";
  CHECK(fs::exists(rm / "flowrun_config.json"));
  CHECK(fs::exists(fs::canonical(dir) / "runs" / "my_ppo.bin"));
  // the critic beside the policy, as train.py saves OUTPUT_DIR/.../critic (it was not saved at all)
  CHECK(fs::exists(fs::canonical(dir) / "runs" / "ppo_critic" / "flowrun_config.json"));
  // step 3's reward model was loaded from that very folder, named with its modification time
  CHECK(out.find("--set node.reward_model.model=" + rm.string()) != std::string::npos);
  CHECK(out.find("[reward_model[0]] [info] loading model " + rm.string() + " (modified ") != std::string::npos);
  CHECK(out.find("[step 3 ppo] held-out after") != std::string::npos);
  fs::remove_all(dir);
}

TEST_CASE("flowrun train with model folders reads their tokenizers and writes folders under --output-dir (DS-Chat's train.py)") {
  // DS-Chat's `train.py --step 1 2 3 --actor-model A --reward-model R`: with HF folders it was refused seven times
  // (the nodes kept tok512, and the graphs' .bin outputs cannot hold an HF model)
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("flowrun_train_hf_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string qwen = std::string(FLOWRUN_SOURCE_DIR) + "/tests/fixtures/hf_chat/qwen2";
  int rc = -1;
  auto out = run("cd " + dir.string() + " && " + std::string(FLOWRUN_BIN) + " train --step 1 2 3 --actor-model " + qwen +
                     " --reward-model " + qwen + " --output-dir runs --set node.sft.steps=2 --set node.rm.steps=2"
                     " --set node.prompts.iterations=1 --set node.prompts.eval_prompts=2 --set node.rm.max_seq_len=96"
                     " --set node.sft.max_seq_len=96 2>&1",
                 &rc);
  INFO(out);
  REQUIRE(rc == 0);
  const fs::path runs = fs::canonical(dir) / "runs";
  for (const char* folder : {"actor-models/actor", "reward-models/reward_model", "step3-models/actor", "step3-models/critic"})
    CHECK_MESSAGE(fs::exists(runs / folder / "config.json"), folder);
  CHECK(fs::exists(runs / "actor-models" / "actor" / "tokenizer.json"));  // an HF folder keeps its tokenizer
  CHECK(fs::exists(runs / "checkpoints" / "step3.json"));
  for (const char* n : {"sft", "prompts", "generator", "policy", "rm"})
    CHECK(out.find(std::string("--set node.") + n + ".tokenizer=" + qwen) != std::string::npos);
  CHECK(out.find("[step 3 ppo] held-out after") != std::string::npos);
  // step 3 alone reads what steps 1-2 wrote under --output-dir, as train.py does (it read ppo.graph's out/rlhf
  // models, an older run's)
  out = run("cd " + dir.string() + " && " + std::string(FLOWRUN_BIN) + " train --step 3 --output-dir runs" +
                " --set node.prompts.iterations=1 --set node.prompts.eval_prompts=2 2>&1",
            &rc);
  CHECK(rc == 0);
  CHECK(out.find("--set node.actor_model.model=" + (runs / "actor-models" / "actor").string()) != std::string::npos);
  CHECK(out.find("--set node.reward_model.model=" + (runs / "reward-models" / "reward_model").string()) !=
        std::string::npos);
  // a --output-dir without them (a typo): refused, naming where it looked (it trained from ppo.graph's out/rlhf
  // models, an older run's, with exit 0)
  out = run("cd " + dir.string() + " && " + std::string(FLOWRUN_BIN) + " train --step 3 --output-dir runz 2>&1", &rc);
  CHECK(rc == 2);
  CHECK(out.find("step 3 without step 1 reads step 1's model from " + (runs.parent_path() / "runz" / "actor-models" /
                                                                      "actor.bin").string()) != std::string::npos);
  CHECK_FALSE(fs::exists(dir / "runz"));
  // an actor and a reward model that read text otherwise: refused before step 2 trains (step 3 refused them after)
  const std::string llama3 = std::string(FLOWRUN_SOURCE_DIR) + "/tests/fixtures/hf_chat/llama3";
  out = run("cd " + dir.string() + " && " + std::string(FLOWRUN_BIN) + " train --step 2 3 --actor-model " + qwen +
                " --reward-model " + llama3 + " --output-dir runs2 2>&1",
            &rc);
  CHECK(rc == 2);
  CHECK(out.find("step 3 reads the actor's and the reward model's text with one tokenizer, as DeepSpeed-Chat's "
                 "train.py, and the actor model " + qwen) != std::string::npos);
  CHECK(out.find("[step 2 rm]") == std::string::npos);
  fs::remove_all(dir);
}

TEST_CASE("flowrun train --dtype bf16 sets the dtype of every model of the steps run (DS-Chat's --dtype), --reward-zero-stage the stage") {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("flowrun_train_dtype_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  int rc = -1;
  auto out = run("cd " + dir.string() + " && " + std::string(FLOWRUN_BIN) +
                     " train --step 2 3 --dtype bf16 --reward-zero-stage 2 --actor-model model/stories260K/stories260K.bin"
                     " --set node.rm.steps=2 --set node.rm.output=runs/rm --set node.policy.output=runs/ppo.bin"
                     " --set node.prompts.iterations=1 --set node.prompts.eval_prompts=0 --set graph.checkpoint_dir="
                     " --set node.reference.dtype=fp32 2>&1",
                 &rc);
  INFO(out);
  REQUIRE(rc == 0);
  // step 2 and the step-3 models in bf16, but the node a --set names (it wins), with the mixed-dtype warning
  // DS-Chat's --reward-zero-stage: step 2's and the critic's stage
  CHECK(out.find("[rm[0]] [info] memory plan: rank 0/1 stage 2, bf16: params") != std::string::npos);
  CHECK(out.find("--set node.critic.critic_zero_stage=2") != std::string::npos);
  for (const char* who : {"policy", "critic"})
    CHECK(out.find(std::string("[") + who + "[0]] [info] model ready: ") != std::string::npos);
  CHECK(out.find("[reward[0]] [info] model ready: ") != std::string::npos);
  CHECK(out.find("ZeRO stage 0, bf16)") != std::string::npos);
  CHECK(out.find("(policy bf16, reference fp32, reward bf16, critic bf16)") != std::string::npos);
  int bad = -1;
  auto refused = run(std::string(FLOWRUN_BIN) + " train --step 1 --dtype bfloat16 2>&1", &bad);
  CHECK(bad != 0);
  CHECK(refused.find("--dtype: bfloat16 not in {fp32,bf16,fp16}") != std::string::npos);
  refused = run(std::string(FLOWRUN_BIN) + " train --step 1 --actor-zero-stage 4 2>&1", &bad);
  CHECK(bad != 0);
  CHECK(refused.find("--actor-zero-stage: Value 4 not in range 0 to 3") != std::string::npos);
  fs::remove_all(dir);
}

TEST_CASE("flowrun train --step 1 3 without step 2's reward model is refused before step 1 trains, naming --reward-model") {
  int rc = -1;
  auto out = run(std::string(FLOWRUN_BIN) + " train --step 1 3 --set node.sft.steps=2 --set graph.checkpoint_dir="
                     " --set node.reward_model.model=no/such/reward_model 2>&1",
                 &rc);
  INFO(out);
  CHECK(rc == 2);
  CHECK(out.find("step 3 without step 2 reads reward_model's model from no/such/reward_model, which does not exist: "
                 "give --reward-model (step 2's output), or add step 2 to --step") != std::string::npos);
  CHECK(out.find("[step 1 sft]") == std::string::npos);  // it trained step 1 first, then failed
}

TEST_CASE("convert --from llama2c takes the SentencePiece file beside the .bin, and generate names a --tokenizer that is not the folder's") {
  // stories260K.bin beside tok512.model was written without a tokenizer (only tokenizer.model was looked for)
  namespace fs = std::filesystem;
  const fs::path dir = temp_folder() / "llama2c_beside";
  fs::remove_all(dir);
  int rc = -1;
  auto log = run(std::string(FLOWRUN_BIN) + " convert --from llama2c " + flowrun::test::model_path() + " --to hf " +
                     (dir / "hf").string() + " 2>&1",
                 &rc);
  INFO(log);
  REQUIRE(rc == 0);
  CHECK(has(log, "tokenizer: " + flowrun::test::tokenizer_path() + ", beside the llama2.c file, the one SentencePiece file there"));
  const auto bytes = [](const fs::path& p) {
    std::ifstream f(p, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  };
  CHECK(bytes(dir / "hf" / "tokenizer.model") == bytes(flowrun::test::tokenizer_path()));
  // two .model files: which one is not guessed, and the folder gets none, said
  fs::create_directories(dir / "two");
  fs::copy_file(flowrun::test::model_path(), dir / "two" / "m.bin");
  fs::copy_file(flowrun::test::tokenizer_path(), dir / "two" / "a.model");
  fs::copy_file(flowrun::test::tokenizer_path(), dir / "two" / "b.model");
  log = run(std::string(FLOWRUN_BIN) + " convert --from llama2c " + (dir / "two" / "m.bin").string() + " --to hf " +
                (dir / "two_hf").string() + " 2>&1",
            &rc);
  CHECK(rc == 0);
  CHECK(has(log, "(2 .model files: which one?): the folder gets none"));
  CHECK_FALSE(fs::exists(dir / "two_hf" / "tokenizer.model"));
  // a --tokenizer of the same size as the folder's own, with other ids (Qwen2's and Llama 3's fixtures, 902 each)
  const std::string fx = std::string(FLOWRUN_SOURCE_DIR) + "/tests/fixtures/hf_chat/";
  log = run(std::string(FLOWRUN_BIN) + " generate --model " + fx + "qwen2 --tokenizer " + fx +
                "llama3 --prompt Hi --max_new_tokens 2 2>&1",
            &rc);
  CHECK(rc == 0);
  CHECK(has(log, "--tokenizer " + fx + "llama3 is not the tokenizer in the model folder " + fx + "qwen2 ("));
}

TEST_CASE("an estimator's unused settings are said, and TRL's boolean scale_rewards gets a hint") {
  // gamma, lam and clip_reward_value beside grpo, scale_rewards beside rloo were taken without a word
  const std::string bin = std::string(FLOWRUN_BIN) + " run " + FLOWRUN_SOURCE_DIR + "/graphs/";
  int rc = -1;
  // (a temperature the check refuses: nothing trains)
  auto out = run(bin + "grpo.graph --no-progress" GRPO_DATA " --set node.experience.gamma=0.9 --set node.experience.lam=0.5 "
                       "--set node.generator.temperature=1e-9 2>&1",
                 &rc);
  CHECK(rc == 2);
  CHECK(has(out, "node 'experience': gamma = 0.9 changes nothing: advantage_estimator = \"grpo\" does not use it "
                 "(only gae and reinforce_plus_plus)"));
  CHECK(has(out, "node 'experience': lam = 0.5 changes nothing: advantage_estimator = \"grpo\" does not use it (only gae)"));
  CHECK_FALSE(has(out, "scale_rewards = "));  // grpo.graph's own settings are grpo's
  out = run(bin + "rloo.graph --no-progress" GRPO_DATA " --set node.experience.scale_rewards=batch "
                  "--set node.generator.temperature=1e-9 2>&1",
            &rc);
  CHECK(has(out, "scale_rewards = \"batch\" changes nothing: advantage_estimator = \"rloo\" does not use it (only grpo)"));
  out = run(bin + "rlhf.graph --no-progress --set node.generator.temperature=1e-9 2>&1", &rc);
  CHECK_FALSE(has(out, "changes nothing"));
  out = run(bin + "grpo.graph --no-progress" GRPO_DATA " --set node.experience.scale_rewards=false 2>&1", &rc);
  CHECK(rc == 2);
  CHECK(has(out, "hint: TRL's scale_rewards = False is \"none\" here (Dr. GRPO)"));
}

TEST_CASE("an option of another spelling or tool gets a hint: generate, chat and eval") {
  // CLI11 said only "The following arguments were not expected", the arguments in reverse order
  const std::string bin = std::string(FLOWRUN_BIN);
  int rc = -1;
  auto out = run(bin + " generate --max-new-tokens 5 --do_sample --num_beams 2 2>&1", &rc);
  CHECK(rc == 2);
  CHECK(has(out, "hint: --max-new-tokens is --max_new_tokens here"));
  CHECK(has(out, "hint: --do_sample: sampling is on with --temperature > 0"));
  CHECK_FALSE(has(out, "--num_beams:"));  // generate's own option (beam search)
  CHECK(has(run(bin + " chat --num_beams 2 2>&1", &rc), "hint: --num_beams: beam search is `flowrun generate --num_beams`"));
  out = run(bin + " generate --temprature 0.5 2>&1", &rc);
  CHECK(has(out, "hint: --temprature: did you mean --temperature?"));
  out = run(bin + " chat --path x 2>&1", &rc);
  CHECK(has(out, "hint: --path: DS-Chat's chat.py --path is --model here"));
  CHECK(has(run(bin + " chat --zero_checkpoint x 2>&1", &rc), "hint: --zero_checkpoint: chat reads a model file or "
                                                               "folder: write the checkpoint as one with `flowrun "
                                                               "convert --from zero DIR --to hf OUT`"));
  CHECK(has(run(bin + " eval reward --add_eot_token 2>&1", &rc), "hint: --add_eot_token: DS-Chat's --add_eot_token "
                                                                 "needs no flag here"));
  CHECK(has(run(bin + " eval prompts --language English 2>&1", &rc), "hint: --language: DS-Chat's prompt_eval.py"));
  // a command's own command (eval prompts): its options are its own, not hinted
  out = run(bin + " eval prompts --baseline x --model_name_or_path_finetune y 2>&1", &rc);
  CHECK(rc == 2);
  CHECK(has(out, "hint: --model_name_or_path_finetune: DS-Chat's --model_name_or_path_finetune is --finetuned here"));
  CHECK_FALSE(has(out, "--baseline:"));
  // an option it begins; never --help; an option's value is no option; another command's flags get no such hint
  CHECK(has(run(bin + " generate --temp 0 2>&1", &rc), "hint: --temp: did you mean --temperature?"));
  out = run(bin + " generate --prompt --hello --max-new-tokens 3 2>&1", &rc);
  CHECK(has(out, "hint: --max-new-tokens is --max_new_tokens here"));
  CHECK_FALSE(has(out, "--hello:"));
  CHECK_FALSE(has(run(bin + " run " + FLOWRUN_SOURCE_DIR + "/graphs/rlhf.graph --seed 3 2>&1", &rc), "hint:"));
  CHECK_FALSE(has(run(bin + " convert --from hf a --to hf b --path x 2>&1", &rc), "hint:"));
  // every option it begins; an option given twice hinted once; chat and eval prompts decode greedily
  out = run(bin + " generate --top 5 --temprature 1 --temprature 2 2>&1", &rc);
  CHECK(has(out, "hint: --top: did you mean --top_k or --top_p?"));
  CHECK(out.find("--temprature: did you mean") == out.rfind("--temprature: did you mean"));
  CHECK(has(run(bin + " eval prompts --do_sample 2>&1", &rc), "hint: --do_sample: eval prompts decodes greedily"));
  CHECK(has(run(bin + " chat --do_sample 2>&1", &rc), "hint: --do_sample: sampling is on with --temperature > 0"));
  // TencentPretrain's LoRA flags on train-lm: where LoRA pretraining is (CLI11 said "not expected: 4 --lora_r")
  CHECK(has(run(bin + " train-lm --lora_r 4 2>&1", &rc), "hint: --lora_r: LoRA pretraining is graphs/pretrain.graph's zero_rank"));
}

TEST_CASE("generate prints the prompt as given, then the continuation") {
  // the prompt decoded from its ids lost Qwen2's <|im_end|> (the EOS, which decode drops) and kept <|im_start|>
  int rc = -1;
  const std::string prompt = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n";
  // (sh: the prompt's newlines through printf, its last one kept by an x taken off after)
  const auto out = run("p=\"$(printf '<|im_start|>user\\nhi<|im_end|>\\n<|im_start|>assistant\\nx')\"; " +
                           std::string(FLOWRUN_BIN) + " generate --model " + FLOWRUN_SOURCE_DIR +
                           "/tests/fixtures/hf_chat/qwen2 --prompt \"${p%x}\" --max_new_tokens 3 2>/dev/null",
                       &rc);
  CHECK(rc == 0);
  CHECK(out.rfind(prompt, 0) == 0);
  CHECK(out.size() > prompt.size() + 1);  // and what followed
  // a trailing space SentencePiece drops ("Hello " is "Hello") is not printed: the continuation brings its own
  const auto hello = run(std::string(FLOWRUN_BIN) + " generate --prompt 'Hello ' --temperature 0 --max_new_tokens 3 2>/dev/null", &rc);
  CHECK(rc == 0);
  CHECK(hello.rfind("Hello ", 0) == 0);
  CHECK(hello.rfind("Hello  ", 0) != 0);
}

TEST_CASE("flowrun FILE.graph --check checks the graph and its overrides and runs nothing") {
  const std::string bin = std::string(FLOWRUN_BIN) + " " + FLOWRUN_SOURCE_DIR + "/graphs/";
  int rc = -1;
  auto out = run(bin + "rlhf.graph --check 2>&1", &rc);
  CHECK(rc == 0);
  CHECK(has(out, "graphs/rlhf.graph: 10 nodes, 21 edges: the settings, edges and placement check out; nothing was run"));
  CHECK_FALSE(has(out, "[step 1 sft]"));
  out = run(bin + "grpo.graph --check" GRPO_DATA " --set node.generator.temperature=1e-9 2>&1", &rc);
  CHECK(rc == 2);
  CHECK(has(out, "temperature = 1e-09 is above 0 but below 1e-6"));
}

TEST_CASE("FLOWRUN_RUN_ID with a space is refused, naming it: the checkpoint lock took it while the run took a random id") {
  int rc = -1;
  const std::string out = run("FLOWRUN_RUN_ID='my run' " + std::string(FLOWRUN_BIN) + " " FLOWRUN_SOURCE_DIR
                              "/graphs/sft.graph --no-progress --set node.sft.steps=1 --set node.sft.output= "
                              "--set graph.checkpoint_dir= 2>&1",
                              &rc);
  CHECK(rc != 0);
  CHECK_MESSAGE(has(out, "FLOWRUN_RUN_ID 'my run' holds a space or a line break: give the processes of the run one word"),
                out);
  CHECK_FALSE(has(out, "[step 1 sft] step 1/1"));  // refused before anything trains
  run("FLOWRUN_RUN_ID=my_run " + std::string(FLOWRUN_BIN) + " " FLOWRUN_SOURCE_DIR
      "/graphs/sft.graph --no-progress --set node.sft.steps=1 --set node.sft.output= --set graph.checkpoint_dir= 2>&1",
      &rc);
  CHECK(rc == 0);
}
