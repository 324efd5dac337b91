// Hostfiles: the shipped ones parse to the inventory they describe, Open MPI's own parser
// accepts them, every malformed line is reported with its line and what was expected, the GPU
// spec table holds the datasheet numbers, and `info --hostfile` prints the inventory once.
#include <gtest/gtest.h>
#include <unistd.h>

#include <map>
#include <regex>

#include "llamatrain/error.h"
#include "llamatrain/hostfile.h"
#include "test_util.h"

namespace lt {
namespace {

using testing::error_of;
using testing::run_cli;

const std::string kHostfiles = std::string(LLAMATRAIN_SOURCE_DIR) + "/hostfiles";

void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
  ASSERT_TRUE(out.good()) << path;
}

// Output and exit status of a shell command (stdout and stderr together).
testing::CliResult run_shell(const std::string& cmd) {
  const std::string out = testing::scratch() + "/shell.out";
  const int rc = std::system((cmd + " >'" + out + "' 2>&1 </dev/null").c_str());
  testing::CliResult r;
  r.status = WIFEXITED(rc) ? WEXITSTATUS(rc) : 128 + WTERMSIG(rc);
  r.out = testing::slurp(out);
  return r;
}

// Open MPI's launcher as CMake found it, as root when we are root.
std::string mpirun() {
  return std::string("timeout 120 '") + LLAMATRAIN_MPIEXEC + "'" + (::geteuid() == 0 ? " --allow-run-as-root" : "");
}

TEST(HostfileParse, LocalhostIsOneHostWithTwoSlots) {
  const Hostfile hf = read_hostfile(kHostfiles + "/localhost");
  EXPECT_EQ(hf.path, kHostfiles + "/localhost");
  ASSERT_EQ(hf.hosts.size(), 1u);
  EXPECT_EQ(hf.hosts[0].host, "localhost");
  EXPECT_EQ(hf.hosts[0].slots, 2);
  EXPECT_EQ(hf.hosts[0].line, 2);
  EXPECT_EQ(hf.hosts[0].gpu, "");
  EXPECT_EQ(hf.hosts[0].gpus, 0);
  EXPECT_EQ(hf.total_slots(), 2);
}

TEST(HostfileParse, ReferenceClusterIsThreeHostsSixteenGpus) {
  const Hostfile hf = read_hostfile(kHostfiles + "/reference-cluster");
  ASSERT_EQ(hf.hosts.size(), 3u);
  EXPECT_EQ(hf.total_slots(), 16);
  const std::vector<std::pair<std::string, int>> expected = {{"xe9680", 8}, {"xe8545", 4}, {"r760xa", 4}};
  std::map<std::string, int> gpus_by_type;
  for (size_t i = 0; i < hf.hosts.size(); ++i) {
    const HostEntry& h = hf.hosts[i];
    EXPECT_EQ(h.host, expected[i].first);
    EXPECT_EQ(h.slots, expected[i].second) << h.host;
    EXPECT_EQ(h.gpus, h.slots) << h.host << ": one rank per GPU";
    EXPECT_EQ(h.nic_gbps, 100.0) << h.host;
    EXPECT_NE(find_gpu_spec(h.gpu), nullptr) << h.host << ": " << h.gpu;
    EXPECT_GT(h.line, 1) << h.host;
    gpus_by_type[h.gpu] += h.gpus;
  }
  EXPECT_EQ(gpus_by_type, (std::map<std::string, int>{{"A100-SXM4-80GB", 12}, {"H100-PCIe-80GB", 4}}));
}

// Every feature of the grammar on one file: whitespace and tabs, CRLF, comment-only and blank
// lines, max_slots, gpus defaulting to the slots or given, free text next to the annotation,
// user@host and IPv4 hosts, GPU types as the table names them whatever their spelling.
TEST(HostfileParse, GrammarAndDefaults) {
  const std::string text =
      "# header\n"
      "\n"
      "  node-a.example.org   slots=4 max_slots=8\t# gpu=h100-sxm5-80gb nic_gbps=200 # rack 3 = top\r\n"
      "node-b\n"
      "user@node-c slots=2 # gpus=1 gpu=A100-PCIe-80GB\n"
      "   # gpu=H200 on a comment-only line is ignored\n"
      "node-d slots=2 # just a note\n"
      "10.0.0.5 slots=3 # gpu=a100 nic_gbps=25.5\n";
  const Hostfile hf = parse_hostfile_text(text, "t.hosts");
  EXPECT_EQ(hf.path, "t.hosts");
  ASSERT_EQ(hf.hosts.size(), 5u);
  const HostEntry& a = hf.hosts[0];
  EXPECT_EQ(a.host, "node-a.example.org");
  EXPECT_EQ(a.line, 3);
  EXPECT_EQ(a.slots, 4);
  EXPECT_EQ(a.max_slots, 8);
  EXPECT_EQ(a.gpu, "H100-SXM5-80GB");
  EXPECT_EQ(a.gpus, 4);
  EXPECT_EQ(a.nic_gbps, 200.0);
  EXPECT_EQ(find_gpu_spec(a.gpu), find_gpu_spec("H100-SXM5-80GB"));
  const HostEntry& b = hf.hosts[1];
  EXPECT_EQ(b.host, "node-b");
  EXPECT_EQ(b.line, 4);
  EXPECT_EQ(b.slots, 1);
  EXPECT_EQ(b.max_slots, 0);
  EXPECT_EQ(b.gpu, "");
  EXPECT_EQ(b.gpus, 0);
  EXPECT_EQ(b.nic_gbps, 0.0);
  EXPECT_EQ(b.threads, 0);
  const HostEntry& c = hf.hosts[2];
  EXPECT_EQ(c.host, "user@node-c");
  EXPECT_EQ(c.line, 5);
  EXPECT_EQ(c.gpu, "A100-PCIe-80GB");
  EXPECT_EQ(c.gpus, 1);
  const HostEntry& d = hf.hosts[3];
  EXPECT_EQ(d.line, 7);
  EXPECT_EQ(d.gpu, "");
  EXPECT_EQ(d.gpus, 0);
  const HostEntry& e = hf.hosts[4];
  EXPECT_EQ(e.host, "10.0.0.5");
  EXPECT_EQ(e.line, 8);
  EXPECT_EQ(e.gpu, "A100-SXM4-80GB");
  EXPECT_EQ(e.gpus, 3);
  EXPECT_EQ(e.nic_gbps, 25.5);
  EXPECT_EQ(hf.total_slots(), 4 + 1 + 2 + 2 + 3);
  // The last line may end without a newline when it has no comment (Open MPI accepts that).
  EXPECT_EQ(parse_hostfile_text("a slots=2\nb slots=3", "t").total_slots(), 5);
  // A CPU node's OpenMP threads per rank, for the planner.
  const HostEntry cpu = parse_hostfile_text("c1 slots=2 # threads=4 nic_gbps=10\n", "t").hosts[0];
  EXPECT_EQ(cpu.threads, 4);
  EXPECT_EQ(cpu.nic_gbps, 10.0);
}

// The case: `gpu=H100 PCIe` unquoted was read as H100-SXM5 (989 against 756 TFLOP/s) and
// "PCIe" ignored. nvidia-smi's names read whole, quoted or not, up to the next key=value; an alias
// of several parts says which one it was read as.
TEST(HostfileParse, NvidiaSmiNamesWithSpacesAndAliasNotes) {
  const Hostfile hf = parse_hostfile_text(
      "a slots=4 # gpu=NVIDIA H100 PCIe nic_gbps=100\n"
      "b slots=4 # gpu=\"NVIDIA A100-PCIE-40GB\" gpus=2\n"
      "c slots=8 # gpus=8 gpu='NVIDIA H100 80GB HBM3' # rack 3\n"
      "d slots=8 # gpu=h100 nic_gbps=100\n"
      "e slots=8 # gpu=a100-pcie\n"
      "f slots=8 # gpu=H200\n",
      "hf");
  ASSERT_EQ(hf.hosts.size(), 6u);
  EXPECT_EQ(hf.hosts[0].gpu, "H100-PCIe-80GB");
  EXPECT_EQ(hf.hosts[0].nic_gbps, 100.0);
  EXPECT_EQ(find_gpu_spec(hf.hosts[0].gpu)->bf16_tflops, 756.0);
  EXPECT_EQ(hf.hosts[1].gpu, "A100-PCIe-40GB");
  EXPECT_EQ(hf.hosts[1].gpus, 2);
  EXPECT_EQ(hf.hosts[2].gpu, "H100-SXM5-80GB");
  EXPECT_EQ(hf.hosts[2].gpus, 8);
  EXPECT_EQ(hf.hosts[3].gpu, "H100-SXM5-80GB");
  EXPECT_EQ(hf.hosts[4].gpu, "A100-PCIe-80GB");
  EXPECT_EQ(hf.hosts[5].gpu, "H200");
  const std::vector<std::string> notes = hf.gpu_notes();
  ASSERT_EQ(notes.size(), 2u);  // h100 and a100-pcie; the full names and H200 (one part) need none
  EXPECT_EQ(notes[0], "hf:4: gpu=h100 read as H100-SXM5-80GB (989 TFLOP/s dense bf16, 80 GB); for H100-PCIe-80GB or "
                      "H100-NVL-94GB write that name or the one nvidia-smi prints");
  EXPECT_EQ(notes[1], "hf:5: gpu=a100-pcie read as A100-PCIe-80GB (312 TFLOP/s dense bf16, 80 GB); for "
                      "A100-SXM4-80GB or A100-SXM4-40GB or A100-PCIe-40GB write that name or the one nvidia-smi prints");
}

TEST(HostfileErrors, EachNamesItsLineAndWhatWasExpected) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"a slots=2\n\n# c\nb slots=abc\n", "bad:4: slots=abc: expected a positive integer"},
      {"a slots=0\n", "bad:1: slots=0: expected a positive integer"},
      {"a slots=-1\n", "bad:1: slots=-1: expected a positive integer"},
      {"a slots=\n", "bad:1: slots=: expected a positive integer"},
      {"a slots=99999999999\n", "bad:1: slots=99999999999: expected a positive integer"},
      {"a slots=2 slots=3\n", "bad:1: slots=3: slots= given twice; expected one per host"},
      {"a slots=2 max_slots=x\n", "bad:1: max_slots=x: expected a positive integer"},
      {"a\nb slots=4 max_slots=2\n", "bad:2: max_slots=2: expected at least slots=4"},
      {"a slots=1\nb\nA slots=2\n", "bad:3: A: host already listed on line 1; expected one line per host"},
      {"a slots=2 rank=1\n", "bad:1: rank=1: unknown key 'rank'; expected slots=N or max_slots=M"},
      {"a cpu=4\n", "bad:1: cpu=4: expected slots=4 (cpu= is an Open MPI alias we do not use)"},
      {"a count=4\n", "bad:1: count=4: expected slots=4 (count= is an Open MPI alias we do not use)"},
      {"a max-slots=4\n", "bad:1: max-slots=4: expected max_slots=4 (max-slots= is an Open MPI alias we do not use)"},
      {"a b\n", "bad:1: b: expected slots=N or max_slots=M (key=value, no spaces)"},
      {"a slots = 2\n", "bad:1: slots: expected slots=N or max_slots=M (key=value, no spaces)"},
      {"slots=2\n", "bad:1: slots=2: expected a host name first, then slots=N"},
      {"-a slots=2\n", "bad:1: -a: expected a host name (letters, digits, '.', '-', '_', optionally user@)"},
      {"a slots=2 # gpu=A100-SXM4-80GB nics=2\n",
       "bad:1:32: nics=2: unknown annotation key 'nics'; expected gpu=<type>, gpus=<count>, nic_gbps=<Gb/s> or "
       "threads=<count> after '#'"},
      {"a slots=2 # gpu=A100-SXM4-80GB nic_gbps=abc\n",
       "bad:1:32: nic_gbps=abc: expected a positive number (Gb/s of the node's network)"},
      {"a\nb # gpu=H200 nic_gbps=0\n", "bad:2:14: nic_gbps=0: expected a positive number (Gb/s of the node's network)"},
      {"a # nic_gbps=-100\n", "bad:1:5: nic_gbps=-100: expected a positive number (Gb/s of the node's network)"},
      {"a # nic_gbps=inf\n", "bad:1:5: nic_gbps=inf: expected a positive number (Gb/s of the node's network)"},
      {"a # nic_gbps=100 nic_gbps=25\n", "bad:1:18: nic_gbps=25: nic_gbps= given twice; expected one per host"},
      {"a # gpu=H200 gpus=0\n", "bad:1:14: gpus=0: expected a positive integer"},
      {"a # gpu=H200 gpus=two\n", "bad:1:14: gpus=two: expected a positive integer"},
      {"a # gpus=4\n", "bad:1:5: gpus=4: expected gpu=<type> too (which GPUs?)"},
      {"a # threads=0\n", "bad:1:5: threads=0: expected a positive integer (OpenMP threads per rank)"},
      {"a # threads=2 threads=4\n", "bad:1:15: threads=4: threads= given twice; expected one per host"},
      {"a # gpu=H200 threads=8\n",
       "bad:1:14: threads=8: expected no gpu= beside it (threads= describes the ranks of a CPU node)"},
      {"a # gpu=\n", "bad:1:5: gpu=: expected a GPU type, e.g. gpu=A100-SXM4-80GB"},
      {"a # gpu=B300\n", "bad:1:5: gpu=B300: unknown GPU type 'B300'; known types: " + known_gpu_names()},
      {"a # gpu=H200 gpu=A100-SXM4-80GB\n",
       "bad:1:14: gpu=A100-SXM4-80GB: gpu= given twice; expected one gpu=<type> per host"},
      {"a slots=2 # gpu=a100 nic_gbps=100 rack 3\n",
       "bad:1:35: rack: unknown word in the annotation; expected gpu=<type>, gpus=<count>, nic_gbps=<Gb/s> or "
       "threads=<count> (free text goes after a second '#')"},
      {"a slots=2 # rack=3 gpu=a100\n",
       "bad:1:13: rack=3: unknown annotation key 'rack'; expected gpu=<type>, gpus=<count>, nic_gbps=<Gb/s> or "
       "threads=<count> after '#'"},
      {"a # gpu=H100 PCIe-ish\n",
       "bad:1:5: gpu=H100 PCIe-ish: unknown GPU type 'H100 PCIe-ish'; known types: " + known_gpu_names()},
      {"a # gpu=\"NVIDIA H100 PCIe gpus=2\n", "bad:1:5: gpu=\"NVIDIA H100 PCIe gpus=2: the quote is not closed"},
      {"a slots=2\n# end", "bad:2: the file ends inside a comment; expected a newline at the end (mpirun rejects it)"},
      {"a slots=2 # gpu=H200",
       "bad:1: the file ends inside a comment; expected a newline at the end (mpirun rejects it)"},
      {"", "bad: no hosts; expected at least one line `HOST slots=N` (the file is empty or only comments)"},
      {"# only\n\n   \n",
       "bad: no hosts; expected at least one line `HOST slots=N` (the file is empty or only comments)"},
  };
  for (const auto& [text, expected] : cases) {
    std::string what = "<no lt::Error>";
    try {
      parse_hostfile_text(text, "bad");
    } catch (const Error& e) {
      what = e.what();
    }
    EXPECT_EQ(what, expected) << "text: " << text;
  }
}

// One lookup for every spelling a script or a person writes (Slurm GRES names, nvidia-smi names,
// sizes without the form factor), each to the type named here; anything else is refused.
TEST(HostfileGpuSpec, AliasesResolveToOneTypeEach) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"a100", "A100-SXM4-80GB"},
      {"A100", "A100-SXM4-80GB"},
      {"A100-80GB", "A100-SXM4-80GB"},
      {"A100-40GB", "A100-SXM4-40GB"},
      {"A100-SXM4-80GB", "A100-SXM4-80GB"},
      {"a100_sxm4_40gb", "A100-SXM4-40GB"},
      {"A100-PCIe", "A100-PCIe-80GB"},
      {"NVIDIA A100-PCIE-40GB", "A100-PCIe-40GB"},
      {"NVIDIA A100 80GB PCIe", "A100-PCIe-80GB"},
      {"NVIDIA A100-SXM4-80GB", "A100-SXM4-80GB"},
      {"h100", "H100-SXM5-80GB"},
      {"H100", "H100-SXM5-80GB"},
      {"H100-SXM5-80GB", "H100-SXM5-80GB"},
      {"NVIDIA H100 80GB HBM3", "H100-SXM5-80GB"},
      {"H100-PCIe", "H100-PCIe-80GB"},
      {"NVIDIA H100 PCIe", "H100-PCIe-80GB"},
      {"h100-nvl", "H100-NVL-94GB"},
      {"NVIDIA H100 NVL", "H100-NVL-94GB"},
      {"h200", "H200"},
      {"NVIDIA H200", "H200"},
  };
  for (const auto& [name, type] : cases) {
    const GpuSpec* s = find_gpu_spec(name);
    ASSERT_NE(s, nullptr) << name;
    EXPECT_EQ(s->name, type) << name;
    EXPECT_EQ(require_gpu_spec(name, "x").name, type) << name;
  }
  for (const char* bad : {"", "a10", "h100-sxm6", "B200", "nvidia", "rtx4090"}) {
    EXPECT_EQ(find_gpu_spec(bad), nullptr) << bad;
    EXPECT_EQ(error_of([&] { require_gpu_spec(bad, "f:3: gpu=x"); }),
              strcat("f:3: gpu=x: unknown GPU type '", bad, "'; known types: ", known_gpu_names()));
  }
  EXPECT_NE(known_gpu_names().find("A100-SXM4-80GB, A100-SXM4-40GB"), std::string::npos) << known_gpu_names();
}

TEST(HostfileErrors, MissingFileNamesThePath) {
  const std::string path = testing::scratch_dir().string() + "/absent";
  const std::string what = error_of([&] { read_hostfile(path); });
  EXPECT_EQ(what.rfind(path + ": cannot open", 0), 0u) << what;
}

TEST(HostfileGpuSpec, DatasheetNumbersDenseBf16) {
  struct Expect {
    const char* name;
    double tflops, gbps, gib;
  };
  for (const Expect& x : {Expect{"A100-SXM4-80GB", 312, 2039, 80}, Expect{"A100-SXM4-40GB", 312, 1555, 40},
                          Expect{"A100-PCIe-80GB", 312, 1935, 80}, Expect{"H100-SXM5-80GB", 989, 3350, 80},
                          Expect{"H100-PCIe-80GB", 756, 2000, 80}, Expect{"H200", 989, 4800, 141}}) {
    const GpuSpec* s = find_gpu_spec(x.name);
    ASSERT_NE(s, nullptr) << x.name;
    EXPECT_EQ(s->name, x.name);
    EXPECT_EQ(s->bf16_tflops, x.tflops) << x.name;
    EXPECT_EQ(s->hbm_gbps, x.gbps) << x.name;
    EXPECT_EQ(s->memory_gib, x.gib) << x.name;
  }
  EXPECT_EQ(find_gpu_spec("a100-sxm4-80gb"), find_gpu_spec("A100-SXM4-80GB"));
  EXPECT_EQ(find_gpu_spec("h200"), find_gpu_spec("H200"));
  EXPECT_EQ(find_gpu_spec(""), nullptr);
  // Names are unique regardless of case, so a lookup is never ambiguous.
  std::map<std::string, int> seen;
  for (const auto& s : gpu_specs()) {
    EXPECT_EQ(find_gpu_spec(s.name), &s) << s.name;
    EXPECT_EQ(++seen[s.name], 1) << s.name;
  }
}

// The shipped hostfiles through Open MPI's own parser, without reaching the hosts:
// --do-not-launch maps the ranks onto the allocation and --display-allocation prints it.
// A file Open MPI rejects prints no map, which the control case checks.
TEST(HostfileMpirun, ShippedFilesAreAcceptedByOpenMpi) {
  auto r = run_shell(mpirun() + " --hostfile '" + kHostfiles +
                     "/reference-cluster' --display-allocation --do-not-launch -np 16 true");
  for (const auto& [host, slots] : std::vector<std::pair<std::string, int>>{{"xe9680", 8}, {"xe8545", 4}, {"r760xa", 4}})
    EXPECT_TRUE(std::regex_search(r.out, std::regex("Data for node: " + host + "\\s+Num slots: " + std::to_string(slots))))
        << host << ":\n" << r.out;
  EXPECT_EQ(r.out.find("parse error"), std::string::npos) << r.out;

  r = run_shell(mpirun() + " --hostfile '" + kHostfiles + "/localhost' -np 1 hostname");
  EXPECT_EQ(r.status, 0) << r.out;

  // Control: a comment ending the file without a newline, which our parser also rejects.
  const std::string bad = testing::scratch_dir().string() + "/bad";
  write_text(bad, "xe9680 slots=8\n# gpu=A100-SXM4-80GB");
  r = run_shell(mpirun() + " --hostfile '" + bad + "' --display-allocation --do-not-launch -np 1 true");
  EXPECT_EQ(r.out.find("Data for node: xe9680"), std::string::npos) << r.out;
  EXPECT_NE(error_of([&] { read_hostfile(bad); }).find(bad + ":2: the file ends inside a comment"), std::string::npos);
}

TEST(HostfileInfo, PrintsTheInventoryAndTotals) {
  const auto r = run_cli("info --hostfile '" + kHostfiles + "/reference-cluster'");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("blas:"), std::string::npos) << "the usual info comes first:\n" << r.out;
  EXPECT_NE(r.out.find("hostfile:     " + kHostfiles + "/reference-cluster\n"), std::string::npos) << r.out;
  EXPECT_TRUE(std::regex_search(r.out, std::regex("host\\s+slots\\s+max_slots\\s+gpu\\s+gpus\\s+nic_Gb/s\\s+threads\\s+"
                                                  "bf16_TFLOP/s\\s+mem_GB/s\n")))
      << r.out;
  for (const char* row : {"xe9680\\s+8\\s+-\\s+A100-SXM4-80GB\\s+8\\s+100\\s+-\\s+312\\s+2039\n",
                          "xe8545\\s+4\\s+-\\s+A100-SXM4-80GB\\s+4\\s+100\\s+-\\s+312\\s+2039\n",
                          "r760xa\\s+4\\s+-\\s+H100-PCIe-80GB\\s+4\\s+100\\s+-\\s+756\\s+2000\n"})
    EXPECT_TRUE(std::regex_search(r.out, std::regex(row))) << row << "\n" << r.out;
  EXPECT_NE(r.out.find("totals:       3 host(s), 16 slot(s), 16 GPU(s) (12 A100-SXM4-80GB, 4 H100-PCIe-80GB)\n"),
            std::string::npos)
      << r.out;
  // 12 x 312 + 4 x 756
  EXPECT_NE(r.out.find("peak bf16:    6768 TFLOP/s"), std::string::npos) << r.out;
}

// A GPU alias is shown as the type it resolved to, with that type's spec; an unknown type is refused
// with its line (info used to accept it, and plan then refused the same file).
TEST(HostfileInfo, GpuAliasShowsItsTypeAndUnknownTypeIsRefused) {
  const std::string path = testing::scratch_dir().string() + "/mixed";
  write_text(path, "cpu-node slots=2 # threads=1\ngpu-node slots=2 max_slots=4 # gpu=a100 gpus=1\n");
  auto r = run_cli("info --hostfile '" + path + "'");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(std::regex_search(r.out, std::regex("cpu-node\\s+2\\s+-\\s+-\\s+-\\s+-\\s+1\\s+-\\s+-\n"))) << r.out;
  EXPECT_TRUE(
      std::regex_search(r.out, std::regex("gpu-node\\s+2\\s+4\\s+A100-SXM4-80GB\\s+1\\s+-\\s+-\\s+312\\s+2039\n")))
      << r.out;
  EXPECT_NE(r.out.find("totals:       2 host(s), 4 slot(s), 1 GPU(s) (1 A100-SXM4-80GB)\n"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("note: " + path + ":2: gpu=a100 read as A100-SXM4-80GB (312 TFLOP/s dense bf16, 80 GB); for "
                       "A100-SXM4-40GB or A100-PCIe-80GB or A100-PCIe-40GB write that name or the one nvidia-smi "
                       "prints\n"),
            std::string::npos)
      << r.out;
  write_text(path, "cpu-node slots=2\ngpu-node slots=2 # gpu=Mystery-9000\n");
  r = run_cli("info --hostfile '" + path + "'");
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.err, "llamatrain info: error: " + path +
                       ":2:20: gpu=Mystery-9000: unknown GPU type 'Mystery-9000'; known types: " + known_gpu_names() +
                       "\n");
  EXPECT_EQ(r.out, "");
}

TEST(HostfileInfo, MalformedFileFailsWithItsLine) {
  const std::string path = testing::scratch_dir().string() + "/bad";
  write_text(path, "# a cluster\nnode1 slots=2\nnode2 slots=abc\n");
  auto r = run_cli("info --hostfile '" + path + "'");
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.err, "llamatrain info: error: " + path + ":3: slots=abc: expected a positive integer\n");
  EXPECT_EQ(r.out, "") << "the hostfile is checked before anything is printed";

  r = run_cli("info --hostfile '" + path + ".absent'");
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.err.rfind("llamatrain info: error: " + path + ".absent: cannot open", 0), 0u) << r.err;
}

TEST(HostfileInfo, WithoutHostfileNoInventory) {
  const auto r = run_cli("info");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("presets:"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("hostfile:"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("totals:"), std::string::npos) << r.out;
}

// Under mpirun every rank parses the hostfile, and only rank 0 prints: the inventory once, and
// for a malformed file the error once with every rank exiting non-zero.
TEST(HostfileInfo, OnlyRankZeroPrintsUnderMpirun) {
  auto count = [](const std::string& s, const std::string& what) {
    int n = 0;
    for (size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + 1)) ++n;
    return n;
  };
  auto r = testing::run_mpi(2, "info --hostfile '" + kHostfiles + "/reference-cluster'");
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(count(r.out, "totals:       3 host(s), 16 slot(s)"), 1) << r.out;
  EXPECT_EQ(count(r.out, "mpi:          initialised, 2 rank(s)"), 1) << r.out;

  const std::string bad = testing::scratch_dir().string() + "/bad";
  write_text(bad, "node1 slots=2\nnode1 slots=2\n");
  r = testing::run_mpi(2, "info --hostfile '" + bad + "'");
  EXPECT_NE(r.status, 0) << r.err;
  EXPECT_EQ(count(r.err, "llamatrain info: error: " + bad + ":2: node1: host already listed on line 1"), 1) << r.err;
  EXPECT_EQ(r.out, "");
}

}  // namespace
}  // namespace lt
