// tok512 through the SentencePiece library against ref/tokenizer_cases.json.
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>
#include <unistd.h>

#include "models/tokenizer.h"
#include "test_util.h"

using namespace flowrun;

TEST_CASE("tok512: ids equal the reference for every case") {
  auto ref = test::load_json_asset("ref/tokenizer_cases.json");
  auto& t512 = ref["tokenizers"]["tok512"];
  auto tok = load_tokenizer(asset_path(t512["model"].get<std::string>()).string());
  CHECK(tok->vocab_size() == t512["vocab_size"].get<int>());
  CHECK(tok->bos_id() == t512["bos_id"].get<int>());
  CHECK(tok->eos_id() == t512["eos_id"].get<int>());
  CHECK(tok->pad_id() == t512["pad_id"].get<int>());
  int n = 0;
  for (auto& c : t512["cases"]) {
    std::string text = c["text"];
    auto want = c["spm_ids"].get<std::vector<int32_t>>();
    INFO("case: '" << text << "'");
    CHECK(tok->encode(text) == want);
    auto pieces = c["spm_pieces"].get<std::vector<std::string>>();
    for (size_t i = 0; i < want.size() && i < pieces.size(); ++i) CHECK(tok->piece(want[i]) == pieces[i]);
    if (c.contains("decode_roundtrip")) CHECK(tok->decode(want) == c["decode_roundtrip"].get<std::string>());
    auto with_bos = tok->encode(text, true);
    REQUIRE(!with_bos.empty());
    CHECK(with_bos.front() == tok->bos_id());
    ++n;
  }
  MESSAGE(n << " tokenizer cases checked");
  CHECK(n >= 15);
}

TEST_CASE("a missing tokenizer file names the file") {
  CHECK_THROWS_WITH_AS(load_tokenizer("/nonexistent/tok.model"), doctest::Contains("/nonexistent/tok.model"),
                       std::runtime_error);
  CHECK_THROWS_WITH_AS(load_tokenizer("vocab.txt"), doctest::Contains("SentencePiece"), std::runtime_error);
}

// A SentencePiece tokenizer in a Hugging Face folder (tokenizer.model + tokenizer_config.json, what
// `flowrun convert --to hf` and make_tiny_hf write): the special tokens in a text are their ids, each text
// piece between them encoded on its own. The expected ids are transformers 5.25.0's
// AutoTokenizer.from_pretrained(folder).encode(text, add_special_tokens=False) on tok512 with that
// tokenizer_config.json (legacy true, and the same with "legacy": false). Without the split, a chat
// template's "<s>[INST] ..." gave the characters '<', 's', '>' and no BOS.
TEST_CASE("tok512 in an HF folder: special tokens in the text are their ids, as transformers' LlamaTokenizer") {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("flowrun_test_tok_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string model = asset_path("model/stories260K/tok512.model").string();
  fs::copy_file(model, dir / "tokenizer.model");
  write_sentencepiece_tokenizer_config(model, (dir / "tokenizer_config.json").string());
  const std::string chat = "<s>[INST] Hi [/INST] Hello. </s><s>[INST] Bye";
  struct c {
    std::string text;
    std::vector<int32_t> legacy, non_legacy;
  };
  const std::vector<c> cases = {
      {chat,
       {1, 410, 508, 442, 458, 437, 434, 509, 320, 417, 410, 508, 492, 442, 458, 437, 434, 509, 346, 306, 414, 426, 410, 2,
        1, 410, 508, 442, 458, 437, 434, 509, 368, 422, 411},
       {1, 508, 442, 458, 437, 434, 509, 320, 417, 410, 508, 492, 442, 458, 437, 434, 509, 346, 306, 414, 426, 410, 2, 1,
        508, 442, 458, 437, 434, 509, 368, 422, 411}},
      {"Hi<s>there", {320, 417, 1, 383}, {320, 417, 1, 413, 260, 276}},
      {"<unk>x", {0, 410, 444}, {0, 444}},
      {"x<s> y", {410, 444, 1, 348}, {410, 444, 1, 348}},
      {"<s>", {1}, {1}},
      {"a </s> b", {261, 410, 2, 268}, {261, 410, 2, 268}},
      {" <s>  x", {410, 1, 410, 410, 444}, {410, 1, 410, 410, 444}},
      // every space kept, as transformers does (SentencePiece's remove_extra_whitespaces, tok512's setting, is off)
      {" y", {348}, {348}},
      {"a  b", {261, 410, 268}, {261, 410, 268}},
      {" Hello. ", {346, 306, 414, 426, 410}, {346, 306, 414, 426, 410}},
      {"  two", {410, 259, 424, 414}, {410, 259, 424, 414}},
      {"x\n\ty", {410, 444, 13, 12, 422}, {410, 444, 13, 12, 422}},
      {" ", {410}, {410}},
      {"", {}, {}},
  };
  {
    auto tok = load_tokenizer(dir.string());
    for (const auto& x : cases) {
      INFO("legacy: '" << x.text << "'");
      CHECK(tok->encode(x.text) == x.legacy);
    }
    CHECK(tok->encode("Hi", true) == std::vector<int32_t>{1, 320, 417});  // add_bos as before
    CHECK(tok->adds_bos());  // LlamaTokenizer's add_bos_token, true by default
  }
  {
    std::ifstream in(dir / "tokenizer_config.json");
    auto cfg = nlohmann::json::parse(in);
    cfg["legacy"] = false;
    std::ofstream(dir / "tokenizer_config.json") << cfg.dump(1);
  }
  {
    auto tok = load_tokenizer((dir / "tokenizer.model").string());  // the file itself: its folder's settings too
    for (const auto& x : cases) {
      INFO("legacy false: '" << x.text << "'");
      CHECK(tok->encode(x.text) == x.non_legacy);
    }
  }
  {  // "add_bos_token": false (transformers then encodes a prompt without BOS; generate and the DS-Chat data follow)
    std::ifstream in(dir / "tokenizer_config.json");
    auto cfg = nlohmann::json::parse(in);
    cfg["add_bos_token"] = false;
    std::ofstream(dir / "tokenizer_config.json") << cfg.dump(1);
  }
  CHECK(!load_tokenizer(dir.string())->adds_bos());
  // the bare .model (llama2.c's tokenizer, no tokenizer_config.json beside it): SentencePiece's own encoding
  auto bare = load_tokenizer(model);
  CHECK(bare->adds_bos());  // llama2.c's run.c puts BOS before every prompt
  std::vector<int32_t> plain = bare->encode("<s>x");
  CHECK(std::find(plain.begin(), plain.end(), 1) == plain.end());
  fs::remove_all(dir);
}
