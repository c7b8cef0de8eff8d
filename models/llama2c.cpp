#include "models/llama2c.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <stdexcept>
#include <vector>

#include <fcntl.h>
#include <unistd.h>

namespace flowrun {

namespace {

constexpr uint32_t k_magic = 0x616b3432u;

// The stacked llama2.c tensors, in HF names, for layer l.
std::string layer_name(int64_t l, const char* what) {
  return "model.layers." + std::to_string(l) + "." + what;
}

struct reader {
  const std::string& path;
  const std::vector<char>& bytes;
  size_t pos;
  void take(tensor& dst) {
    size_t n = dst.nbytes();
    if (pos + n > bytes.size())
      throw std::runtime_error(path + ": truncated llama2.c file: need " + std::to_string(pos + n) +
                               " bytes for the weights, the file has " + std::to_string(bytes.size()));
    std::memcpy(dst.raw(), bytes.data() + pos, n);
    pos += n;
  }
  void skip(size_t n) {
    if (pos + n > bytes.size())
      throw std::runtime_error(path + ": truncated llama2.c file: need " + std::to_string(pos + n) +
                               " bytes, the file has " + std::to_string(bytes.size()));
    pos += n;
  }
};

}  // namespace

decoder load_llama2c(const std::string& path, device dev) {
  std::ifstream f(path, std::ios::binary | std::ios::ate);
  if (!f) throw std::runtime_error(path + ": cannot open llama2.c checkpoint");
  std::vector<char> bytes(static_cast<size_t>(f.tellg()));
  f.seekg(0);
  f.read(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (bytes.size() < 28) throw std::runtime_error(path + ": too small for a llama2.c header (" +
                                                  std::to_string(bytes.size()) + " bytes)");
  uint32_t magic;
  std::memcpy(&magic, bytes.data(), 4);
  int version = 0;
  int32_t h[7];
  bool shared = true;
  size_t pos = 28;
  if (magic == k_magic) {
    int32_t ver;
    std::memcpy(&ver, bytes.data() + 4, 4);
    if (ver != 1)
      throw std::runtime_error(path + ": llama2.c version " + std::to_string(ver) +
                               " is not supported (only 0 = legacy and 1 = fp32); version 2 is int8-quantized");
    if (bytes.size() < 256) throw std::runtime_error(path + ": truncated version-1 header");
    std::memcpy(h, bytes.data() + 8, sizeof h);
    shared = bytes[36] != 0;
    version = 1;
    pos = 256;
  } else {
    std::memcpy(h, bytes.data(), sizeof h);
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
  // The file's size against the header's before anything is allocated (a corrupt header must not ask for
  // gigabytes): the weights are num_parameters() floats (run.c's order holds exactly those), plus in version 0
  // freq_cis_real/imag, max_seq_len * head_dim / 2 floats each. validate() bounds the sizes: no overflow here.
  const uint64_t need = pos + static_cast<uint64_t>(c.num_parameters()) * sizeof(float) +
                        (version == 0 ? static_cast<uint64_t>(c.max_seq_len) * (c.head_dim() / 2) * 2 * sizeof(float) : 0);
  if (need > bytes.size())
    throw std::runtime_error(path + ": truncated llama2.c file: its header (" + c.summary() + ") needs " +
                             std::to_string(need) + " bytes, the file has " + std::to_string(bytes.size()));
  decoder m(c, device::cpu());
  const int64_t L = c.n_layers, hs = c.head_dim();
  reader r{path, bytes, pos};
  auto stacked = [&](const char* what) {
    for (int64_t l = 0; l < L; ++l) r.take(m.param(layer_name(l, what)));
  };
  if (version == 0) {
    r.take(m.param("model.embed_tokens.weight"));
    stacked("input_layernorm.weight");
    stacked("self_attn.q_proj.weight");
    stacked("self_attn.k_proj.weight");
    stacked("self_attn.v_proj.weight");
    stacked("self_attn.o_proj.weight");
    stacked("post_attention_layernorm.weight");
    stacked("mlp.gate_proj.weight");
    stacked("mlp.down_proj.weight");
    stacked("mlp.up_proj.weight");
    r.take(m.param("model.norm.weight"));
    r.skip(static_cast<size_t>(c.max_seq_len) * (hs / 2) * 2 * sizeof(float));  // freq_cis_real/imag
  } else {
    stacked("input_layernorm.weight");
    stacked("post_attention_layernorm.weight");
    r.take(m.param("model.norm.weight"));
    r.take(m.param("model.embed_tokens.weight"));
    stacked("self_attn.q_proj.weight");
    stacked("self_attn.k_proj.weight");
    stacked("self_attn.v_proj.weight");
    stacked("self_attn.o_proj.weight");
    stacked("mlp.gate_proj.weight");
    stacked("mlp.down_proj.weight");
    stacked("mlp.up_proj.weight");
  }
  if (!shared) r.take(m.param("lm_head.weight"));
  if (r.pos != bytes.size())
    throw std::runtime_error(path + ": " + std::to_string(bytes.size() - r.pos) +
                             " unexpected trailing bytes after the weights of " + c.summary() +
                             " (wrong header, or not a llama2.c file)");
  if (dev != device::cpu()) {
    decoder md(c, dev);
    md.w().flat.copy_from(m.w().flat);
    return md;
  }
  return m;
}

void save_llama2c(const decoder& model_in, const std::string& path, int version) {
  const auto& c = model_in.config();
  if (c.family != model_family::llama || c.rope != ops::rope_layout::adjacent || c.bias || !c.gated_mlp ||
      c.has_projection() || c.post_norm || c.qkv_bias || c.rope_scaling != rope_scaling_kind::none)
    throw std::runtime_error(path + ": only LLaMA-family models with adjacent-pair RoPE (no q/k/v biases, no RoPE "
                                    "scaling) can be written as llama2.c");
  if (version != 0 && version != 1) throw std::runtime_error(path + ": llama2.c version must be 0 or 1");
  auto& model = const_cast<decoder&>(model_in);
  std::vector<char> out;
  auto put = [&](const void* p, size_t n) {
    const char* b = static_cast<const char*>(p);
    out.insert(out.end(), b, b + n);
  };
  auto put_t = [&](const tensor& t) {
    auto h = t.to(device::cpu());
    put(h.raw(), h.nbytes());
  };
  int32_t h[7] = {int32_t(c.dim), int32_t(c.hidden_dim), int32_t(c.n_layers), int32_t(c.n_heads),
                  int32_t(c.n_kv_heads), int32_t(c.vocab_size), int32_t(c.max_seq_len)};
  const int64_t L = c.n_layers, hs = c.head_dim();
  auto stacked = [&](const char* what) {
    for (int64_t l = 0; l < L; ++l) put_t(model.param(layer_name(l, what)));
  };
  if (version == 0) {
    if (!c.tied_embeddings) h[5] = -h[5];
    put(h, sizeof h);
    put_t(model.param("model.embed_tokens.weight"));
    stacked("input_layernorm.weight");
    stacked("self_attn.q_proj.weight");
    stacked("self_attn.k_proj.weight");
    stacked("self_attn.v_proj.weight");
    stacked("self_attn.o_proj.weight");
    stacked("post_attention_layernorm.weight");
    stacked("mlp.gate_proj.weight");
    stacked("mlp.down_proj.weight");
    stacked("mlp.up_proj.weight");
    put_t(model.param("model.norm.weight"));
    // freq_cis_real, freq_cis_imag as run.c's legacy export wrote them
    std::vector<float> re(c.max_seq_len * (hs / 2)), im(re.size());
    for (int64_t p = 0; p < c.max_seq_len; ++p)
      for (int64_t i = 0; i < hs / 2; ++i) {
        double freq = 1.0 / std::pow(static_cast<double>(c.rope_theta), (2.0 * i) / hs);
        re[p * (hs / 2) + i] = static_cast<float>(std::cos(p * freq));
        im[p * (hs / 2) + i] = static_cast<float>(std::sin(p * freq));
      }
    put(re.data(), re.size() * 4);
    put(im.data(), im.size() * 4);
  } else {
    uint32_t magic = k_magic;
    int32_t ver = 1;
    put(&magic, 4);
    put(&ver, 4);
    put(h, sizeof h);
    uint8_t shared = c.tied_embeddings ? 1 : 0;
    put(&shared, 1);
    out.resize(256, 0);
    stacked("input_layernorm.weight");
    stacked("post_attention_layernorm.weight");
    put_t(model.param("model.norm.weight"));
    put_t(model.param("model.embed_tokens.weight"));
    stacked("self_attn.q_proj.weight");
    stacked("self_attn.k_proj.weight");
    stacked("self_attn.v_proj.weight");
    stacked("self_attn.o_proj.weight");
    stacked("mlp.gate_proj.weight");
    stacked("mlp.down_proj.weight");
    stacked("mlp.up_proj.weight");
  }
  if (!c.tied_embeddings) put_t(model.param("lm_head.weight"));
  std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) throw std::runtime_error(tmp + ": cannot create: " + std::strerror(errno));
  size_t done = 0;
  while (done < out.size()) {
    ssize_t w = ::write(fd, out.data() + done, out.size() - done);
    if (w <= 0) {
      ::close(fd);
      throw std::runtime_error(tmp + ": write failed: " + std::strerror(errno));
    }
    done += static_cast<size_t>(w);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) throw std::runtime_error(tmp + ": fsync/close failed");
  std::filesystem::rename(tmp, path);
}

}  // namespace flowrun
