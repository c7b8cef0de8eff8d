// flowrun key-value stores for rendezvous (layer 2 of docs/architecture.md).
//
// Ranks that are about to form a communicator exchange a few bytes through a
// store: the NCCL unique id that rank 0 creates (nccl_communicator), or any
// other small record a launcher needs. A store holds write-once-per-job
// records; `get` blocks until the key appears or the timeout passes.
//
// Two implementations:
//   file_store    a directory that every rank can see (same host, or a shared
//                 file system). Each key is one file, written to a temporary
//                 name and renamed into place, so a reader never sees half a
//                 record. Works across processes.
//   memory_store  a map behind a mutex, for ranks that are threads of one
//                 process (tests, the inproc backend's launchers).
// A third, served by a CAF actor over TCP (flowrun launch's default), is in
// caf_store.h (make_caf_store, open_store("caf://HOST:PORT")).
//
// Keys are arbitrary strings; file_store escapes them into file names.
// Records left in a file_store directory by a previous job are read as if
// they were new: use a fresh directory (or a job-specific key prefix) per job.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace flowrun::comm {

/// A blocking key-value store shared by the ranks of one job.
class store {
 public:
  virtual ~store();
  /// Stores `value` under `key`, replacing an earlier value. Throws
  /// std::runtime_error when the record cannot be written.
  virtual void set(const std::string& key, const std::vector<uint8_t>& value) = 0;
  /// The value of `key`, waiting up to `timeout` for another rank to set it.
  /// Throws std::runtime_error naming the key (and the store) on timeout.
  virtual std::vector<uint8_t> get(const std::string& key, std::chrono::milliseconds timeout) = 0;
  /// True when `key` is set now (does not wait).
  virtual bool contains(const std::string& key) = 0;
  /// Removes `key` if present (no error when absent).
  virtual void erase(const std::string& key) = 0;
};

/// A store in directory `dir` (created when missing). Safe for many processes
/// and threads. `get` polls every few milliseconds (no inotify: it must work
/// on NFS and similar shared file systems).
class file_store final : public store {
 public:
  /// Throws std::runtime_error when `dir` cannot be created.
  explicit file_store(std::string dir);
  void set(const std::string& key, const std::vector<uint8_t>& value) override;
  std::vector<uint8_t> get(const std::string& key, std::chrono::milliseconds timeout) override;
  bool contains(const std::string& key) override;
  void erase(const std::string& key) override;
  const std::string& dir() const { return dir_; }
  /// The file that holds `key` (escaped: [A-Za-z0-9._-] stay, every other byte
  /// becomes %XX).
  std::string path_of(const std::string& key) const;

 private:
  std::string dir_;
};

/// A store in this process's memory, for ranks that are threads.
class memory_store final : public store {
 public:
  void set(const std::string& key, const std::vector<uint8_t>& value) override;
  std::vector<uint8_t> get(const std::string& key, std::chrono::milliseconds timeout) override;
  bool contains(const std::string& key) override;
  void erase(const std::string& key) override;

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::vector<uint8_t>> kv_;
};

}  // namespace flowrun::comm
