#include "models/llama2c.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <stdexcept>
#include <vector>

#include <fmt/format.h>

namespace flowrun {

namespace {

constexpr uint32_t k_magic = 0x616b3432u;

// The stacked llama2.c tensors, in HF names, for layer l.
std::string layer_name(int64_t l, const char* what) {
  return "model.layers." + std::to_string(l) + "." + what;
}

// The tensors of a llama2.c file in the file's order, by their HF names (run.c's order for version 0,
// export.py version1_export's for version 1). "" stands for version 0's freq_cis_real/imag block, which
// flowrun does not keep (RoPE is computed) but the file holds. load_llama2c and save_llama2c both walk it.
std::vector<std::string> file_order(const model_config& c, int version) {
  std::vector<std::string> out;
  auto stacked = [&](const char* what) {
    for (int64_t l = 0; l < c.n_layers; ++l) out.push_back(layer_name(l, what));
  };
  if (version == 0) {
    out.push_back("model.embed_tokens.weight");
    stacked("input_layernorm.weight");
    stacked("self_attn.q_proj.weight");
    stacked("self_attn.k_proj.weight");
    stacked("self_attn.v_proj.weight");
    stacked("self_attn.o_proj.weight");
    stacked("post_attention_layernorm.weight");
    stacked("mlp.gate_proj.weight");
    stacked("mlp.down_proj.weight");
    stacked("mlp.up_proj.weight");
    out.push_back("model.norm.weight");
    out.push_back("");  // freq_cis_real, freq_cis_imag
  } else {
    stacked("input_layernorm.weight");
    stacked("post_attention_layernorm.weight");
    out.push_back("model.norm.weight");
    out.push_back("model.embed_tokens.weight");
    stacked("self_attn.q_proj.weight");
    stacked("self_attn.k_proj.weight");
    stacked("self_attn.v_proj.weight");
    stacked("self_attn.o_proj.weight");
    stacked("mlp.gate_proj.weight");
    stacked("mlp.down_proj.weight");
    stacked("mlp.up_proj.weight");
  }
  if (!c.tied_embeddings) out.push_back("lm_head.weight");
  return out;
}

// Version 0's freq_cis_real and freq_cis_imag: max_seq_len * head_dim / 2 floats each.
uint64_t freq_cis_bytes(const model_config& c) {
  return static_cast<uint64_t>(c.max_seq_len) * static_cast<uint64_t>(c.head_dim() / 2) * 2 * sizeof(float);
}

// The report before the first tensor: the tensors of `order` and their f32 bytes (freq_cis not counted).
tensor_progress progress_start(decoder& m, const std::vector<std::string>& order) {
  tensor_progress at;
  for (const auto& name : order) {
    if (name.empty()) continue;
    ++at.tensors_total;
    at.bytes_total += static_cast<int64_t>(m.param(name).nbytes());
  }
  return at;
}

void report(tensor_progress& at, const std::string& name, size_t bytes, const tensor_progress_fn& progress) {
  ++at.tensors_done;
  at.bytes_done += static_cast<int64_t>(bytes);
  at.name = name;
  if (progress) progress(at);
}

}  // namespace

namespace {

// A llama2.c file's header: its config (validated), version, and where the weights begin.
struct llama2c_header {
  model_config c;
  int version = 0;
  uint64_t pos = 28;
  uint64_t file_size = 0;
};

llama2c_header read_header(std::ifstream& f, const std::string& path) {
  llama2c_header out;
  f.seekg(0, std::ios::end);
  const uint64_t file_size = static_cast<uint64_t>(f.tellg());
  out.file_size = file_size;
  f.seekg(0);
  // The header: 28 bytes (version 0) or 256 (version 1); the weights are read tensor by tensor below.
  std::vector<char> head(static_cast<size_t>(std::min<uint64_t>(file_size, 256)));
  f.read(head.data(), static_cast<std::streamsize>(head.size()));
  if (head.size() < 28) throw std::runtime_error(path + ": too small for a llama2.c header (" +
                                                 std::to_string(head.size()) + " bytes)");
  uint32_t magic;
  std::memcpy(&magic, head.data(), 4);
  int version = 0;
  int32_t h[7];
  bool shared = true;
  uint64_t pos = 28;
  if (magic == k_magic) {
    int32_t ver;
    std::memcpy(&ver, head.data() + 4, 4);
    if (ver != 1)
      throw std::runtime_error(path + ": llama2.c version " + std::to_string(ver) +
                               " is not supported (only 0 = legacy and 1 = fp32); version 2 is int8-quantized");
    if (head.size() < 256) throw std::runtime_error(path + ": truncated version-1 header");
    std::memcpy(h, head.data() + 8, sizeof h);
    shared = head[36] != 0;
    version = 1;
    pos = 256;
  } else {
    std::memcpy(h, head.data(), sizeof h);
    shared = h[5] > 0;
    if (h[5] == std::numeric_limits<int32_t>::min())
      throw std::runtime_error(path + ": not a llama2.c checkpoint, or a corrupt header: vocab_size " +
                               std::to_string(h[5]));
    h[5] = std::abs(h[5]);
  }
  model_config c;
  c.dim = h[0];
  c.hidden_dim = h[1];
  c.n_layers = h[2];
  c.n_heads = h[3];
  c.n_kv_heads = h[4];
  c.vocab_size = h[5];
  c.max_seq_len = h[6];
  c.tied_embeddings = shared;
  c.rope = ops::rope_layout::adjacent;
  try {
    c.validate();
  } catch (const std::exception& e) {
    throw std::runtime_error(path + ": not a llama2.c checkpoint, or a corrupt header: " + e.what());
  }
  out.c = c;
  out.version = version;
  out.pos = pos;
  return out;
}

}  // namespace

model_config llama2c_config(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error(path + ": cannot open llama2.c checkpoint");
  return read_header(f, path).c;
}

decoder load_llama2c(const std::string& path, device dev, const tensor_progress_fn& progress) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error(path + ": cannot open llama2.c checkpoint");
  const llama2c_header hd = read_header(f, path);
  const model_config& c = hd.c;
  const int version = hd.version;
  const uint64_t pos = hd.pos, file_size = hd.file_size;
  // The file's size against the header's before anything is allocated (a corrupt header must not ask for
  // gigabytes): the weights are num_parameters() floats (run.c's order holds exactly those), plus in version 0
  // freq_cis_real/imag. validate() bounds the sizes: no overflow here.
  const uint64_t need = pos + static_cast<uint64_t>(c.num_parameters()) * sizeof(float) +
                        (version == 0 ? freq_cis_bytes(c) : 0);
  if (need > file_size)
    throw std::runtime_error(path + ": truncated llama2.c file: its header (" + c.summary() + ") needs " +
                             std::to_string(need) + " bytes, the file has " + std::to_string(file_size));
  if (need < file_size)
    throw std::runtime_error(path + ": " + std::to_string(file_size - need) +
                             " unexpected trailing bytes after the weights of " + c.summary() +
                             " (wrong header, or not a llama2.c file)");
  decoder m(c, device::cpu());
  const auto order = file_order(c, version);
  tensor_progress at = progress_start(m, order);
  if (progress) progress(at);
  f.seekg(static_cast<std::streamoff>(pos));
  for (const auto& name : order) {
    if (name.empty()) {  // version 0's freq_cis: not kept
      f.seekg(static_cast<std::streamoff>(freq_cis_bytes(c)), std::ios::cur);
      continue;
    }
    tensor& dst = m.param(name);
    f.read(static_cast<char*>(dst.raw()), static_cast<std::streamsize>(dst.nbytes()));
    if (static_cast<size_t>(f.gcount()) != dst.nbytes())
      throw std::runtime_error(path + ": read failed at " + name + " (the file changed while it was read?)");
    report(at, name, dst.nbytes(), progress);
  }
  if (dev != device::cpu()) {
    decoder md(c, dev);
    md.w().flat.copy_from(m.w().flat);
    return md;
  }
  return m;
}

void save_llama2c(const decoder& model_in, const std::string& path, int version, const tensor_progress_fn& progress) {
  const auto& c = model_in.config();
  if (c.family != model_family::llama || c.rope != ops::rope_layout::adjacent || c.bias || !c.gated_mlp ||
      c.has_projection() || c.post_norm || c.qkv_bias || c.rope_scaling != rope_scaling_kind::none)
    throw std::runtime_error(path + ": only LLaMA-family models with adjacent-pair RoPE (no q/k/v biases, no RoPE "
                                    "scaling) can be written as llama2.c");
  // llama2.c's header has no field for these: run.c and our loader take 10000 and 1e-5, so another value
  // written there would load as another model (Llama 3's theta 500000 gave other text, silently)
  if (c.rope_theta != 10000.0f || c.norm_eps != 1e-5f)
    throw std::runtime_error(fmt::format(
        "{}: the model has rope_theta {:g} and rms_norm_eps {:g}, and a llama2.c file holds neither (it means "
        "10000 and 1e-05, as run.c computes): written so, it would load as another model; keep it as an HF folder "
        "(flowrun convert --to hf)",
        path, c.rope_theta, c.norm_eps));
  if (version != 0 && version != 1) throw std::runtime_error(path + ": llama2.c version must be 0 or 1");
  auto& model = const_cast<decoder&>(model_in);
  int32_t h[7] = {int32_t(c.dim), int32_t(c.hidden_dim), int32_t(c.n_layers), int32_t(c.n_heads),
                  int32_t(c.n_kv_heads), int32_t(c.vocab_size), int32_t(c.max_seq_len)};
  atomic_file out(path);  // PATH.tmp, renamed over PATH by commit(); removed if anything below throws
  if (version == 0) {
    if (!c.tied_embeddings) h[5] = -h[5];
    out.write(h, sizeof h);
  } else {
    std::vector<char> header(256, 0);
    const int32_t ver = 1;
    std::memcpy(header.data(), &k_magic, 4);
    std::memcpy(header.data() + 4, &ver, 4);
    std::memcpy(header.data() + 8, h, sizeof h);
    header[36] = c.tied_embeddings ? 1 : 0;
    out.write(header.data(), header.size());
  }
  const auto order = file_order(c, version);
  tensor_progress at = progress_start(model, order);
  if (progress) progress(at);
  const int64_t hs = c.head_dim();
  for (const auto& name : order) {
    if (name.empty()) {
      // freq_cis_real, freq_cis_imag as run.c's legacy export wrote them
      std::vector<float> re(c.max_seq_len * (hs / 2)), im(re.size());
      for (int64_t p = 0; p < c.max_seq_len; ++p)
        for (int64_t i = 0; i < hs / 2; ++i) {
          double freq = 1.0 / std::pow(static_cast<double>(c.rope_theta), (2.0 * i) / hs);
          re[p * (hs / 2) + i] = static_cast<float>(std::cos(p * freq));
          im[p * (hs / 2) + i] = static_cast<float>(std::sin(p * freq));
        }
      out.write(re.data(), re.size() * 4);
      out.write(im.data(), im.size() * 4);
      continue;
    }
    const auto t = model.param(name).to(device::cpu());
    out.write(t.raw(), t.nbytes());
    report(at, name, t.nbytes(), progress);
  }
  out.commit();
}

}  // namespace flowrun
