#pragma once
#include <string>
// Each returns "" after writing 1.5f * 2 (odr_a) or 1.5f * 4 (odr_b) to *out through the CUDA backend, or the
// "skipped: ..." line when there is no GPU.
std::string odr_a(float* out);
std::string odr_b(float* out);
// Each trains a two-unit model one AdamW step with comm::local on the GPU at world 1 and returns one weight, or
// the "skipped: ..." line; both translation units instantiate the same templates.
std::string odr_model_a(float* out);
std::string odr_model_b(float* out);
