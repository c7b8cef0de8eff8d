#include "runtime/util/npy.h"

#include <cstring>
#include <fstream>
#include <regex>
#include <stdexcept>
#include <vector>

namespace flowrun {

tensor load_npy(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error(path + ": cannot open .npy file");
  char magic[8];
  f.read(magic, 8);
  if (!f || std::memcmp(magic, "\x93NUMPY", 6) != 0) throw std::runtime_error(path + ": not an .npy file (bad magic)");
  uint32_t hlen = 0;
  if (magic[6] == 1) {
    uint16_t h16;
    f.read(reinterpret_cast<char*>(&h16), 2);
    hlen = h16;
  } else {
    f.read(reinterpret_cast<char*>(&hlen), 4);
  }
  std::string header(hlen, '\0');
  f.read(header.data(), hlen);
  if (!f) throw std::runtime_error(path + ": truncated .npy header");
  std::smatch m;
  if (!std::regex_search(header, m, std::regex("'descr':\\s*'([<|>]?)([a-z])(\\d+)'")))
    throw std::runtime_error(path + ": .npy header has no descr: " + header);
  std::string kind = m[2].str();
  int width = std::stoi(m[3].str());
  if (m[1].str() == ">") throw std::runtime_error(path + ": big-endian .npy is not supported");
  if (header.find("'fortran_order': True") != std::string::npos)
    throw std::runtime_error(path + ": Fortran-order .npy is not supported");
  if (!std::regex_search(header, m, std::regex("'shape':\\s*\\(([^)]*)\\)")))
    throw std::runtime_error(path + ": .npy header has no shape: " + header);
  shape_t shape;
  std::string dims = m[1].str();
  std::regex num("\\d+");
  for (auto it = std::sregex_iterator(dims.begin(), dims.end(), num); it != std::sregex_iterator(); ++it)
    shape.push_back(std::stoll(it->str()));
  int64_t n = shape_numel(shape);
  auto read_all = [&](void* dst, size_t bytes) {
    f.read(static_cast<char*>(dst), static_cast<std::streamsize>(bytes));
    if (!f) throw std::runtime_error(path + ": truncated .npy data (expected " + std::to_string(bytes) + " bytes)");
  };
  if (kind == "f" && width == 4) {
    auto t = tensor::empty(shape, dtype::f32);
    read_all(t.raw(), t.nbytes());
    return t;
  }
  if (kind == "f" && width == 8) {
    std::vector<double> d(n);
    read_all(d.data(), n * 8);
    auto t = tensor::empty(shape, dtype::f32);
    for (int64_t i = 0; i < n; ++i) t.data<float>()[i] = static_cast<float>(d[i]);
    return t;
  }
  if (kind == "i" && width == 4) {
    auto t = tensor::empty(shape, dtype::i32);
    read_all(t.raw(), t.nbytes());
    return t;
  }
  if (kind == "i" && width == 8) {
    auto t = tensor::empty(shape, dtype::i64);
    read_all(t.raw(), t.nbytes());
    return t;
  }
  throw std::runtime_error(path + ": unsupported .npy dtype " + kind + std::to_string(width));
}

}  // namespace flowrun
