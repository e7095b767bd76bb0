# Finds everything Parallax builds against. Each dependency becomes an imported target;
# cmake/ParallaxConfig.cmake.in finds the same ones for consumers of the installed package.

find_package(Torch REQUIRED)          # Debian's libtorch-dev, or any LibTorch >= 1.13 via Torch_DIR
find_package(MPI REQUIRED COMPONENTS CXX)
find_package(tomlplusplus REQUIRED)
find_package(Protobuf REQUIRED)
find_package(PkgConfig REQUIRED)
pkg_check_modules(HWLOC REQUIRED IMPORTED_TARGET hwloc)
find_package(Threads REQUIRED)
# at::parallel_for is a header template: without OpenMP in the including translation
# unit it runs serially, whatever at::get_num_threads() says.
find_package(OpenMP REQUIRED COMPONENTS CXX)

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
    find_path(NCCL_INCLUDE_DIR nccl.h
      HINTS ${CUDAToolkit_INCLUDE_DIRS} "${_parallax_cuda_root}/include")
    find_library(NCCL_LIBRARY nccl
      HINTS ${CUDAToolkit_LIBRARY_DIR} "${_parallax_cuda_root}/lib" "${_parallax_cuda_root}/lib64")
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
