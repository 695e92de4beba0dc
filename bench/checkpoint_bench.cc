// Checkpoint save and load throughput (GB/s of checkpoint bytes) against a plain sequential write and read of the
// same bytes, measured in the same run, on the same file system.
//
//   checkpoint_bench [--mib N] [--world W] [--dir D] [--repeats R]
//
// The model: N MiB of fp32 parameters (default 256) in 16 units, AdamW (two states per parameter), on W thread
// ranks (default 4): a checkpoint holds 3 N MiB. Baselines:
//   plain write: one thread writes the same number of bytes to one file with write(2) in 8 MiB calls, then fsync;
//   plain read:  one thread reads them back with read(2) in 8 MiB calls into one reused 8 MiB buffer, after
//                evicting the file from the page cache (posix_fadvise DONTNEED once it is flushed; the checkpoint's
//                files are evicted the same way before each load); and "kept": the same reads into one buffer of the
//                file's size, as a loader whose bytes must all land in memory does (a first touch of every page).
// save = checkpoint::save (download, checksums, write, fsync, manifest, rename); load = checkpoint::load at W
// ranks (the same layout) and at W / 2 ranks (resharding), every block's checksum verified: staged (the whole
// shards in host memory first, then uploaded) and in place (load_options::in_place: read straight into the
// shards). Each figure is the median of R repeats (default 5; the plain write and the save alternate which goes
// first, and so do the two loads). Goal: save and load at >= 0.8 of the plain figures. Closes with one JSON line.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fsdp/checkpoint/checkpoint.hpp>
#include <fsdp/fsdp.hpp>
#include <memory>
#include <string>
#include <vector>

namespace {
using clock_type = std::chrono::steady_clock;
using policy = fsdp::policy<fsdp::sharding::full_shard>;
constexpr int kUnits = 16;

double seconds_since(clock_type::time_point t) { return std::chrono::duration<double>(clock_type::now() - t).count(); }
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

fsdp::ModelSpec spec(std::int64_t mib) {
  const std::int64_t per_unit = mib * (1 << 20) / 4 / kUnits;  // fp32 elements
  fsdp::ModelSpec s;
  for (int u = 0; u < kUnits; ++u) s.add("u" + std::to_string(u) + ".w", {per_unit});
  return s;
}

/// Drops a file's pages from the page cache (after it reached storage), so that the next read comes from disk.
void evict(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return;
  ::fdatasync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}
void evict_tree(const std::string& dir) {
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir))
    if (e.is_regular_file()) evict(e.path().string());
}

double plain_write(const std::string& path, std::uint64_t bytes) {
  std::vector<char> buf(std::size_t{8} << 20, 1);
  const auto t = clock_type::now();
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  for (std::uint64_t done = 0; done < bytes;) {
    const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(buf.size(), bytes - done));
    if (::write(fd, buf.data(), n) != static_cast<ssize_t>(n)) std::abort();
    done += n;
  }
  ::fsync(fd);
  ::close(fd);
  return seconds_since(t);
}
/// Reads the file back cold: into one reused 8 MiB buffer, or (`keep`) into one buffer of the file's size, as a
/// loader whose bytes must all land in memory does (a first touch of every page).
double plain_read(const std::string& path, std::uint64_t bytes, bool keep) {
  evict(path);
  constexpr std::uint64_t call = std::uint64_t{8} << 20;
  const auto t = clock_type::now();
  std::unique_ptr<char[]> buf(new char[keep ? bytes : call]);
  const int fd = ::open(path.c_str(), O_RDONLY);
  for (std::uint64_t done = 0; done < bytes;) {
    const ssize_t n = ::read(fd, buf.get() + (keep ? done : 0), static_cast<std::size_t>(std::min(call, bytes - done)));
    if (n <= 0) std::abort();
    done += static_cast<std::uint64_t>(n);
  }
  ::close(fd);
  return seconds_since(t);
}

double save_once(int world, std::int64_t mib, const std::string& dir) {
  double secs = 0;
  fsdp::comm::run_local(world, [&](fsdp::comm::local_communicator& c) {
    fsdp::Model<policy> m(c, spec(mib), fsdp::wrap::by_prefix{"u"});
    fsdp::optim::adamw opt(m, {});
    m.synchronize();
    c.barrier();
    const auto t = clock_type::now();
    fsdp::checkpoint::save(m, opt, dir);
    if (c.rank() == 0) secs = seconds_since(t);
  });
  return secs;
}
double load_once(int world, std::int64_t mib, const std::string& dir, bool in_place) {
  double secs = 0;
  fsdp::comm::run_local(world, [&](fsdp::comm::local_communicator& c) {
    fsdp::Model<policy> m(c, spec(mib), fsdp::wrap::by_prefix{"u"});
    fsdp::optim::adamw opt(m, {});
    m.synchronize();
    if (c.rank() == 0) evict_tree(dir);
    c.barrier();
    const auto t = clock_type::now();
    fsdp::checkpoint::load(m, opt, dir, {.in_place = in_place});
    c.barrier();
    if (c.rank() == 0) secs = seconds_since(t);
  });
  return secs;
}
}  // namespace

int main(int argc, char** argv) {
  std::int64_t mib = 256;
  int world = 4, repeats = 5;
  std::string root = std::filesystem::temp_directory_path().string();
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--mib")
      mib = std::atoll(argv[i + 1]);
    else if (a == "--world")
      world = std::atoi(argv[i + 1]);
    else if (a == "--dir")
      root = argv[i + 1];
    else if (a == "--repeats")
      repeats = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "usage: %s [--mib N] [--world W] [--dir D] [--repeats R]\n", argv[0]);
      return 2;
    }
  }
  const std::string dir = root + "/fsdp-checkpoint-bench";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::uint64_t bytes = static_cast<std::uint64_t>(mib) * (1 << 20) * 3;  // params + exp_avg + exp_avg_sq
  const double gb = static_cast<double>(bytes) / 1e9;
  std::printf(
      "checkpoint_bench: %lld MiB of fp32 parameters in %d units, AdamW: %.3f GB per checkpoint; %d thread "
      "ranks; %s; median of %d\n",
      static_cast<long long>(mib), kUnits, gb, world, dir.c_str(), repeats);

  std::vector<double> pw, pr, pk, sv, ld, lr, li, lri;
  for (int r = 0; r < repeats; ++r) {
    const std::string plain = dir + "/plain.bin", ck = dir + "/ck-" + std::to_string(r);
    // The order alternates, so that neither side always meets the page cache the other left.
    if (r % 2 == 1) sv.push_back(save_once(world, mib, ck));
    pw.push_back(plain_write(plain, bytes));
    pr.push_back(plain_read(plain, bytes, false));
    pk.push_back(plain_read(plain, bytes, true));
    std::filesystem::remove(plain);
    if (r % 2 == 0) sv.push_back(save_once(world, mib, ck));
    // Staged and in place alternate which goes first.
    if (r % 2 == 1) li.push_back(load_once(world, mib, ck, true));
    ld.push_back(load_once(world, mib, ck, false));
    if (r % 2 == 0) li.push_back(load_once(world, mib, ck, true));
    lr.push_back(load_once(std::max(1, world / 2), mib, ck, false));
    lri.push_back(load_once(std::max(1, world / 2), mib, ck, true));
    std::filesystem::remove_all(ck);
  }
  const double kept = gb / median(pk);
  const double w = gb / median(pw), rd = gb / median(pr), s = gb / median(sv), l = gb / median(ld),
               l2 = gb / median(lr), lp = gb / median(li), lp2 = gb / median(lri);
  // Each repeat's own ratios (the save and the plain write ran next to each other): their spread says how much the
  // file system's speed moved during the run.
  std::vector<double> rs, rl, rp;
  std::printf("per repeat, save / plain write:");
  for (int r = 0; r < repeats; ++r) {
    rs.push_back(pw[r] / sv[r]);
    std::printf(" %.2f", rs.back());
  }
  std::printf("\nper repeat, load / plain read: ");
  for (int r = 0; r < repeats; ++r) {
    rl.push_back(pr[r] / ld[r]);
    std::printf(" %.2f", rl.back());
  }
  std::printf("\nper repeat, load in place / plain read: ");
  for (int r = 0; r < repeats; ++r) {
    rp.push_back(pr[r] / li[r]);
    std::printf(" %.2f", rp.back());
  }
  std::printf("\n");
  std::printf("%-44s %9s %9s %9s\n", "", "GB/s", "vs plain", "vs kept");
  std::printf("%-44s %9.3f %9s\n", "plain sequential write + fsync (1 thread)", w, "1.00");
  std::printf("%-44s %9.3f %9.2f\n", ("checkpoint::save at " + std::to_string(world) + " ranks").c_str(), s, s / w);
  std::printf("%-44s %9.3f %9s\n", "plain sequential read, cold (1 thread)", rd, "1.00");
  std::printf("%-44s %9.3f %9.2f\n", "plain read into one buffer of the file's size", kept, kept / rd);
  std::printf("%-44s %9.3f %9.2f %9.2f\n", ("checkpoint::load at " + std::to_string(world) + " ranks").c_str(), l,
              l / rd, l / kept);
  std::printf("%-44s %9.3f %9.2f %9.2f\n",
              ("checkpoint::load at " + std::to_string(std::max(1, world / 2)) + " ranks (resharding)").c_str(), l2,
              l2 / rd, l2 / kept);
  std::printf("%-44s %9.3f %9.2f %9.2f\n", ("checkpoint::load in place at " + std::to_string(world) + " ranks").c_str(),
              lp, lp / rd, lp / kept);
  const std::string reshard_in_place =
      "checkpoint::load in place at " + std::to_string(std::max(1, world / 2)) + " ranks (resharding)";
  std::printf("%-44s %9.3f %9.2f %9.2f\n", reshard_in_place.c_str(), lp2, lp2 / rd, lp2 / kept);
  std::printf(
      "{\"bench\":\"checkpoint\",\"bytes\":%llu,\"world\":%d,\"plain_write_gbps\":%.4f,"
      "\"save_gbps\":%.4f,\"plain_read_gbps\":%.4f,\"plain_read_kept_gbps\":%.4f,\"load_gbps\":%.4f,"
      "\"load_reshard_gbps\":%.4f,\"load_in_place_gbps\":%.4f,\"load_in_place_reshard_gbps\":%.4f,"
      "\"save_ratio_median\":%.3f,\"load_ratio_median\":%.3f,\"load_in_place_ratio_median\":%.3f}\n",
      static_cast<unsigned long long>(bytes), world, w, s, rd, kept, l, l2, lp, lp2, median(rs), median(rl),
      median(rp));
  std::filesystem::remove_all(dir);
  return 0;
}
