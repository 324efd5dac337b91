// A GPU that is present but unusable is an error, never a silent CPU run (issue 15, item 9): the
// device nodes and driver version read from a fake /dev and /proc tree, the message, the library
// directories of PyTorch's CUDA wheels, and the whole program refusing `--device auto` when a fake
// tree says GPUs exist but the CUDA runtime (no driver on this machine) cannot use them.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "runtime/dynamic_library.h"
#include "llamatrain/gpu_presence.h"
#include "test_util.h"

namespace lt {
namespace {

namespace fs = std::filesystem;
using testing::run_cli;
using testing::scratch;

void touch(const fs::path& p, const std::string& text = "") {
  fs::create_directories(p.parent_path());
  std::ofstream(p) << text;
}

// A root with /dev/nvidia{0,1,10}, the control and uvm nodes, and the kernel module's version file.
std::string fake_gpu_root(const std::string& version_line) {
  const fs::path root = fs::path(scratch()) / "gpu_root";
  fs::remove_all(root);
  for (const char* n : {"nvidia0", "nvidia1", "nvidia10", "nvidiactl", "nvidia-uvm", "nvidia-modeset"})
    touch(root / "dev" / n);
  touch(root / "proc/driver/nvidia/version", version_line + "\nGCC version:  gcc version 12.2.0\n");
  return root.string();
}

TEST(GpuPresence, NoDeviceNodesMeansNoGpu) {
  const fs::path root = fs::path(scratch()) / "empty_root";
  fs::create_directories(root / "dev");
  const GpuPresence p = detect_gpu_presence(root.string());
  EXPECT_TRUE(p.device_nodes.empty());
  EXPECT_EQ(p.driver_version, "");
}

TEST(GpuPresence, ReadsTheDeviceNodesAndTheDriverVersion) {
  const std::string root = fake_gpu_root(
      "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 01:15:15 UTC 2023");
  const GpuPresence p = detect_gpu_presence(root);
  ASSERT_EQ(p.device_nodes.size(), 3u);
  EXPECT_EQ(p.device_nodes[0], root + "/dev/nvidia0");
  EXPECT_EQ(p.device_nodes[1], root + "/dev/nvidia1");
  EXPECT_EQ(p.device_nodes[2], root + "/dev/nvidia10");
  EXPECT_EQ(p.driver_version, "535.104.05");
  const std::string open = fake_gpu_root(
      "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.65.06  Release Build  (dvs-builder@U16)");
  EXPECT_EQ(detect_gpu_presence(open).driver_version, "580.65.06");
}

TEST(GpuPresence, TheMessageSaysWhatWasFoundWhatIsNeededAndWhatToDo) {
  EXPECT_EQ(required_driver_major(13000), 580);
  EXPECT_EQ(required_driver_major(12080), 525);
  EXPECT_EQ(required_driver_major(11080), 450);
  GpuPresence p;
  p.device_nodes = {"/dev/nvidia0", "/dev/nvidia1"};
  p.driver_version = "535.104.05";
  const std::string m =
      unusable_gpu_message(p, 13000, 12020, "cudaGetDeviceCount: CUDA driver version is insufficient for CUDA runtime version");
  for (const char* part : {"2 NVIDIA GPU device node(s) (/dev/nvidia0, /dev/nvidia1)", "driver 535.104.05",
                           "CUDA 13.0 runtime", "needs driver 580 or newer", "supports CUDA 12.2 at most",
                           "insufficient", "--device cpu"})
    EXPECT_NE(m.find(part), std::string::npos) << "missing '" << part << "' in: " << m;
}

TEST(GpuPresence, FindsTheNvidiaWheelsOfAVirtualEnvironment) {
  const fs::path venv = fs::path(scratch()) / "venv";
  fs::remove_all(venv);
  const fs::path cudnn = venv / "lib/python3.11/site-packages/nvidia/cudnn/lib";
  touch(cudnn / "libcudnn.so.9");
  const char* saved = std::getenv("VIRTUAL_ENV");
  const std::string saved_value = saved ? saved : "";
  setenv("VIRTUAL_ENV", venv.c_str(), 1);
  const auto dirs = dynlib::python_wheel_library_dirs("cudnn");
  const auto none = dynlib::python_wheel_library_dirs("no-such-package");
  if (saved) setenv("VIRTUAL_ENV", saved_value.c_str(), 1);
  else unsetenv("VIRTUAL_ENV");
  ASSERT_FALSE(dirs.empty());
  EXPECT_EQ(dirs[0], cudnn.string());
  EXPECT_TRUE(none.empty());
}

#if LLAMATRAIN_HAVE_CUDA_TOOLKIT
// This machine has no NVIDIA driver, so the CUDA runtime fails to count devices; with a fake tree
// saying that GPUs and a driver exist, `--device auto` must stop instead of training on the CPU.
TEST(GpuPresence, AutoRefusesAGpuThatIsPresentButUnusable) {
  if (!detect_gpu_presence("/").device_nodes.empty()) GTEST_SKIP() << "this machine has real NVIDIA device nodes";
  const std::string root = fake_gpu_root("NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19");
  const std::string env = "env LLAMATRAIN_GPU_PRESENCE_ROOT='" + root + "' ";
  const std::string data = scratch() + "/tales.h5";
  const auto prep = run_cli("prepare --text builtin:tinytales --vocab-size 512 --seq-len 64 --seed 1 --output " + data);
  ASSERT_EQ(prep.status, 0) << prep.err;
  const std::string train = "'" + std::string(LLAMATRAIN_BINARY) + "' train --model-config tiny --data " + data +
                            " --max-steps 1 --no-progress --output " + scratch();
  const auto r = testing::run_captured(env + train + "/never --device auto");
  EXPECT_NE(r.status, 0) << r.out;
  EXPECT_NE(r.err.find("3 NVIDIA GPU device node(s)"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("needs driver 580 or newer"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(scratch() + "/never/model.h5"));
  // Asked for the CPU on purpose, it trains; `info` reports the problem instead of failing.
  const auto cpu = testing::run_captured(env + train + "/cpu --device cpu");
  EXPECT_EQ(cpu.status, 0) << cpu.err;
  EXPECT_TRUE(fs::exists(scratch() + "/cpu/model.h5"));
  const auto info = testing::run_captured(env + "'" + LLAMATRAIN_BINARY + "' info");
  EXPECT_EQ(info.status, 0) << info.err;
  EXPECT_NE(info.out.find("cuda error:   3 NVIDIA GPU device node(s)"), std::string::npos) << info.out;
  EXPECT_NE(info.out.find("cuBLASLt:     "), std::string::npos) << info.out;
  EXPECT_NE(info.out.find("NCCL:         "), std::string::npos) << info.out;
}
#endif

}  // namespace
}  // namespace lt
