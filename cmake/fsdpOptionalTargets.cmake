# The optional parts of the fsdp package, made where what each needs is found. The same recipe serves the source
# tree (CMakeLists.txt) and the installed package (fsdpConfig.cmake), so the two cannot drift apart. Needs
# fsdp::fsdp to exist.
#
#   fsdp::separate      fsdp::fsdp in separate-compilation mode (fsdp/core/config.hpp): a static library, compiled
#                       here with the consumer's compiler (and build type), only when a target links it,
#                       holding the library's non-template definitions
#                       (fsdp/src.hpp), and FSDP_SEPARATE_COMPILATION for every target that links it. Link it
#                       instead of fsdp::fsdp, never beside it: code built without the definition must not include
#                       the headers into the same program. Always made (it needs nothing beyond fsdp::fsdp).
#   fsdp::chrome_trace  fsdp::fsdp + nlohmann_json::nlohmann_json (fsdp/observe/chrome_trace.hpp)
#   fsdp::checkpoint    fsdp::fsdp + nlohmann_json::nlohmann_json + xxHash's header (fsdp/checkpoint/: sharded
#                       checkpoints and safetensors files; xxhash.h is used header-only, nothing is linked)
#   fsdp::checkpoint_separate  the same over fsdp::separate: a static library of fsdp/checkpoint/src.hpp, compiled
#                       here; link it instead of fsdp::checkpoint in separate-compilation mode
#   fsdp::cuda          fsdp::fsdp + C++20 under nvcc: link it from targets with .cu sources. The headers need
#                       no other nvcc flag (no --expt-relaxed-constexpr, no --extended-lambda), so none is
#                       imposed on the consumer's own code. Made only where the CUDA language is enabled (enable it before
#                       find_package(fsdp): project(... LANGUAGES CXX CUDA)). The CUDA runtime comes with nvcc's
#                       link (CMAKE_CUDA_RUNTIME_LIBRARY), not from this target.
#   fsdp::nccl          fsdp::cuda + NCCL (comm::nccl). NCCL is looked for beside the CUDA toolkit, under
#                       FSDP_NCCL_ROOT / NCCL_ROOT (variable or environment), then on the system's paths.
#   fsdp::mpi           fsdp::fsdp + MPI's C library, with OMPI_SKIP_MPICXX / MPICH_SKIP_MPICXX: comm::mpi
#                       (fsdp/comm/mpi.hpp, host memory, no CUDA needed), and with fsdp::nccl, comm::nccl over MPI
#                       (fsdp/comm/nccl_mpi.cuh). Only MPI's include directories and libraries are passed on, never
#                       its compile options (-pthread and friends, which nvcc does not take).
#
# fsdp_optional_targets() sets, in the caller's scope, fsdp_<part>_FOUND for each part made (so that
# find_package(fsdp CONFIG REQUIRED COMPONENTS cuda nccl) fails, naming the part, where one is missing) and
# fsdp_missing_parts: one "target: reason" entry per part not made.
macro(fsdp_optional_targets)
  set(fsdp_missing_parts "")

  # The separate-compilation libraries are built only for a target that links them (EXCLUDE_FROM_ALL): a
  # header-only consumer compiles nothing of the library. Their source is rewritten only when it changes
  # (file(CONFIGURE)), so a reconfigure does not rebuild them. -ffp-contract=off: the library's arithmetic rounds
  # once per operation (fsdp/core/rounding.hpp), and here it is compiled apart from the consumer's own flags.
  if(NOT TARGET fsdp::separate)
    file(CONFIGURE OUTPUT "${CMAKE_CURRENT_BINARY_DIR}/fsdp_separate.cc" CONTENT "#include <fsdp/src.hpp>\n")
    add_library(fsdp_separate STATIC EXCLUDE_FROM_ALL "${CMAKE_CURRENT_BINARY_DIR}/fsdp_separate.cc")
    set_target_properties(fsdp_separate PROPERTIES POSITION_INDEPENDENT_CODE ON)
    target_compile_options(fsdp_separate PRIVATE $<$<CXX_COMPILER_ID:GNU,Clang,AppleClang>:-ffp-contract=off>)
    target_compile_definitions(fsdp_separate PUBLIC FSDP_SEPARATE_COMPILATION)
    target_link_libraries(fsdp_separate PUBLIC fsdp::fsdp)
    add_library(fsdp::separate ALIAS fsdp_separate)
  endif()

  if(NOT TARGET fsdp::chrome_trace)
    find_package(nlohmann_json 3 CONFIG QUIET)
    if(TARGET nlohmann_json::nlohmann_json)
      add_library(fsdp::chrome_trace INTERFACE IMPORTED GLOBAL)
      target_link_libraries(fsdp::chrome_trace INTERFACE fsdp::fsdp nlohmann_json::nlohmann_json)
    else()
      list(APPEND fsdp_missing_parts "fsdp::chrome_trace: nlohmann_json not found (Debian: nlohmann-json3-dev)")
    endif()
  endif()

  if(NOT TARGET fsdp::checkpoint)
    find_path(FSDP_XXHASH_INCLUDE_DIR xxhash.h)
    if(TARGET nlohmann_json::nlohmann_json AND FSDP_XXHASH_INCLUDE_DIR)
      add_library(fsdp::checkpoint INTERFACE IMPORTED GLOBAL)
      target_link_libraries(fsdp::checkpoint INTERFACE fsdp::fsdp nlohmann_json::nlohmann_json)
      target_include_directories(fsdp::checkpoint SYSTEM INTERFACE ${FSDP_XXHASH_INCLUDE_DIR})
      file(CONFIGURE OUTPUT "${CMAKE_CURRENT_BINARY_DIR}/fsdp_checkpoint_separate.cc"
           CONTENT "#include <fsdp/checkpoint/src.hpp>\n")
      add_library(fsdp_checkpoint_separate STATIC EXCLUDE_FROM_ALL
                  "${CMAKE_CURRENT_BINARY_DIR}/fsdp_checkpoint_separate.cc")
      set_target_properties(fsdp_checkpoint_separate PROPERTIES POSITION_INDEPENDENT_CODE ON)
      target_compile_options(fsdp_checkpoint_separate PRIVATE
                             $<$<CXX_COMPILER_ID:GNU,Clang,AppleClang>:-ffp-contract=off>)
      target_link_libraries(fsdp_checkpoint_separate PUBLIC fsdp::separate nlohmann_json::nlohmann_json)
      target_include_directories(fsdp_checkpoint_separate SYSTEM PUBLIC ${FSDP_XXHASH_INCLUDE_DIR})
      add_library(fsdp::checkpoint_separate ALIAS fsdp_checkpoint_separate)
    else()
      list(APPEND fsdp_missing_parts
           "fsdp::checkpoint: needs nlohmann_json and xxhash.h (Debian: nlohmann-json3-dev, libxxhash-dev)")
    endif()
  endif()

  get_property(_fsdp_languages GLOBAL PROPERTY ENABLED_LANGUAGES)
  if(NOT TARGET fsdp::cuda AND "CUDA" IN_LIST _fsdp_languages)
    find_package(CUDAToolkit QUIET)
    add_library(fsdp::cuda INTERFACE IMPORTED GLOBAL)
    target_link_libraries(fsdp::cuda INTERFACE fsdp::fsdp)
    if("cuda_std_20" IN_LIST CMAKE_CUDA_COMPILE_FEATURES)
      target_compile_features(fsdp::cuda INTERFACE cuda_std_20)
    else()  # CMake before 3.26 does not know nvcc's C++20 (3.25 stops at cuda_std_17): ask nvcc directly
      if(DEFINED CMAKE_CUDA_STANDARD AND NOT CMAKE_CUDA_STANDARD EQUAL 20)
        message(WARNING "fsdp::cuda needs C++20 under nvcc, but CMAKE_CUDA_STANDARD is ${CMAKE_CUDA_STANDARD}: "
                        "set it to 20 (the library's headers do not compile as C++${CMAKE_CUDA_STANDARD})")
      endif()
      target_compile_options(fsdp::cuda INTERFACE $<$<COMPILE_LANGUAGE:CUDA>:-std=c++20>)
    endif()
    if(CUDAToolkit_INCLUDE_DIRS)  # .cc files of a CUDA target may include the runtime's headers too
      target_include_directories(fsdp::cuda SYSTEM INTERFACE ${CUDAToolkit_INCLUDE_DIRS})
    endif()
  elseif(NOT TARGET fsdp::cuda)
    list(APPEND fsdp_missing_parts
         "fsdp::cuda, fsdp::nccl: the CUDA language is not enabled (enable it before find_package(fsdp))")
  endif()

  if(TARGET fsdp::cuda AND NOT TARGET fsdp::nccl)
    set(_fsdp_nccl_hints ${FSDP_NCCL_ROOT} $ENV{FSDP_NCCL_ROOT} ${NCCL_ROOT} $ENV{NCCL_ROOT})
    if(CUDAToolkit_LIBRARY_DIR)
      get_filename_component(_fsdp_cuda_root "${CUDAToolkit_LIBRARY_DIR}" DIRECTORY)
      list(APPEND _fsdp_nccl_hints "${_fsdp_cuda_root}")
    endif()
    find_path(FSDP_NCCL_INCLUDE_DIR nccl.h HINTS ${_fsdp_nccl_hints} ${CUDAToolkit_INCLUDE_DIRS}
              PATH_SUFFIXES include)
    find_library(FSDP_NCCL_LIBRARY NAMES nccl libnccl.so.2 HINTS ${_fsdp_nccl_hints} ${CUDAToolkit_LIBRARY_DIR}
                 PATH_SUFFIXES lib lib64)
    if(FSDP_NCCL_INCLUDE_DIR AND FSDP_NCCL_LIBRARY)
      add_library(fsdp::nccl INTERFACE IMPORTED GLOBAL)
      target_include_directories(fsdp::nccl SYSTEM INTERFACE "${FSDP_NCCL_INCLUDE_DIR}")
      target_link_libraries(fsdp::nccl INTERFACE fsdp::cuda "${FSDP_NCCL_LIBRARY}")
    else()
      list(APPEND fsdp_missing_parts "fsdp::nccl: NCCL not found (nccl.h: ${FSDP_NCCL_INCLUDE_DIR}; "
                                     "libnccl: ${FSDP_NCCL_LIBRARY}); set FSDP_NCCL_ROOT to the directory that "
                                     "holds include/nccl.h and lib/libnccl.so")
    endif()
  endif()

  if(NOT TARGET fsdp::mpi)
    set(MPI_CXX_SKIP_MPICXX TRUE)  # the C API only (FindMPI searches for enabled languages: CXX here)
    find_package(MPI QUIET COMPONENTS CXX)
    if(MPI_CXX_FOUND)
      add_library(fsdp::mpi INTERFACE IMPORTED GLOBAL)
      target_include_directories(fsdp::mpi SYSTEM INTERFACE ${MPI_CXX_INCLUDE_DIRS})
      target_compile_definitions(fsdp::mpi INTERFACE OMPI_SKIP_MPICXX MPICH_SKIP_MPICXX)
      target_link_libraries(fsdp::mpi INTERFACE fsdp::fsdp ${MPI_CXX_LIBRARIES})
    else()
      list(APPEND fsdp_missing_parts "fsdp::mpi: MPI not found (Debian: libopenmpi-dev)")
    endif()
  endif()

  foreach(_fsdp_part IN ITEMS separate chrome_trace cuda nccl mpi)
    if(TARGET fsdp::${_fsdp_part})
      set(fsdp_${_fsdp_part}_FOUND TRUE)
    else()
      set(fsdp_${_fsdp_part}_FOUND FALSE)
    endif()
  endforeach()
  foreach(_fsdp_part IN LISTS fsdp_missing_parts)
    message(STATUS "fsdp: not made: ${_fsdp_part}")
  endforeach()
endmacro()
