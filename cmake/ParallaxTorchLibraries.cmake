# Included right after find_package(Torch), by the build and by the installed package's
# config. LibTorch's config finds libc10 with find_library(c10 PATHS <its lib dir>), and
# PATHS come after the system paths: with Debian's libtorch-dev installed, any other
# LibTorch (the PyPI wheel, a libtorch zip) would link Debian's libc10 beside its own,
# and two c10s in one process abort at load. Every library TORCH_LIBRARIES names
# outside LibTorch's prefix that LibTorch's own lib directory also has is replaced by
# LibTorch's.
set(_parallax_torch_libraries)
foreach(_parallax_lib IN LISTS TORCH_LIBRARIES)
  if(IS_ABSOLUTE "${_parallax_lib}")
    string(FIND "${_parallax_lib}" "${TORCH_INSTALL_PREFIX}/" _parallax_at)
    get_filename_component(_parallax_name "${_parallax_lib}" NAME)
    if(NOT _parallax_at EQUAL 0 AND EXISTS "${TORCH_INSTALL_PREFIX}/lib/${_parallax_name}")
      set(_parallax_lib "${TORCH_INSTALL_PREFIX}/lib/${_parallax_name}")
    endif()
  endif()
  list(APPEND _parallax_torch_libraries "${_parallax_lib}")
endforeach()
set(TORCH_LIBRARIES ${_parallax_torch_libraries})
