#pragma once
// FSDP_TEST_SANITIZED: 1 in a translation unit built with AddressSanitizer or ThreadSanitizer, by GCC (which defines
// __SANITIZE_ADDRESS__ / __SANITIZE_THREAD__) or by Clang (which says so only through __has_feature); 0 otherwise.
// For the few cases a sanitizer's own runtime makes meaningless (address-space limits, huge requests).
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define FSDP_TEST_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define FSDP_TEST_SANITIZED 1
#endif
#endif
#ifndef FSDP_TEST_SANITIZED
#define FSDP_TEST_SANITIZED 0
#endif
