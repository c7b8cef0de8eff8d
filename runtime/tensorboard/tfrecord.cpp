#include "runtime/tensorboard/tfrecord.h"

#include <boost/crc.hpp>

namespace flowrun::tensorboard {

namespace {

void put_le(std::string& out, std::uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xffu));
}

}  // namespace

std::uint32_t crc32c(std::string_view bytes) {
  // width, polynomial, initial remainder, final xor, reflect input, reflect remainder
  boost::crc_optimal<32, 0x1EDC6F41u, 0xFFFFFFFFu, 0xFFFFFFFFu, true, true> crc;
  crc.process_bytes(bytes.data(), bytes.size());
  return crc.checksum();
}

std::uint32_t masked_crc32c(std::string_view bytes) {
  const std::uint32_t c = crc32c(bytes);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

std::string frame_record(std::string_view data) {
  std::string out;
  out.reserve(data.size() + 16);
  put_le(out, data.size(), 8);
  put_le(out, masked_crc32c(out), 4);
  out.append(data);
  put_le(out, masked_crc32c(data), 4);
  return out;
}

}  // namespace flowrun::tensorboard
