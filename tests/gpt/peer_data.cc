// Prints what the GPT example's data generator and learning-rate schedule produce (gpt_model.hpp), in the text
// form bench/peer/gpt_fsdp2.py's copies print from peer_data.py: the test compares the two outputs.
#include <cstdio>

#include "examples/04_gpt_host/gpt_model.hpp"

int main() {
  for (int vocab : {2, 7, 64, 50257}) {
    const gpt::data_options d{.seed = 1234u + static_cast<unsigned>(vocab), .follow = 0.75};
    const auto perm = gpt::permutation(d, vocab);
    std::printf("perm %d:", vocab);
    for (int k = 0; k < vocab && k < 40; ++k) std::printf(" %d", perm[static_cast<std::size_t>(k)]);
    std::printf("\n");
    int seq[33];
    for (std::uint64_t sample : {0ull, 1ull, 77ull, 123456789ull}) {
      gpt::sequence(d, perm, 32, sample, seq);
      std::printf("sample %llu:", static_cast<unsigned long long>(sample));
      for (int t : seq) std::printf(" %d", t);
      std::printf("\n");
    }
  }
  gpt::schedule s;
  s.total = 50;
  for (int step = 0; step < 50; ++step) std::printf("lr %d: %.9e\n", step, static_cast<double>(gpt::lr_at(s, step)));
}
