// Hugging Face tokenizer.json (models/hf_tokenizer.cpp) against the `tokenizers` Python package:
// tests/fixtures/hftok/{llama3,qwen2,llama2,mistral} and cases.json were written by
// tests/fixtures/make_hftok_fixtures.py (tokenizers 0.23.3), which trained the vocabularies on the
// assets' text and recorded the ids and decoded texts the package gives.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "models/tokenizer.h"

using namespace flowrun;
namespace fs = std::filesystem;

namespace {

const fs::path k_dir = fs::path(FLOWRUN_FIXTURES_DIR) / "hftok";

nlohmann::json read(const fs::path& p) {
  std::ifstream f(p);
  REQUIRE_MESSAGE(f.good(), p.string());
  return nlohmann::json::parse(f);
}

// Every text's ids, ids with the post-processor, and decoded text equal the package's.
void check_against_tokenizers(const std::string& name) {
  const auto cases = read(k_dir / "cases.json");
  const auto& ref = cases["tokenizers"][name];
  auto tok = load_tokenizer((k_dir / name).string());  // the folder: tokenizer.json + tokenizer_config.json
  CHECK(tok->vocab_size() == ref["vocab_size"].get<int>());
  CHECK(tok->bos_id() == ref["bos_id"].get<int>());
  CHECK(tok->eos_id() == ref["eos_id"].get<int>());
  CHECK(tok->pad_id() == ref["pad_id"].get<int>());
  const auto prefix = ref["template_prefix"].get<std::vector<int32_t>>();
  const auto suffix = ref["template_suffix"].get<std::vector<int32_t>>();
  CHECK(tok->adds_bos() == !prefix.empty());
  std::vector<std::string> texts = cases["texts"].get<std::vector<std::string>>();
  for (auto& t : ref["extra_texts"]) texts.push_back(t.get<std::string>());
  REQUIRE(texts.size() == ref["ids"].size());
  int encoded = 0, decoded = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    const std::string& text = texts[i];
    const auto want = ref["ids"][i].get<std::vector<int32_t>>();
    INFO(name << " case " << i << ": \"" << text << "\"");
    const auto got = tok->encode(text);
    CHECK(got == want);
    encoded += got == want;
    std::vector<int32_t> special = prefix;
    special.insert(special.end(), want.begin(), want.end());
    special.insert(special.end(), suffix.begin(), suffix.end());
    CHECK(tok->encode(text, tok->adds_bos(), !suffix.empty()) == special);
    const std::string text_back = tok->decode(want);
    CHECK(text_back == ref["decoded"][i].get<std::string>());
    decoded += text_back == ref["decoded"][i].get<std::string>();
  }
  for (auto& c : ref["decode_cases"]) {
    INFO(name << " decode of " << c[0].dump());
    CHECK(tok->decode(c[0].get<std::vector<int32_t>>()) == c[1].get<std::string>());
  }
  MESSAGE(name << ": " << encoded << " of " << texts.size() << " texts encode to tokenizers' ids, " << decoded
               << " decode to its text");
  CHECK(encoded == static_cast<int>(texts.size()));
  CHECK(texts.size() >= 50);
}

// A copy of fixture `name` with `edit` applied to its tokenizer.json, in a fresh folder.
fs::path edited(const std::string& name, const std::string& tag, const std::function<void(nlohmann::json&)>& edit) {
  const fs::path dir = fs::temp_directory_path() / ("flowrun_test_hftok_" + std::to_string(::getpid()) + "_" + tag);
  fs::remove_all(dir);
  fs::create_directories(dir);
  auto j = read(k_dir / name / "tokenizer.json");
  edit(j);
  std::ofstream(dir / "tokenizer.json") << j.dump();
  return dir;
}

}  // namespace

TEST_CASE("hf tokenizer.json llama3 (byte-level BPE, Llama 3 regex, ignore_merges, BOS template): ids and text equal tokenizers'") {
  check_against_tokenizers("llama3");
}

TEST_CASE("hf tokenizer.json qwen2 (NFC, Qwen2 regex, non-special added tokens, no BOS): ids and text equal tokenizers'") {
  check_against_tokenizers("qwen2");
}

TEST_CASE("hf tokenizer.json llama2 (Prepend+Replace, byte fallback, lstrip/rstrip tokens, string merges): ids and text equal tokenizers'") {
  check_against_tokenizers("llama2");
}

TEST_CASE("hf tokenizer.json mistral (Digits + Metaspace first, Metaspace decoder): ids and text equal tokenizers'") {
  check_against_tokenizers("mistral");
}

TEST_CASE("hf tokenizer.json llama2 without byte fallback: unknown characters become <unk>, fused as fuse_unk says") {
  const auto ref = read(k_dir / "cases.json")["tokenizers"]["llama2"];
  for (bool fuse : {true, false}) {
    const fs::path dir = edited("llama2", fuse ? "unk_fused" : "unk", [&](nlohmann::json& j) {
      j["model"]["byte_fallback"] = false;
      j["model"]["fuse_unk"] = fuse;
    });
    auto tok = load_tokenizer(dir.string());
    int n = 0;
    for (auto& c : ref[fuse ? "unk_cases" : "unk_cases_unfused"]) {
      INFO("fuse_unk " << fuse << ": \"" << c[0].get<std::string>() << "\"");
      CHECK(tok->encode(c[0].get<std::string>()) == c[1].get<std::vector<int32_t>>());
      ++n;
    }
    CHECK(n >= 10);
    fs::remove_all(dir);
  }
}

// Found by fuzz_hf_tokenizer in CI (corpus hf_tokenizer/crash_unk_id_reused): an added token that reuses
// model.unk_token's id replaced its spelling, and encoding an unknown character then looked that token up in
// model.vocab: std::out_of_range, which ended the process. And two tokens of model.vocab with one id.
TEST_CASE("hf tokenizer.json: an added token reusing the unk id leaves <unk> spelled right, and vocab ids must be unique") {
  const fs::path dir = edited("llama2", "unk_id_reused", [&](nlohmann::json& j) {
    j["model"]["byte_fallback"] = false;
    const int unk = j["model"]["vocab"]["<unk>"].get<int>();
    j["added_tokens"].push_back({{"id", unk}, {"content", "<zzz>"}, {"single_word", false}, {"lstrip", false},
                                 {"rstrip", false}, {"normalized", false}, {"special", true}});
  });
  auto tok = load_tokenizer(dir.string());
  const auto ids = tok->encode("\xe4\xb8\xad", false, false);  // a CJK character the vocabulary cannot spell
  REQUIRE(!ids.empty());
  CHECK(ids.back() == read(k_dir / "llama2" / "tokenizer.json")["model"]["vocab"]["<unk>"].get<int>());
  fs::remove_all(dir);
  const fs::path dup = edited("llama2", "dup_id", [&](nlohmann::json& j) {
    j["model"]["vocab"]["<0s>"] = j["model"]["vocab"]["<unk>"];
  });
  CHECK_THROWS_WITH_AS(load_tokenizer(dup.string()),
                       doctest::Contains("each token of model.vocab needs an id of its own"), std::runtime_error);
  fs::remove_all(dup);
}

TEST_CASE("hf tokenizer.json: other pre-tokenizers, normalizers and decoders on the fixtures' vocabularies equal tokenizers'") {
  const auto cases = read(k_dir / "cases.json");
  int variants = 0;
  for (const auto& v : cases["variants"]) {
    const std::string name = v["name"];
    const fs::path dir = edited(v["base"], name, [&](nlohmann::json& j) {
      for (auto& [key, value] : v["set"].items()) j[key] = value;
    });
    auto tok = load_tokenizer(dir.string());
    REQUIRE(v["texts"].size() == v["ids"].size());
    for (size_t i = 0; i < v["texts"].size(); ++i) {
      const std::string text = v["texts"][i];
      const auto want = v["ids"][i].get<std::vector<int32_t>>();
      INFO("variant " << name << ": \"" << text << "\"");
      CHECK(tok->encode(text) == want);
      if (v.contains("decoded")) CHECK(tok->decode(want) == v["decoded"][i].get<std::string>());
    }
    ++variants;
    fs::remove_all(dir);
  }
  MESSAGE(variants << " variants checked");
  CHECK(variants >= 10);
}

TEST_CASE("hf tokenizer.json: random bytes encode to ids in range, random valid UTF-8 decodes back (llama3, llama2)") {
  // a fixed-seed xorshift: the same 400 strings on every run
  uint64_t state = 0x9e3779b97f4a7c15ULL;
  auto next = [&] {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return state;
  };
  // code points from the ranges the fixtures' texts use, and any byte
  const std::vector<std::pair<uint32_t, uint32_t>> ranges = {
      {0x20, 0x7e}, {0x09, 0x0d}, {0xa0, 0x17f}, {0x300, 0x36f}, {0x400, 0x4ff}, {0x600, 0x6ff},
      {0x900, 0x97f}, {0x3000, 0x303f}, {0x4e00, 0x4fff}, {0xac00, 0xad00}, {0x1f600, 0x1f64f}, {0x2000, 0x206f}};
  const std::vector<std::string> names = {"llama3", "qwen2", "llama2", "mistral"};
  std::vector<std::unique_ptr<tokenizer>> toks;
  for (auto& n : names) toks.push_back(load_tokenizer((k_dir / n).string()));
  int round_trips = 0;
  for (int i = 0; i < 400; ++i) {
    std::string text;
    const bool raw = i % 4 == 3;  // every fourth: arbitrary bytes, not necessarily UTF-8
    const int len = static_cast<int>(next() % 40);
    for (int k = 0; k < len; ++k) {
      if (raw) {
        text += static_cast<char>(next() & 0xff);
        continue;
      }
      const auto& r = ranges[next() % ranges.size()];
      uint32_t cp = r.first + static_cast<uint32_t>(next() % (r.second - r.first + 1));
      if (cp == 0x2581 || (cp >= 0x2028 && cp <= 0x202e) || (cp >= 0x2060 && cp <= 0x206f)) cp = ' ';
      // UTF-8 by hand (the test does not use the code under test to build its input)
      if (cp < 0x80) text += static_cast<char>(cp);
      else if (cp < 0x800) text += {static_cast<char>(0xc0 | (cp >> 6)), static_cast<char>(0x80 | (cp & 0x3f))};
      else if (cp < 0x10000)
        text += {static_cast<char>(0xe0 | (cp >> 12)), static_cast<char>(0x80 | ((cp >> 6) & 0x3f)),
                 static_cast<char>(0x80 | (cp & 0x3f))};
      else
        text += {static_cast<char>(0xf0 | (cp >> 18)), static_cast<char>(0x80 | ((cp >> 12) & 0x3f)),
                 static_cast<char>(0x80 | ((cp >> 6) & 0x3f)), static_cast<char>(0x80 | (cp & 0x3f))};
    }
    for (size_t t = 0; t < toks.size(); ++t) {
      INFO(names[t] << " string " << i << " (" << text.size() << " bytes)");
      const auto ids = toks[t]->encode(text);
      for (auto id : ids) REQUIRE((id >= 0 && id < toks[t]->vocab_size()));
      // byte-level without a normalizer (llama3) and Llama 2's Prepend/Replace + Strip give valid UTF-8 back as is
      if (!raw && (names[t] == "llama3" || names[t] == "llama2")) {
        CHECK(toks[t]->decode(ids) == text);
        ++round_trips;
      }
    }
  }
  MESSAGE(round_trips << " random texts decoded back exactly");
  CHECK(round_trips == 600);
}

TEST_CASE("hf tokenizer.json: load_tokenizer takes the file or its folder, folder_has_tokenizer sees it") {
  auto a = load_tokenizer((k_dir / "llama3" / "tokenizer.json").string());
  auto b = load_tokenizer((k_dir / "llama3").string());
  CHECK(a->encode("Hello world 12345") == b->encode("Hello world 12345"));
  CHECK(folder_has_tokenizer((k_dir / "llama3").string()));
  CHECK(!folder_has_tokenizer(k_dir.string()));
  // without tokenizer_config.json BOS is the template's leading token and there is no EOS or pad
  const fs::path bare = edited("llama3", "bare", [](nlohmann::json&) {});
  auto c = load_tokenizer(bare.string());
  CHECK(c->bos_id() == b->bos_id());
  CHECK(c->eos_id() == -1);
  CHECK(c->pad_id() == -1);
  fs::remove_all(bare);
}

TEST_CASE("hf tokenizer.json: what is not read is refused naming the file and the JSON path") {
  struct bad {
    const char* name;
    const char* fixture;
    std::function<void(nlohmann::json&)> edit;
    const char* message;
  };
  const std::vector<bad> cases = {
      {"unigram", "llama3", [](auto& j) { j["model"]["type"] = "Unigram"; },
       "model.type \"Unigram\" is not supported; supported: BPE"},
      {"wordpiece", "llama3", [](auto& j) { j["model"]["type"] = "WordPiece"; },
       "model.type \"WordPiece\" is not supported"},
      {"whitespace", "llama3", [](auto& j) { j["pre_tokenizer"]["pretokenizers"][1]["type"] = "Whitespace"; },
       "pre_tokenizer.pretokenizers[1].type \"Whitespace\" is not supported; supported: Sequence, Split, ByteLevel, "
       "Metaspace, Digits"},
      {"lowercase", "qwen2", [](auto& j) { j["normalizer"] = {{"type", "Lowercase"}}; },
       "normalizer.type \"Lowercase\" is not supported; supported: Sequence, Prepend, Replace, NFC"},
      {"strip_norm", "llama2", [](auto& j) { j["normalizer"]["normalizers"][1]["type"] = "Strip"; },
       "normalizer.normalizers[1].type \"Strip\" is not supported"},
      {"wordpiece_dec", "llama2", [](auto& j) { j["decoder"]["decoders"][2] = {{"type", "WordPiece"}}; },
       "decoder.decoders[2].type \"WordPiece\" is not supported"},
      {"roberta", "llama3", [](auto& j) { j["post_processor"]["processors"][1] = {{"type", "RobertaProcessing"}}; },
       "post_processor.processors[1].type \"RobertaProcessing\" is not supported"},
      {"behavior", "llama3", [](auto& j) { j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Mixed"; },
       "pre_tokenizer.pretokenizers[0].behavior \"Mixed\" is not supported"},
      {"invert", "qwen2", [](auto& j) { j["pre_tokenizer"]["pretokenizers"][0]["invert"] = true; },
       "pre_tokenizer.pretokenizers[0].invert true is not supported"},
      {"regex", "llama3", [](auto& j) { j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(\\p{L}+"; },
       "pre_tokenizer.pretokenizers[0].pattern.Regex regex \"(\\p{L}+\" does not compile"},
      {"merge_vocab", "llama3", [](auto& j) { j["model"]["merges"][5] = {"Ġ", "zz"}; },
       "model.merges[5] \"zz\" is not in model.vocab"},
      {"merge_string", "llama2", [](auto& j) { j["model"]["merges"][3] = "nospace"; },
       "model.merges[3] must be two tokens separated by one space"},
      {"dropout", "llama2", [](auto& j) { j["model"]["dropout"] = 0.1; }, "model.dropout is 0.1"},
      {"single_word", "qwen2", [](auto& j) { j["added_tokens"][3]["single_word"] = true; },
       "added_tokens[3].single_word true is not supported"},
      {"unk", "llama2", [](auto& j) { j["model"]["unk_token"] = "<nope>"; },
       "model.unk_token \"<nope>\" is not in model.vocab"},
      {"template", "llama2", [](auto& j) { j["post_processor"]["single"][0]["SpecialToken"]["id"] = "<bos>"; },
       "post_processor.special_tokens[\"<bos>\"] is missing"},
      {"template_id", "llama2", [](auto& j) { j["post_processor"]["special_tokens"]["<s>"]["ids"] = {5000}; },
       "post_processor puts id 5000 before the text; it is not in the vocabulary"},
      {"config_json", "llama3", [](auto& j) { j["added_tokens"][0]["id"] = 1LL << 40; },
       "added_tokens[0].id id 1099511627776 of \"<|begin_of_text|>\" is out of range"},
      {"padding", "qwen2", [](auto& j) { j["padding"] = {{"strategy", "BatchLongest"}}; }, "padding is set"},
  };
  for (const auto& c : cases) {
    const fs::path dir = edited(c.fixture, c.name, c.edit);
    const std::string file = (dir / "tokenizer.json").string();
    INFO("case " << c.name);
    CHECK_THROWS_WITH_AS(load_tokenizer(dir.string()), doctest::Contains((file + ": " + c.message).c_str()), std::runtime_error);
    fs::remove_all(dir);
  }
}

TEST_CASE("hf tokenizer.json: bad tokenizer_config.json and unspellable text are refused naming the file") {
  // bos_token naming a token the tokenizer lacks
  const fs::path dir = edited("llama2", "config", [](nlohmann::json&) {});
  std::ofstream(dir / "tokenizer_config.json") << R"({"bos_token": "<start>"})";
  CHECK_THROWS_WITH_AS(load_tokenizer(dir.string()),
                       doctest::Contains(((dir / "tokenizer_config.json").string() + ": bos_token \"<start>\" is not in").c_str()),
                       std::runtime_error);
  fs::remove_all(dir);
  // without byte fallback or unk, a character outside the vocabulary cannot be encoded
  const fs::path nofb = edited("llama2", "nofallback", [](nlohmann::json& j) {
    j["model"]["byte_fallback"] = false;
    j["model"]["unk_token"] = nullptr;
  });
  auto tok = load_tokenizer(nofb.string());
  CHECK(!tok->encode("the cat").empty());
  CHECK_THROWS_WITH_AS(tok->encode("the 中 cat"), doctest::Contains(((nofb / "tokenizer.json").string() + ": \"中\"").c_str()),
                       std::runtime_error);
  fs::remove_all(nofb);
  CHECK_THROWS_WITH_AS(load_tokenizer("/nonexistent/tokenizer.json"), doctest::Contains("/nonexistent/tokenizer.json"),
                       std::runtime_error);
}
