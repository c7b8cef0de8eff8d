# Third-party packages, all from Debian (tools/setup.sh installs them).
find_package(Threads REQUIRED)
find_package(OpenMP REQUIRED COMPONENTS CXX)
find_package(PkgConfig REQUIRED)

# OpenBLAS, OpenMP variant (libopenblas-openmp-dev): sgemm for CPU matmuls.
find_path(OPENBLAS_INCLUDE_DIR cblas.h
  PATHS /usr/include/x86_64-linux-gnu/openblas-openmp /usr/include/aarch64-linux-gnu/openblas-openmp
        /usr/include/openblas NO_DEFAULT_PATH)
find_path(OPENBLAS_INCLUDE_DIR cblas.h)
find_library(OPENBLAS_LIB NAMES openblas
  PATHS /usr/lib/x86_64-linux-gnu/openblas-openmp /usr/lib/aarch64-linux-gnu/openblas-openmp NO_DEFAULT_PATH)
find_library(OPENBLAS_LIB NAMES openblas)
if(NOT OPENBLAS_INCLUDE_DIR OR NOT OPENBLAS_LIB)
  message(FATAL_ERROR "OpenBLAS not found: run tools/setup.sh (apt-get install libopenblas-openmp-dev)")
endif()
add_library(flowrun_openblas INTERFACE)
target_include_directories(flowrun_openblas INTERFACE ${OPENBLAS_INCLUDE_DIR})
if(FLOWRUN_FUZZ)
  # The fuzz build (tests/fuzz) compiles without -fopenmp: its kernels run on one thread (the pragmas are
  # ignored), and clang 16 refuses OpenMP code in which a lambda captures a structured binding. omp.h comes
  # with clang; the runtime is linked for the omp_* calls.
  target_link_libraries(flowrun_openblas INTERFACE ${OPENBLAS_LIB} ${OpenMP_CXX_LIBRARIES})
  target_compile_options(flowrun_openblas INTERFACE -Wno-unknown-pragmas)
else()
  target_link_libraries(flowrun_openblas INTERFACE ${OPENBLAS_LIB} OpenMP::OpenMP_CXX)
endif()

# The CPU backend's GEMM library (runtime/kernels/cpu/gemm.h), chosen by measurement
# (bench/bench_gemm.cpp, docs/performance.md). AUTO: oneDNN (libdnnl-dev) when found
# (with BLIS beside it for CPUs without AVX-512, when libblis-openmp-dev is found), else OpenBLAS. oneDNN picks its AVX-512 kernels from CPUID feature bits; Debian's
# OpenBLAS 0.3.21 runs its Prescott kernels on CPUs it does not know. `blis` links
# BLIS's static library (libblis-openmp-dev) to select its skx kernels in code.
# The target keeps the name flowrun_openblas (runtime/CMakeLists.txt links it).
set(FLOWRUN_GEMM AUTO CACHE STRING "CPU GEMM library: AUTO, onednn, blis or openblas")
set_property(CACHE FLOWRUN_GEMM PROPERTY STRINGS AUTO onednn blis openblas)
find_path(DNNL_INCLUDE_DIR oneapi/dnnl/dnnl.h)
find_library(DNNL_LIB NAMES dnnl)
find_path(BLIS_INCLUDE_DIR blis.h PATHS /usr/include/x86_64-linux-gnu/blis-openmp NO_DEFAULT_PATH)
find_library(BLIS_STATIC_LIB NAMES libblis.a PATHS /usr/lib/x86_64-linux-gnu/blis-openmp NO_DEFAULT_PATH)
set(FLOWRUN_GEMM_LIB openblas)
set(FLOWRUN_HAVE_BLIS OFF)  # BLIS linked (FLOWRUN_GEMM_BLIS): the GEMM split of gemm.h can run (tests/CMakeLists.txt)
# ARM64: AUTO takes OpenBLAS (its NEON/SVE kernels per core type, chosen at run time): oneDNN's dnnl_sgemm
# there is its unoptimised reference loop unless oneDNN was built against the Arm Compute Library or a
# vendor BLAS, and Debian's is not (ARM-software/Tool-Solutions issue 168, answered by Arm's oneDNN team).
set(FLOWRUN_ARM64 OFF)
if(CMAKE_SYSTEM_PROCESSOR MATCHES "^(aarch64|arm64|ARM64)$")
  set(FLOWRUN_ARM64 ON)
endif()
if(FLOWRUN_GEMM STREQUAL "onednn" OR (FLOWRUN_GEMM STREQUAL "AUTO" AND NOT FLOWRUN_ARM64 AND DNNL_INCLUDE_DIR AND DNNL_LIB))
  if(NOT DNNL_INCLUDE_DIR OR NOT DNNL_LIB)
    message(FATAL_ERROR "FLOWRUN_GEMM=onednn but oneDNN was not found: run tools/setup.sh (apt-get install libdnnl-dev)")
  endif()
  set(FLOWRUN_GEMM_LIB onednn)
  target_include_directories(flowrun_openblas INTERFACE ${DNNL_INCLUDE_DIR})
  target_link_libraries(flowrun_openblas INTERFACE ${DNNL_LIB})
  target_compile_definitions(flowrun_openblas INTERFACE FLOWRUN_GEMM_DNNL=1)
  # AUTO with BLIS installed too: oneDNN on AVX-512 CPUs, BLIS on the others, chosen at run time
  # (gemm.h: oneDNN's AVX2 sgemm gives a row different bits for different M). BLIS's include folder
  # goes after OpenBLAS's (its cblas.h must not shadow OpenBLAS's), its static library after
  # OpenBLAS on the link line (OpenBLAS keeps the BLAS names).
  if(FLOWRUN_GEMM STREQUAL "AUTO" AND BLIS_INCLUDE_DIR AND BLIS_STATIC_LIB)
    set(FLOWRUN_GEMM_LIB "onednn (AVX-512) / blis (others)")
    target_include_directories(flowrun_openblas INTERFACE ${BLIS_INCLUDE_DIR})
    target_link_libraries(flowrun_openblas INTERFACE ${BLIS_STATIC_LIB} m)
    target_compile_definitions(flowrun_openblas INTERFACE FLOWRUN_GEMM_BLIS=1)
    set(FLOWRUN_HAVE_BLIS ON)
  endif()
elseif(FLOWRUN_GEMM STREQUAL "blis")
  if(NOT BLIS_INCLUDE_DIR OR NOT BLIS_STATIC_LIB)
    message(FATAL_ERROR "FLOWRUN_GEMM=blis but BLIS was not found: apt-get install libblis-openmp-dev")
  endif()
  set(FLOWRUN_GEMM_LIB blis)
  target_include_directories(flowrun_openblas BEFORE INTERFACE ${BLIS_INCLUDE_DIR})
  target_link_libraries(flowrun_openblas INTERFACE ${BLIS_STATIC_LIB} m)
  target_compile_definitions(flowrun_openblas INTERFACE FLOWRUN_GEMM_BLIS=1)
  set(FLOWRUN_HAVE_BLIS ON)
endif()
message(STATUS "flowrun: CPU GEMM library ${FLOWRUN_GEMM_LIB} (FLOWRUN_GEMM=${FLOWRUN_GEMM})")

# CAF 0.17 (libcaf-dev ships no CMake config: find the pieces by hand).
find_path(CAF_INCLUDE_DIR caf/all.hpp)
find_library(CAF_CORE_LIB caf_core)
find_library(CAF_IO_LIB caf_io)
if(NOT CAF_INCLUDE_DIR OR NOT CAF_CORE_LIB OR NOT CAF_IO_LIB)
  message(FATAL_ERROR "CAF not found: run tools/setup.sh (apt-get install libcaf-dev)")
endif()
add_library(flowrun_caf INTERFACE)
target_include_directories(flowrun_caf INTERFACE ${CAF_INCLUDE_DIR})
target_link_libraries(flowrun_caf INTERFACE ${CAF_IO_LIB} ${CAF_CORE_LIB} Threads::Threads)

# Google Highway (libhwy-dev): the CPU backend's vector kernels, one source per kernel for every
# instruction set, the path chosen at run time (runtime/kernels/cpu/simd_kernels.cpp).
pkg_check_modules(HWY REQUIRED IMPORTED_TARGET libhwy)
pkg_check_modules(SENTENCEPIECE REQUIRED IMPORTED_TARGET sentencepiece)
# ICU (libicu-dev): Unicode character classes for the GPT-2 BPE tokenizer.
pkg_check_modules(ICU_UC REQUIRED IMPORTED_TARGET icu-uc)
# PCRE2 (libpcre2-dev): regexes of Hugging Face tokenizer.json pre-tokenizers (models/hf_tokenizer.cpp).
pkg_check_modules(PCRE2 REQUIRED IMPORTED_TARGET libpcre2-8)
find_package(spdlog REQUIRED)
find_package(doctest REQUIRED)
find_package(tomlplusplus REQUIRED)
find_package(nlohmann_json REQUIRED)
# zlib (zlib1g-dev): reading .jsonl.gz datasets.
find_package(ZLIB REQUIRED)
find_package(CLI11 REQUIRED)
find_package(msgpack-cxx QUIET)
if(TARGET msgpack-cxx)
  set(FLOWRUN_MSGPACK msgpack-cxx)
else()
  find_package(msgpack REQUIRED)
  set(FLOWRUN_MSGPACK msgpackc-cxx)
endif()
find_path(HTTPLIB_INCLUDE_DIR httplib.h REQUIRED)
# Debian builds cpp-httplib into libcpp-httplib; its pkg-config file carries the feature
# macros the library was compiled with (they change its classes' layout): the console uses it.
pkg_check_modules(CPP_HTTPLIB REQUIRED IMPORTED_TARGET cpp-httplib)

# CUDA: optional. AUTO builds it when nvcc is found.
set(FLOWRUN_HAVE_CUDA OFF)
if(NOT FLOWRUN_CUDA STREQUAL "OFF")
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES 80 90)  # A100, H100/H200
    endif()
    set(CMAKE_CUDA_STANDARD 17)  # CMake 3.25 knows no CUDA20 flags for nvcc 13
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    enable_language(CUDA)
    find_package(CUDAToolkit REQUIRED)
    set(FLOWRUN_HAVE_CUDA ON)
    message(STATUS "flowrun: CUDA backend ON (${CMAKE_CUDA_COMPILER}, archs ${CMAKE_CUDA_ARCHITECTURES})")
  elseif(FLOWRUN_CUDA STREQUAL "ON")
    message(FATAL_ERROR "FLOWRUN_CUDA=ON but no CUDA compiler was found (looked in /usr/local/cuda/bin)")
  else()
    message(STATUS "flowrun: CUDA backend OFF (no nvcc found)")
  endif()
endif()

# Gloo (libgloo-dev): collectives between processes and hosts (runtime/comm).
# Optional: AUTO builds the gloo communicator when the library is found.
set(FLOWRUN_GLOO AUTO CACHE STRING "Build the gloo communicator: AUTO, ON or OFF")
set(FLOWRUN_HAVE_GLOO OFF)
if(NOT FLOWRUN_GLOO STREQUAL "OFF")
  find_path(GLOO_INCLUDE_DIR gloo/config.h)
  find_library(GLOO_LIB gloo)
  if(GLOO_INCLUDE_DIR AND GLOO_LIB)
    add_library(flowrun_gloo INTERFACE)
    target_include_directories(flowrun_gloo INTERFACE ${GLOO_INCLUDE_DIR})
    target_link_libraries(flowrun_gloo INTERFACE ${GLOO_LIB} Threads::Threads)
    set(FLOWRUN_HAVE_GLOO ON)
    message(STATUS "flowrun: gloo communicator ON (${GLOO_LIB})")
  elseif(FLOWRUN_GLOO STREQUAL "ON")
    message(FATAL_ERROR "FLOWRUN_GLOO=ON but libgloo was not found: run tools/setup.sh (apt-get install libgloo-dev)")
  else()
    message(STATUS "flowrun: gloo communicator OFF (libgloo-dev not found: tools/setup.sh installs it)")
  endif()
endif()
