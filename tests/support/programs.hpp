#pragma once
// Running a program the way its user does, for the tests that hold an example to another build or to its original
// (tests/port/port_test.cc, port_modes_test.cc, tests/gpt/example_test.cc): where it was built, its exit status and
// output and the lines of it that start a given way, the bytes of a file it wrote, and a scratch path for that file.
#include <doctest/doctest.h>

#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

namespace fsdp_tests {

/// Bazel runs a test in its runfiles tree, where the data targets keep their workspace paths (`runfile`); CMake
/// says where it built them in the environment `variable` (tests/CMakeLists.txt).
inline std::string program(const char* variable, const char* runfile) {
  const char* set = std::getenv(variable);
  return set != nullptr ? set : runfile;
}

struct run {
  int status = -1;
  std::string out;  ///< stdout and stderr
};

/// Runs `command` through the shell; a command that cannot start fails the test, naming it.
inline run execute(const std::string& command) {
  run r;
  FILE* p = popen((command + " 2>&1").c_str(), "r");
  REQUIRE_MESSAGE(p != nullptr, "could not start: " << command);
  char buf[4096];
  for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) r.out.append(buf, n);
  const int s = pclose(p);
  r.status = WIFEXITED(s) ? WEXITSTATUS(s) : 128;
  return r;
}

/// The lines of `text` that start with `prefix`, in order.
inline std::vector<std::string> lines_starting(const std::string& text, const std::string& prefix) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);)
    if (line.rfind(prefix, 0) == 0) out.push_back(line);
  return out;
}

/// The whole file; one that cannot be read fails the test, naming it.
inline std::string file_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  REQUIRE_MESSAGE(f.good(), "cannot read " << path);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

/// A path in the test's scratch directory (Bazel's TEST_TMPDIR, else /tmp).
inline std::string scratch(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir ? dir : "/tmp") + "/" + name;
}

}  // namespace fsdp_tests
