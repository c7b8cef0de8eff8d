#include "runtime/comm/store.h"

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <thread>

namespace flowrun::comm {

namespace fs = std::filesystem;

store::~store() = default;

// ------------------------------------------------------------------ file_store

file_store::file_store(std::string dir) : dir_(std::move(dir)) {
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec || !fs::is_directory(dir_))
    throw std::runtime_error("file_store: cannot create directory '" + dir_ + "': " + ec.message());
}

std::string file_store::path_of(const std::string& key) const {
  static const char* hex = "0123456789ABCDEF";
  std::string name;
  for (unsigned char c : key) {
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' ||
        (c == '.' && !name.empty())) {
      name += static_cast<char>(c);
    } else {
      name += '%';
      name += hex[c >> 4];
      name += hex[c & 15];
    }
  }
  if (name.empty()) name.push_back('%');
  return dir_ + "/" + name;
}

void file_store::set(const std::string& key, const std::vector<uint8_t>& value) {
  static std::atomic<uint64_t> counter{0};
  const std::string path = path_of(key);
  // The temporary name starts with '.', which path_of never produces, and is
  // unique per process and call, so concurrent writers never share one.
  const std::string tmp = dir_ + "/.tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++);
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) throw std::runtime_error("file_store: cannot write '" + tmp + "': " + std::strerror(errno));
    f.write(reinterpret_cast<const char*>(value.data()), static_cast<std::streamsize>(value.size()));
    if (!f) throw std::runtime_error("file_store: cannot write '" + tmp + "'");
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    std::remove(tmp.c_str());
    throw std::runtime_error("file_store: cannot rename '" + tmp + "' to '" + path + "': " + why);
  }
}

bool file_store::contains(const std::string& key) { return ::access(path_of(key).c_str(), F_OK) == 0; }

void file_store::erase(const std::string& key) { std::remove(path_of(key).c_str()); }

std::vector<uint8_t> file_store::get(const std::string& key, std::chrono::milliseconds timeout) {
  const std::string path = path_of(key);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto pause = std::chrono::milliseconds(1);
  for (;;) {
    std::ifstream f(path, std::ios::binary);
    if (f) return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
    if (std::chrono::steady_clock::now() >= deadline)
      throw std::runtime_error("file_store: timed out after " + std::to_string(timeout.count()) +
                               " ms waiting for key '" + key + "' in " + dir_ + " (did every rank start?)");
    std::this_thread::sleep_for(pause);
    if (pause < std::chrono::milliseconds(20)) pause *= 2;
  }
}

// ---------------------------------------------------------------- memory_store

void memory_store::set(const std::string& key, const std::vector<uint8_t>& value) {
  {
    std::lock_guard lk(mu_);
    kv_[key] = value;
  }
  cv_.notify_all();
}

std::vector<uint8_t> memory_store::get(const std::string& key, std::chrono::milliseconds timeout) {
  std::unique_lock lk(mu_);
  if (!cv_.wait_for(lk, timeout, [&] { return kv_.count(key) > 0; }))
    throw std::runtime_error("memory_store: timed out after " + std::to_string(timeout.count()) +
                             " ms waiting for key '" + key + "'");
  return kv_.at(key);
}

bool memory_store::contains(const std::string& key) {
  std::lock_guard lk(mu_);
  return kv_.count(key) > 0;
}

void memory_store::erase(const std::string& key) {
  std::lock_guard lk(mu_);
  kv_.erase(key);
}

}  // namespace flowrun::comm
