// tok512 through the SentencePiece library against ref/tokenizer_cases.json.
#include <doctest/doctest.h>

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
