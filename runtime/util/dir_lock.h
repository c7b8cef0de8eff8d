// One run at a time writes checkpoints into a folder.
//
// Why. Two runs given the same checkpoint folder (a scheduler that requeues a
// job while the old one still runs, a command started twice) wrote the same
// temporary names (PATH.tmp) and renamed or removed each other's: one died at a
// random step with "cannot rename ... .tmp: No such file or directory", and the
// survivor's `latest` could name the other run's step (a review, 2026-12-05:
// 4 tries of 4). DeepSpeed does not guard this either.
//
// What. A writer holds DIR/.flowrun.lock with flock(2), which the kernel drops
// when the process ends, however it ends: a crashed run leaves no stale lock. The
// file names the run that holds it (its run id, pid, host and start time). The
// ranks of one run share the lock (flock's shared mode) and each checks that the
// file names their run (or that this process holds it already, from a run before):
// a second run finds another run id there and is refused, naming the holder. The
// processes of one run need one run id: flowrun launch sets FLOWRUN_RUN_ID for its
// processes. Of processes started by hand (FLOWRUN_NPROC > 1, no FLOWRUN_RUN_ID),
// process 0 holds the lock for the run and the others take none: their work waits
// on process 0 at the rendezvous, which a refused run never reaches. A free lock
// is taken exclusively while the run id is
// written, then shared; a run that lost that race reads another id back and is
// refused as well. flock is advisory and local: it does not guard a folder that
// runs on two machines share over NFS.
#pragma once

#include <string>

namespace flowrun {

/// A held writer lock on a folder (see above). Movable; the lock goes with the
/// object (its descriptor closes in the destructor).
class dir_lock {
 public:
  dir_lock() = default;
  dir_lock(dir_lock&& o) noexcept : fd_(o.fd_), path_(std::move(o.path_)) { o.fd_ = -1; }
  dir_lock& operator=(dir_lock&& o) noexcept;
  dir_lock(const dir_lock&) = delete;
  dir_lock& operator=(const dir_lock&) = delete;
  ~dir_lock();

  /// Takes the lock of `dir` (created when missing) for the run `run_id` (the
  /// same for every rank and process of one run; node_context::run_id; empty:
  /// this process alone, "pidPID"; std::invalid_argument when it holds a space). `what`
  /// names the folder's role in the error ("[graph] checkpoint_dir",
  /// "node 'ranks' output_dir"). Throws std::runtime_error when another run
  /// holds it: "DIR is in use by another flowrun run (run id R, pid P on HOST,
  /// started T): ..." with the fix. A lock file that cannot be created (a folder
  /// this process cannot make or write: a cluster node whose nodes write no
  /// checkpoint there, a read-only copy) gives a lock not held (held() false):
  /// what writes there fails on its own, naming the file.
  static dir_lock acquire(const std::string& dir, const std::string& run_id, const std::string& what);

  bool held() const { return fd_ >= 0; }
  /// DIR/.flowrun.lock.
  const std::string& path() const { return path_; }

 private:
  int fd_ = -1;
  std::string path_;
};

}  // namespace flowrun
