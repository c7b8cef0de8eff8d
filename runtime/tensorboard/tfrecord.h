// TFRecord framing, the container of TensorBoard's event files (and of TensorFlow's
// .tfrecord files). Each record is
//
//   uint64 length                      little-endian, the data's size in bytes
//   uint32 masked_crc32c(length)       of those 8 bytes
//   byte   data[length]
//   uint32 masked_crc32c(data)
//
// Source: tensorflow/core/lib/io/record_writer.h (the layout) and
// tensorflow/core/lib/hash/crc32c.h (Mask: rotate right by 15 bits, add 0xa282ead8), the
// same as TensorBoard's reader (tensorboard/compat/tensorflow_stub/pywrap_tensorflow.py).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace flowrun::tensorboard {

/// CRC-32C (Castagnoli: polynomial 0x1EDC6F41, reflected, initial value and final xor
/// 0xFFFFFFFF) of `bytes`, by Boost.CRC. crc32c("123456789") = 0xE3069283 (the check value).
std::uint32_t crc32c(std::string_view bytes);

/// TFRecord's masked CRC: ((crc >> 15) | (crc << 17)) + 0xa282ead8 (mod 2^32), where crc
/// is crc32c(bytes). Masking keeps a CRC of data that holds CRCs from being trivial.
std::uint32_t masked_crc32c(std::string_view bytes);

/// `data` framed as one TFRecord (the 16 + data.size() bytes above).
std::string frame_record(std::string_view data);

}  // namespace flowrun::tensorboard
