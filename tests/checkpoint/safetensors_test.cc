// safetensors export and import on thread ranks: the file holds every parameter exactly (fp32) or rounded once
// (bf16, f16); an import at another world size gives the parameters back bit for bit, with names mapped by a
// function; every malformed or mismatched file is the same error on every rank and modifies nothing.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
// First: the common models are compiled once, in tests/support (fsdp/instances.hpp).
#include "tests/support/instances.hpp"

#include <cstring>
#include <filesystem>
#include <fsdp/checkpoint/safetensors.hpp>
#include <fstream>
#include <mutex>

#include "tests/support/support.hpp"

namespace st = fsdp::safetensors;
using fsdp::comm::local_communicator;
using fsdp_test::error_of;
using fsdp_test::five_units;
using fsdp_test::run_ranks;

namespace {

using full_shard = fsdp::policy<fsdp::sharding::full_shard>;
using params = std::map<std::string, std::vector<float>>;

const fsdp::wrap::by_prefix units{"h."};

/// Saves five_units (initialised with `seed`) at `world` ranks; returns its full parameters.
params save_model(const std::string& path, int world, std::uint64_t seed, const st::save_options& so = {}) {
  params full;
  run_ranks(world, [&](local_communicator& c) {
    fsdp::Model<full_shard> m(c, five_units(), units, fsdp::init::normal{1.0f, seed});
    st::save(m, path, so);
    const params p = fsdp::weights::gather_full_params(m);
    if (c.rank() == 0) full = p;
  });
  return full;
}

/// Loads `path` at `world` ranks into five_units initialised with seed 99; returns the full parameters.
params load_model(const std::string& path, int world, const st::load_options& lo = {}) {
  params full;
  run_ranks(world, [&](local_communicator& c) {
    fsdp::Model<full_shard> m(c, five_units(), units, fsdp::init::normal{1.0f, 99});
    st::load(m, path, lo);
    const params p = fsdp::weights::gather_full_params(m);
    if (c.rank() == 0) full = p;
  });
  return full;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

/// A file with the given tensors, all F32 zeros: the header and the data.
std::string file_with(const std::vector<std::pair<std::string, std::vector<std::int64_t>>>& tensors,
                      const std::string& dtype = "F32") {
  std::vector<st::tensor_info> infos;
  std::uint64_t at = 0;
  for (const auto& [name, shape] : tensors) {
    st::tensor_info t{name, dtype, shape, at, at};
    t.end = at += static_cast<std::uint64_t>(t.numel()) * st::dtype_bytes(dtype);
    infos.push_back(t);
  }
  return st::make_header(infos, {}) + std::string(static_cast<std::size_t>(at), '\0');
}

}  // namespace

TEST_CASE("an exported file holds every stored parameter, in the header the format defines, written by every rank") {
  fsdp_test::scratch_dir dir("st-export");
  const params full = save_model(dir / "m.safetensors", 3, 5, {.metadata = {{"step", "7"}}});
  const std::string bytes = fsdp_test::read_file_bytes(dir / "m.safetensors");
  const fsdp::checkpoint::io::file f = fsdp::checkpoint::io::open_read(dir / "m.safetensors");
  std::uint64_t data = 0;
  const st::header h = st::read_header(f, &data);
  CHECK(data % 8 == 0);
  CHECK(h.metadata == std::map<std::string, std::string>{{"step", "7"}});
  // the tie's alias ('head') is not stored twice: the file holds the five stored parameters
  REQUIRE(h.tensors.size() == 6);
  CHECK(h.find("head") == nullptr);
  std::uint64_t covered = 0;
  for (const st::tensor_info& t : h.tensors) {
    CAPTURE(t.name);
    CHECK(t.dtype == "F32");
    std::vector<float> v(static_cast<std::size_t>(t.numel()));
    std::memcpy(v.data(), bytes.data() + data + t.begin, v.size() * 4);
    CHECK(same_bits(v, full.at(t.name)));
    covered += t.end - t.begin;
  }
  CHECK(data + covered == bytes.size());  // the data section is exactly the tensors
}

TEST_CASE("bf16 and f16 exports round each value once to nearest even") {
  fsdp_test::scratch_dir dir("st-rounding");
  for (const fsdp::dtype type : {fsdp::dtype::bf16, fsdp::dtype::f16}) {
    CAPTURE(fsdp::name_of(type));
    const std::string path = dir / (std::string(fsdp::name_of(type)) + ".safetensors");
    const params full = save_model(path, 2, 5, {.type = type});
    const std::string bytes = fsdp_test::read_file_bytes(path);
    const fsdp::checkpoint::io::file f = fsdp::checkpoint::io::open_read(path);
    std::uint64_t data = 0;
    const st::header h = st::read_header(f, &data);
    for (const st::tensor_info& t : h.tensors) {
      CHECK(t.dtype == (type == fsdp::dtype::bf16 ? "BF16" : "F16"));
      const std::vector<float>& want = full.at(t.name);
      for (std::size_t i = 0; i < want.size(); ++i) {
        std::uint16_t got;
        std::memcpy(&got, bytes.data() + data + t.begin + 2 * i, 2);
        const std::uint16_t rounded =
            type == fsdp::dtype::bf16 ? fsdp::lowp::bf16_from_float(want[i]) : fsdp::lowp::half_from_float(want[i]);
        REQUIRE(got == rounded);
      }
    }
    // and they import back to exactly the rounded values
    const params back = load_model(path, 3);
    for (const auto& [name, values] : full) {
      for (std::size_t i = 0; i < values.size(); ++i) {
        const float rounded = type == fsdp::dtype::bf16
                                  ? fsdp::lowp::bf16_to_float(fsdp::lowp::bf16_from_float(values[i]))
                                  : fsdp::lowp::half_to_float(fsdp::lowp::half_from_float(values[i]));
        REQUIRE(std::memcmp(&back.at(name)[i], &rounded, 4) == 0);
      }
    }
  }
}

TEST_CASE("an import at another world size gives every parameter back bit for bit, names mapped by a function") {
  fsdp_test::scratch_dir dir("st-import");
  const params saved = save_model(dir / "m.safetensors", 3, 5);
  for (const int world : {1, 2, 4}) {
    CAPTURE(world);
    const params got = load_model(dir / "m.safetensors", world);
    REQUIRE(got.size() == saved.size());
    for (const auto& [name, values] : saved) CHECK(same_bits(got.at(name), values));  // 'head' too: it is 'emb'
  }
  auto prefixed = [](std::string_view n) { return "model." + std::string(n); };
  save_model(dir / "mapped.safetensors", 2, 5, {.name_of = prefixed});
  const fsdp::checkpoint::io::file f = fsdp::checkpoint::io::open_read(dir / "mapped.safetensors");
  CHECK(st::read_header(f).find("model.h.0.w") != nullptr);
  const params got = load_model(dir / "mapped.safetensors", 3, {.name_of = prefixed});
  for (const auto& [name, values] : saved) CHECK(same_bits(got.at(name), values));
}

namespace {
/// Loads `path` at 2 ranks into five_units (seed 99): each rank's error, and whether every parameter stayed.
std::vector<std::string> failing_load(const std::string& path, bool& untouched) {
  std::vector<std::string> out(2);
  std::mutex mu;
  untouched = true;
  run_ranks(2, [&](local_communicator& c) {
    fsdp::Model<full_shard> m(c, five_units(), units, fsdp::init::normal{1.0f, 99});
    const params before = fsdp::weights::gather_full_params(m);
    const std::string msg = error_of<fsdp::checkpoint_error>([&] { st::load(m, path); });
    const params after = fsdp::weights::gather_full_params(m);
    std::lock_guard lock(mu);
    out[c.rank()] = msg;
    untouched = untouched && before == after;
  });
  return out;
}

const std::vector<std::pair<std::string, std::vector<std::int64_t>>> stored = {
    {"emb", {37, 5}}, {"h.0.w", {9, 9}}, {"h.0.b", {9}}, {"h.1.w", {3}}, {"h.2.w", {16, 17}}, {"h.3.w", {2, 2}}};
}  // namespace

TEST_CASE(
    "a file that does not fit the model, or is not a safetensors file: the same error on every rank, nothing "
    "modified") {
  fsdp_test::scratch_dir dir("st-errors");
  const std::string path = dir / "bad.safetensors";
  const std::string prefix = "fsdp: safetensors load from '" + path +
                             "' failed (no parameter was modified): ranks 0, "
                             "1: the safetensors file '" +
                             path + "'";
  auto expect = [&](const std::string& bytes, const std::string& message) {
    fsdp_test::write_file_bytes(path, bytes);
    bool untouched = false;
    const std::vector<std::string> got = failing_load(path, untouched);
    CHECK(got[0] == prefix + message);
    CHECK(got[1] == prefix + message);
    CHECK(untouched);
  };
  auto without = [&](const std::string& name) {
    auto t = stored;
    std::erase_if(t, [&](const auto& x) { return x.first == name; });
    return t;
  };
  expect(file_with(without("h.3.w")), " has no tensor 'h.3.w' [2, 2]");
  auto extra = stored;
  extra.push_back({"extra", {3}});
  expect(file_with(extra),
         " holds tensor 'extra' [3], which no parameter of the model maps to "
         "(load_options::allow_unused ignores it)");
  auto reshaped = stored;
  reshaped[3].second = {1, 3};
  expect(file_with(reshaped), ": tensor 'h.1.w' is [1, 3] in the file but [3] in the model");
  expect(file_with(stored, "I64"),
         ": tensor 'emb' is I64, which an fp32 master parameter cannot hold exactly (F32, "
         "BF16, F16, F8_E4M3, F8_E5M2 and I8 can)");
  expect("hello", " has 5 bytes: too short for a header");
  std::string huge(8, '\0');
  huge[5] = 1;  // 2^40
  expect(huge + "{}", ": its header length is 1099511627776 bytes, more than the limit of 100000000");
  std::string longer(8, '\0');
  longer[0] = 64;
  expect(longer + "{}", ": its header length is 64 bytes, more than the 2 bytes after the length");
  const std::string valid = file_with(stored);
  const std::uint64_t data = (37 * 5 + 9 * 9 + 9 + 3 + 16 * 17 + 2 * 2) * 4;  // h.3.w is last: [data - 16, data)
  expect(valid.substr(0, valid.size() - 4), ": tensor 'h.3.w': data_offsets are [" + std::to_string(data - 16) + ", " +
                                                std::to_string(data) + "], which is not a range of the " +
                                                std::to_string(data - 4) + " bytes of data");
  // the format's rules: a name once, the data tiled exactly (the first tensor at byte 0, no gap, nothing after)
  const std::string valid_header = valid.substr(8, valid.size() - 8 - data);
  auto raw = [](std::string header, std::uint64_t data_bytes) {
    header.resize((header.size() + 7) / 8 * 8, ' ');
    std::string out;
    fsdp::detail::put_u64le(out, header.size());
    return out + header + std::string(static_cast<std::size_t>(data_bytes), '\0');
  };
  std::string twice = valid_header;  // 'emb' once more, as the first entry says it
  const std::size_t emb = twice.find("\"emb\"");
  twice.insert(twice.find("},", emb) + 2, twice.substr(emb, twice.find("},", emb) + 2 - emb));
  expect(raw(twice, data), ": tensor 'emb' appears twice; the names in a JSON object must be unique (a reader that "
                           "keeps either one would see another document)");
  expect(raw(valid_header, data + 8), ": the document ends its last tensor at byte " + std::to_string(data) +
                                          " of its " + std::to_string(data + 8) +
                                          " bytes of data; a safetensors file's tensors tile its data exactly");
  std::string garbled(8, '\0');
  garbled[0] = 6;
  expect(garbled + "{\"a\": ", ": the document does not parse as JSON");
  expect(garbled + "[1, 2]", ": the document must be a JSON object");
  std::string no_file = dir / "absent.safetensors";
  bool untouched = false;
  const std::string missing = "fsdp: safetensors load from '" + no_file +
                              "' failed (no parameter was modified): ranks "
                              "0, 1: could not open '" +
                              no_file + "': No such file or directory";
  CHECK(failing_load(no_file, untouched) == std::vector<std::string>{missing, missing});
  // allow_unused ignores the extra tensor: every parameter is the file's (zeros)
  fsdp_test::write_file_bytes(path, file_with(extra));
  const params got = load_model(path, 2, {.allow_unused = true});
  for (const auto& [name, values] : got)
    for (float v : values) REQUIRE(v == 0.0f);
}

TEST_CASE("F8_E4M3, F8_E5M2 and I8 files load exactly at any world size; a save in fp8 or int8 is refused, named") {
  fsdp_test::scratch_dir dir("st-fp8");
  const std::string path = dir / "m.safetensors";
  for (const char* type : {"F8_E4M3", "F8_E5M2", "I8"}) {
    CAPTURE(type);
    std::string bytes = file_with(stored, type);
    const std::size_t data = bytes.size() - 554;  // five_units stores 185 + 81 + 9 + 3 + 272 + 4 elements, a byte each
    for (std::size_t i = data; i < bytes.size(); ++i) bytes[i] = static_cast<char>(i * 37 % 0x7b);  // finite patterns
    fsdp_test::write_file_bytes(path, bytes);
    const fsdp::dtype t = *fsdp::dtype_of_safetensors(type);
    for (int world : {1, 3}) {
      CAPTURE(world);
      const params got = load_model(path, world);
      std::size_t at = data, checked = 0;
      for (const auto& [name, shape] : stored) {
        const std::vector<float>& v = got.at(name);
        for (float x : v) {
          float want = 0;
          const char b = bytes[at++];
          fsdp::kernels::dispatch(t, [&](auto d) {
            if constexpr (sizeof(fsdp::lowp::storage_t<d()>) == 1)
              want = fsdp::lowp::to_float<d()>(static_cast<std::uint8_t>(b));
          });
          CHECK(x == want);
          ++checked;
        }
      }
      CHECK(checked == 554);
      CHECK(at == bytes.size());
    }
  }
  run_ranks(2, [&](local_communicator& c) {
    fsdp::Model<full_shard> m(c, five_units(), units, fsdp::init::normal{1.0f, 1});
    CHECK(fsdp_test::error_of<fsdp::usage_error>([&] { st::save(m, path + ".2", {.type = fsdp::dtype::f8e4m3}); }) ==
          "fsdp: safetensors::save: save_options::type is f8e4m3, whose values need a scale beside them, which the "
          "file would not hold; save in f32, bf16 or f16");
    CHECK(fsdp_test::error_of<fsdp::usage_error>([&] { st::save(m, path + ".3", {.type = fsdp::dtype::i8}); }) ==
          "fsdp: safetensors::save: save_options::type is i8, whose values need a scale beside them, which the "
          "file would not hold; save in f32, bf16 or f16");
  });
}

TEST_CASE("a save that fails (the file made or its header written by rank 0, the rename) leaves no .partial behind") {
  fsdp_test::scratch_dir dir("st-save-fault");
  const std::string path = dir / "w.safetensors", partial = path + ".partial";
  // Each rank's message when rank 0's file-system operation `op` on `at` fails with `why`.
  auto save_failing = [&](const std::string& op, const std::string& at, const char* why) {
    st::save_options so;
    so.fault = [&](const fsdp::checkpoint::io_event& e) {
      if (e.rank == 0 && e.op == op && e.path == at) throw fsdp::checkpoint_error(why);
    };
    std::vector<std::string> messages(2);
    run_ranks(2, [&](local_communicator& c) {
      fsdp::Model<full_shard> m(c, five_units(), units, fsdp::init::normal{1.0f, 5});
      messages[c.rank()] = error_of<fsdp::checkpoint_error>([&] { st::save(m, path, so); });
    });
    return messages;
  };
  for (const std::string op : {"create", "write", "rename"}) {
    CAPTURE(op);
    const std::string removed = op == "create" ? "" : "; '" + partial + "' was removed";  // create: nothing was made
    const std::string expected =
        "fsdp: safetensors save to '" + path + "' failed: rank 0: injected: No space left on device" + removed;
    CHECK(save_failing(op, partial, "injected: No space left on device") ==
          std::vector<std::string>{expected, expected});
    CHECK(!std::filesystem::exists(partial));
    CHECK(!std::filesystem::exists(path));
  }
  // after the rename the file is complete, and the message says so
  const std::string expected = "fsdp: safetensors save to '" + path + "' failed: rank 0: injected: Input/output error "
                               "after the rename: '" + path + "' is complete, but a crash before the file system "
                               "writes the rename back may lose it";
  CHECK(save_failing("fsync", dir.root, "injected: Input/output error") ==
        std::vector<std::string>{expected, expected});
  CHECK(!std::filesystem::exists(partial));
  CHECK(load_model(path, 1).size() == 7);
}
