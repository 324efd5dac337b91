// Read-only directories (issue 15, item 11): every output a command writes (train --output,
// --checkpoint-dir on every rank, --metrics; prepare, convert and plan --calibrate --output) aimed
// at a directory that cannot be written is refused before any work, with status 1 and the
// directory and the reason named. Root ignores permission bits, so as root (CI) the directory is a
// tmpfs remounted read-only (EROFS); where mounting is not allowed, the commands run as `nobody`
// (setpriv) in a chmod 555 directory; as an ordinary user, chmod 555 alone. Skipped, with the
// reason printed, only when none of these works.
#include <sys/mount.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "faults/fault_cases.h"

namespace lt {
namespace {

namespace fs = std::filesystem;

// How this process gets a directory it cannot write, and what to run commands through.
struct ReadOnlyDir {
  std::string path;      // an existing directory, read-only to the commands
  std::string prefix;    // put before a command line (setpriv), or ""
  std::string reason;    // the errno text the commands must report
  std::string how;       // for the log
  std::string skip_why;  // non-empty: no way here
};

bool mount_read_only_tmpfs(const std::string& dir) {
  if (::geteuid() != 0) return false;
  if (::mount("tmpfs", dir.c_str(), "tmpfs", 0, "size=1m,mode=0755") != 0) return false;
  fs::create_directories(dir + "/existing");
  if (::mount("tmpfs", dir.c_str(), "tmpfs", MS_REMOUNT | MS_RDONLY, "size=1m,mode=0755") != 0) {
    ::umount(dir.c_str());
    return false;
  }
  return true;
}

const ReadOnlyDir& read_only_dir() {
  static const ReadOnlyDir d = [] {
    ReadOnlyDir r;
    const std::string mnt = testing::scratch() + "/ro";
    fs::create_directories(mnt);
    if (mount_read_only_tmpfs(mnt)) {
      static const std::string unmount_at_exit = mnt;
      std::atexit([] { ::umount(unmount_at_exit.c_str()); });
      r.path = mnt + "/existing";
      r.reason = "Read-only file system";
      r.how = "a tmpfs remounted read-only (as root)";
      return r;
    }
    fs::create_directories(mnt + "/existing");
    fs::permissions(mnt + "/existing", fs::perms(0555));
    r.path = mnt + "/existing";
    r.reason = "Permission denied";
    if (::geteuid() != 0) {
      r.how = "a chmod 555 directory";
      return r;
    }
    // Root without mount rights (a container): run the commands as nobody. They must reach the
    // binary, the inputs and the scratch directory.
    if (std::system("command -v setpriv >/dev/null 2>&1") == 0 &&
        std::system("setpriv --reuid=65534 --regid=65534 --clear-groups true >/dev/null 2>&1") == 0) {
      fs::permissions(testing::scratch(), fs::perms(0755));
      fs::permissions(mnt, fs::perms(0755));
      r.prefix = "setpriv --reuid=65534 --regid=65534 --clear-groups ";
      r.how = "a chmod 555 directory, the commands run as nobody (setpriv)";
      return r;
    }
    r.skip_why = "root may not mount a tmpfs here and cannot drop to another user (setpriv), so no directory is "
                 "read-only to it";
    return r;
  }();
  return d;
}

// A dataset and a model, written where there is room, readable by everyone.
struct Inputs {
  std::string data, model, metrics;
};
const Inputs& inputs() {
  static const Inputs in = [] {
    Inputs r;
    const std::string dir = testing::scratch() + "/inputs";
    fs::create_directories(dir);
    r.data = dir + "/tales.h5";
    auto p = faults::run_tool("prepare --text builtin:tinytales --vocab-size 512 --seq-len 32 --seed 1 --output " + r.data);
    EXPECT_EQ(p.status, 0) << p.err;
    r.metrics = dir + "/m.jsonl";
    auto t = faults::run_limited("env OMP_NUM_THREADS=1 '" + std::string(LLAMATRAIN_BINARY) +
                                 "' train --model-config tiny --data " + r.data +
                              " --max-steps 2 --batch-size 2 --no-progress --metrics " + r.metrics + " --output " + dir +
                              "/run");
    EXPECT_EQ(t.status, 0) << t.err;
    r.model = dir + "/run/model.h5";
    return r;
  }();
  return in;
}

TEST(FaultsReadOnly, EveryOutputInAReadOnlyDirectoryIsRefusedFirst) {
  const ReadOnlyDir& ro = read_only_dir();
  if (!ro.skip_why.empty()) GTEST_SKIP() << ro.skip_why;
  const Inputs& in = inputs();
  ASSERT_FALSE(in.model.empty());
  std::printf("read-only directory: %s (%s)\n", ro.path.c_str(), ro.how.c_str());
  const std::string bin = ro.prefix + "'" + std::string(LLAMATRAIN_BINARY) + "' ";
  const std::string train = "train --model-config tiny --data " + in.data +
                            " --max-steps 1 --batch-size 2 --no-progress ";
  const std::string d = ro.path;
  struct Case {
    std::string name, command, needle;
  };
  const std::vector<Case> table = {
      {"train --output DIR", bin + train + "--output " + d, "--output " + d + ": cannot write in the directory"},
      {"train --output DIR/new", bin + train + "--output " + d + "/new",
       "--output " + d + "/new: cannot create the directory"},
      {"train --checkpoint-dir DIR", bin + train + "--checkpoint-dir " + d,
       "--checkpoint-dir " + d + ": cannot write in the directory"},
      {"train --checkpoint-dir DIR/new/ck", bin + train + "--checkpoint-dir " + d + "/new/ck",
       "--checkpoint-dir " + d + "/new/ck: cannot create the directory"},
      {"train --metrics DIR/m.jsonl", bin + train + "--metrics " + d + "/m.jsonl",
       "--metrics " + d + ": cannot write in the directory"},
      {"mpirun -np 2 train --checkpoint-dir DIR",
       ro.prefix + testing::mpirun_llamatrain(2, 1) + train + "--checkpoint-dir " + d,
       "--checkpoint-dir " + d + ": cannot write in the directory"},
      {"prepare --output DIR/d.h5",
       bin + "prepare --text builtin:tinytales --vocab-size 300 --seq-len 32 --output " + d + "/d.h5",
       "--output " + d + ": cannot write in the directory"},
      {"prepare --qa --output DIR/q.h5",
       bin + "prepare --qa builtin:factqa --prompt-type 3 --vocab-size 300 --seq-len 64 --output " + d + "/q.h5",
       "--output " + d + ": cannot write in the directory"},
      {"convert --output DIR/m.bin", bin + "convert --input " + in.model + " --output " + d + "/m.bin",
       "--output " + d + ": cannot write in the directory"},
      {"convert --output DIR/hf/ (HF)", bin + "convert --input " + in.model + " --output " + d + "/hf/",
       "--output " + d + "/hf"},
      {"convert --output DIR/m.h5", bin + "convert --input " + in.model + " --output " + d + "/m.h5",
       "--output " + d + ": cannot write in the directory"},
      {"plan --calibrate --output DIR/c.json",
       bin + "plan --model-config tiny --seq-len 32 --calibrate " + in.metrics + " --output " + d + "/c.json",
       "--output " + d + ": cannot write in the directory"},
  };
  for (const Case& c : table) {
    SCOPED_TRACE(c.name);
    const faults::Run r = faults::run_limited(c.command, 120);
    const faults::Outcome o = faults::expect_refusal("read-only: " + c.name, r, 1, c.needle);
    if (o == faults::Outcome::kClear) {
      EXPECT_NE(r.err.find(ro.reason), std::string::npos) << r.err;
    }
    std::printf("%-42s %-8s %s\n", c.name.c_str(), faults::outcome_name(o), faults::last_line(r.err).c_str());
  }
  EXPECT_TRUE(fs::is_empty(d)) << "something was written into the read-only directory";
}

}  // namespace
}  // namespace lt
