// Default sanitizer settings, linked into every binary and test under --config=asan
// (.bazelrc: --custom_malloc=//bazel:sanitizer_defaults). The sanitizer runtimes look these
// functions up in the executable at start-up.

// Open MPI 4.1 leaks in MPI_Init / MPI_Finalize (and in the components it dlopen()s and closes).
// Matching these needs whole stacks, hence fast_unwind_on_malloc=0 below.
extern "C" const char* __lsan_default_suppressions() {
  return "leak:libmpi.so\n"
         "leak:libopen-pal.so\n"
         "leak:libopen-rte.so\n"
         "leak:libpmix.so\n"
         "leak:libevent\n"
         "leak:libhwloc.so\n"
         "leak:mca_\n";
}

extern "C" const char* __asan_default_options() {
  return "detect_leaks=1:fast_unwind_on_malloc=0:strict_string_checks=1";
}

extern "C" const char* __ubsan_default_options() {
  return "print_stacktrace=1:halt_on_error=1";
}
