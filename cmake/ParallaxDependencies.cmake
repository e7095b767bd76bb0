# Finds everything Parallax builds against. Each dependency becomes an imported target;
# cmake/ParallaxConfig.cmake.in finds the same ones for consumers of the installed package.

# Protobuf before Torch: a LibTorch built without it (the PyPI wheel) defines a dummy
# protobuf::libprotobuf when no such target exists yet.
find_package(Protobuf REQUIRED)
find_package(Torch REQUIRED)          # Debian's libtorch-dev, or any LibTorch >= 1.13 (CMAKE_PREFIX_PATH)
include(ParallaxTorchLibraries)
find_package(MPI REQUIRED COMPONENTS CXX)
find_package(tomlplusplus REQUIRED)
find_package(PkgConfig REQUIRED)
pkg_check_modules(HWLOC REQUIRED IMPORTED_TARGET hwloc)
find_package(Threads REQUIRED)
# LibTorch from the PyPI wheel: its libraries sit in torch/lib, and the CUDA, NCCL and
# OpenMP runtimes it was built with beside it (torch/lib/libgomp.so.1,
# nvidia/{cu13,nccl}/lib). Parallax links those same files, so one process never holds
# two of a runtime (they share sonames: the first loaded would serve both).
set(PARALLAX_TORCH_LIB_DIR "${TORCH_INSTALL_PREFIX}/lib")
get_filename_component(PARALLAX_TORCH_WHEEL_NVIDIA "${TORCH_INSTALL_PREFIX}/../nvidia" ABSOLUTE)
# LibTorch's OpenMP runtime (libgomp, the wheel's own copy first): the CPU Adam enters
# its pool directly (offload/intra_op_pool.h), so no translation unit needs the
# compiler's OpenMP, and one process never holds a second OpenMP pool.
find_library(PARALLAX_GOMP_LIBRARY NAMES libgomp.so.1 gomp PATHS "${PARALLAX_TORCH_LIB_DIR}" NO_DEFAULT_PATH)
find_library(PARALLAX_GOMP_LIBRARY NAMES libgomp.so.1 gomp)
if(NOT PARALLAX_GOMP_LIBRARY)
  message(FATAL_ERROR "libgomp (the OpenMP runtime LibTorch runs its intra-op threads on) was not found "
                      "in ${PARALLAX_TORCH_LIB_DIR} or the system paths; set PARALLAX_GOMP_LIBRARY.")
endif()
# LibTorch's CMake config links the CUDA toolkit's runtime and NVRTC (CUDA::cudart,
# CUDA::nvrtc, CUDA_NVRTC_LIB); the wheel's libraries load the copies in nvidia/cu*/lib.
# Point those at the copies, so everything links what LibTorch runs with.
foreach(_parallax_cuda_lib cudart nvrtc)
  file(GLOB _parallax_wheel_copy "${PARALLAX_TORCH_WHEEL_NVIDIA}/cu*/lib/lib${_parallax_cuda_lib}.so.*")
  list(FILTER _parallax_wheel_copy EXCLUDE REGEX "alt|builtins")
  if(TARGET CUDA::${_parallax_cuda_lib} AND _parallax_wheel_copy)
    list(GET _parallax_wheel_copy 0 _parallax_wheel_copy)
    set_property(TARGET CUDA::${_parallax_cuda_lib} PROPERTY IMPORTED_LOCATION "${_parallax_wheel_copy}")
    if(_parallax_cuda_lib STREQUAL "nvrtc" AND CUDA_NVRTC_LIB)  # TORCH_LIBRARIES names the file
      list(TRANSFORM TORCH_LIBRARIES REPLACE "^${CUDA_NVRTC_LIB}$" "${_parallax_wheel_copy}")
    endif()
    message(STATUS "Parallax: CUDA::${_parallax_cuda_lib} is LibTorch's ${_parallax_wheel_copy}")
  endif()
endforeach()

# LibTorch built with CUDA sets TORCH_CUDA_LIBRARIES (or c10_cuda) in TorchConfig.
set(PARALLAX_TORCH_HAS_CUDA OFF)
if(TORCH_CUDA_LIBRARIES OR TARGET c10_cuda)
  set(PARALLAX_TORCH_HAS_CUDA ON)
endif()

# NCCL: the CUDA toolkit is found from nvcc on the PATH (CUDAToolkit does that), NCCL
# beside it or in the system paths.
set(PARALLAX_NCCL_ENABLED OFF)
if(PARALLAX_WITH_NCCL STREQUAL "ON" OR (PARALLAX_WITH_NCCL STREQUAL "AUTO" AND PARALLAX_TORCH_HAS_CUDA))
  if(PARALLAX_WITH_NCCL STREQUAL "ON")
    set(_parallax_nccl_required REQUIRED)
  endif()
  find_package(CUDAToolkit ${_parallax_nccl_required})
  if(CUDAToolkit_FOUND)
    get_filename_component(_parallax_cuda_root "${CUDAToolkit_BIN_DIR}" DIRECTORY)
    # LibTorch's NCCL first (the wheel's nvidia/nccl: no unversioned libnccl.so there).
    find_path(NCCL_INCLUDE_DIR nccl.h
      HINTS "${PARALLAX_TORCH_WHEEL_NVIDIA}/nccl/include" ${CUDAToolkit_INCLUDE_DIRS} "${_parallax_cuda_root}/include")
    find_library(NCCL_LIBRARY NAMES nccl libnccl.so.2 NAMES_PER_DIR
      HINTS "${PARALLAX_TORCH_WHEEL_NVIDIA}/nccl/lib" ${CUDAToolkit_LIBRARY_DIR} "${_parallax_cuda_root}/lib"
            "${_parallax_cuda_root}/lib64")
  endif()
  if(NCCL_INCLUDE_DIR AND NCCL_LIBRARY)
    set(PARALLAX_NCCL_ENABLED ON)
    message(STATUS "Parallax: NCCL communicator enabled (${NCCL_LIBRARY})")
  elseif(PARALLAX_WITH_NCCL STREQUAL "ON")
    message(FATAL_ERROR "PARALLAX_WITH_NCCL=ON but nccl.h/libnccl were not found next to the "
                        "CUDA toolkit (${CUDAToolkit_BIN_DIR}); set NCCL_INCLUDE_DIR and NCCL_LIBRARY.")
  endif()
endif()
if(NOT PARALLAX_NCCL_ENABLED)
  message(STATUS "Parallax: NCCL communicator disabled (PARALLAX_WITH_NCCL=${PARALLAX_WITH_NCCL})")
endif()

# The malloc Parallax's executables run on: LibTorch's CPU tensors come from malloc. Once
# glibc's frees a large block it raises its mmap threshold and keeps later blocks of that
# size in its heaps, so a ZeRO-3 step that gathers and frees a unit at a time held 1.7 GiB
# resident for 0.5 GiB of tensors (tcmalloc: 0.8 GiB, and faster; docs/zero-and-offload.md,
# "Memory per rank"). tcmalloc (Debian's libtcmalloc-minimal4): executables linking
# Parallax::parallax link it first, so it is the process's malloc. system: the C library's
# (what sanitizers need). AUTO: tcmalloc when found.
set(PARALLAX_MALLOC "AUTO" CACHE STRING "The malloc of executables linking Parallax: tcmalloc, system, AUTO")
set_property(CACHE PARALLAX_MALLOC PROPERTY STRINGS AUTO tcmalloc system)
set(PARALLAX_TCMALLOC_ENABLED OFF)
if(NOT PARALLAX_MALLOC MATCHES "^(AUTO|tcmalloc|system)$")
  message(FATAL_ERROR "PARALLAX_MALLOC=${PARALLAX_MALLOC}: allowed are AUTO, tcmalloc, system")
endif()
if(NOT PARALLAX_MALLOC STREQUAL "system")
  find_library(PARALLAX_TCMALLOC_LIBRARY NAMES tcmalloc_minimal libtcmalloc_minimal.so.4 NAMES_PER_DIR)
  if(PARALLAX_TCMALLOC_LIBRARY)
    set(PARALLAX_TCMALLOC_ENABLED ON)
  elseif(PARALLAX_MALLOC STREQUAL "tcmalloc")
    message(FATAL_ERROR "PARALLAX_MALLOC=tcmalloc but libtcmalloc_minimal was not found "
                        "(Debian: apt-get install libtcmalloc-minimal4); set PARALLAX_TCMALLOC_LIBRARY")
  endif()
endif()
if(PARALLAX_TCMALLOC_ENABLED)
  message(STATUS "Parallax: executables run on tcmalloc (${PARALLAX_TCMALLOC_LIBRARY})")
else()
  message(STATUS "Parallax: executables run on the system malloc (PARALLAX_MALLOC=${PARALLAX_MALLOC})")
endif()
