// Minimal reader for NumPy .npy files (format version 1.0/2.0, little-endian
// '<f4', '<f8', '<i4', '<i8', C order), used for reference fixtures.
// Format: https://numpy.org/doc/stable/reference/generated/numpy.lib.format.html
#pragma once

#include <string>

#include "runtime/tensor/tensor.h"

namespace flowrun {

/// Load an .npy file as a CPU tensor (f8 is converted to f32, i8 to i64).
/// Throws std::runtime_error naming the file and what is wrong.
tensor load_npy(const std::string& path);

}  // namespace flowrun
