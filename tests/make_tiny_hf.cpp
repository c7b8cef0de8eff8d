// make_tiny_hf --outputs MODEL: prints, as JSON, the probe ids (2 x 8) and what flowrun's
// load_model(MODEL) computes on them: "logits" (2, 8, V), or "values" (2, 8) for a value head;
// for a folder with a tokenizer, also a probe "text" and flowrun's "text_ids" for it (no BOS/EOS)
// (for tools/hf_transformers_check.py, which compares them with transformers').
//
// make_tiny_hf OUT_DIR: tiny random Hugging Face folders of the three families flowrun
// trains, each with its tokenizer, for tests/hf_trainers_small.sh (no PyTorch needed).
//
// It reuses the fixtures tests/fixtures/make_hf_fixtures.py made with transformers:
//   OUT_DIR/opt    tests/fixtures/hf/opt as is: transformers' OPTForCausalLM weights
//                  (2 layers, hidden 32, 304 embedding rows) with its OPT byte-level
//                  BPE (301 tokens: vocab.json, merges.txt, special_tokens_map.json,
//                  tokenizer_config.json)
//   OUT_DIR/gpt2   tests/fixtures/hf/gpt2/config.json (transformers' GPT2Config) with
//                  vocab_size set to the GPT-2-style BPE of tests/fixtures/bpe (400
//                  tokens, <|endoftext|> as BOS and EOS), random weights
//   OUT_DIR/llama  tests/fixtures/hf/llama/config.json (LlamaConfig, GQA 4/2 heads,
//                  untied lm_head) with vocab_size 512 for stories260K's SentencePiece
//                  tok512.model (from the assets, as tokenizer.model), random weights
// The committed GPT-2 and LLaMA fixtures have 100 and 96 embedding rows, too few for a
// tokenizer that covers text; hence the wider random models. Random weights are
// decoder::init_random with a fixed seed, written by save_hf (which test_hf checks
// against transformers' tensor names and logits).
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>

#include <nlohmann/json.hpp>

#include "models/checkpoint.h"
#include "models/hf.h"
#include "models/tokenizer.h"
#include "runtime/util/assets.h"

using namespace flowrun;
namespace fs = std::filesystem;

namespace {

const fs::path k_fixtures = FLOWRUN_FIXTURES_DIR;

void random_folder(const std::string& family, const fs::path& tok_path, const fs::path& out, uint64_t seed) {
  std::ifstream f(k_fixtures / "hf" / family / "config.json");
  auto j = nlohmann::json::parse(f);
  auto tok = load_tokenizer(tok_path.string());
  j["vocab_size"] = tok->vocab_size();
  model_config c = hf_config_from_json(j, (k_fixtures / "hf" / family / "config.json").string());
  c.real_vocab_size = tok->vocab_size();
  decoder m(c);
  m.init_random(seed);
  nlohmann::json extra = nlohmann::json::object();
  if (tok->bos_id() >= 0) extra["bos_token_id"] = tok->bos_id();
  if (tok->eos_id() >= 0) extra["eos_token_id"] = tok->eos_id();
  if (tok->pad_id() >= 0) extra["pad_token_id"] = tok->pad_id();
  save_hf(m, out.string(), dtype::f32, 0, extra);
  copy_tokenizer_files(tok_path.string(), out.string());
}

int print_outputs(const std::string& path) {
  decoder m = load_model(path);
  const int64_t B = 2, T = 8;
  std::vector<int32_t> ids(static_cast<size_t>(B * T));
  for (size_t i = 0; i < ids.size(); ++i)
    ids[i] = static_cast<int32_t>((i * 37 + 11) % static_cast<size_t>(m.config().vocab_limit()));
  activations a;
  m.forward(a, tensor::from_ints({B, T}, ids), tensor{});
  nlohmann::json j;
  j["input_ids"] = {std::vector<int32_t>(ids.begin(), ids.begin() + T), std::vector<int32_t>(ids.begin() + T, ids.end())};
  if (m.has_value_head()) j["values"] = a.values.to_floats();
  else j["logits"] = a.logits.to_floats();
  const fs::path dir(path);
  if (fs::is_directory(dir) && (fs::exists(dir / "tokenizer.model") || fs::exists(dir / "vocab.json"))) {
    // single spaces: a SentencePiece model trained with remove_extra_whitespaces (tok512) collapses runs of
    // spaces, which transformers' LlamaTokenizer keeps (models/tokenizer.h, write_sentencepiece_tokenizer_config)
    const std::string text = "Human: Once upon a time, there was a little cat named Tom.\n\nAssistant: It's 3 o'clock!";
    j["text"] = text;
    j["text_ids"] = load_tokenizer(path)->encode(text, false, false);
  }
  std::cout << j.dump() << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 3 && std::string(argv[1]) == "--outputs") {
    try {
      return print_outputs(argv[2]);
    } catch (const std::exception& e) {
      std::cerr << "make_tiny_hf: " << e.what() << "\n";
      return 1;
    }
  }
  if (argc != 2 || argv[1][0] == '-') {  // --help and any other option: never a folder named so
    std::cerr << "usage: make_tiny_hf OUT_DIR | make_tiny_hf --outputs MODEL\n";
    return argc == 2 && (std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h") ? 0 : 2;
  }
  try {
    const fs::path out = argv[1];
    fs::create_directories(out / "opt");
    for (const auto& e : fs::directory_iterator(k_fixtures / "hf" / "opt"))
      if (e.path().filename() != "expected.json")
        fs::copy_file(e.path(), out / "opt" / e.path().filename(), fs::copy_options::overwrite_existing);
    random_folder("gpt2", k_fixtures / "bpe" / "vocab.json", out / "gpt2", 7);
    random_folder("llama", asset_path("model/stories260K/tok512.model"), out / "llama", 11);
    std::cout << "make_tiny_hf: wrote " << (out / "opt").string() << ", " << (out / "gpt2").string() << ", "
              << (out / "llama").string() << "\n";
  } catch (const std::exception& e) {
    std::cerr << "make_tiny_hf: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
