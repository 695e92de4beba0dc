#pragma once
#include <string>
// Each returns "" after writing 1.5f * 2 (odr_a) or 1.5f * 4 (odr_b) to *out through the CUDA backend, or the
// "skipped: ..." line when there is no GPU.
std::string odr_a(float* out);
std::string odr_b(float* out);
