# One precompiled <torch/torch.h> for every target that compiles against LibTorch, with
# Clang. Parsing and instantiating LibTorch's headers is most of a translation unit's
# cost (30 s of GCC per file on a 2-core machine; the build has some 60 such files).
# Clang's precompiled header keeps the instantiated templates, which brings a file down
# to about 10 s; GCC's saves little (its headers' deferred instantiations are redone in
# every file), so GCC builds as before.
#
# Two headers are built, because Clang refuses a header compiled for another code model:
# one position-independent (libraries), one for position-independent executables. Every
# other target reuses one of them (REUSE_FROM): the header is compiled twice per build,
# not once per target. parallax_precompile_torch() runs after every target exists.

option(PARALLAX_PRECOMPILE_TORCH "With Clang, precompile <torch/torch.h> once for all targets" ON)

# _parallax_links_torch(<target> <out-var>): whether <target> compiles against LibTorch,
# directly or through the targets it links.
function(_parallax_links_torch target out)
  get_property(known GLOBAL PROPERTY _parallax_torch_${target} SET)
  if(known)
    get_property(result GLOBAL PROPERTY _parallax_torch_${target})
    set(${out} ${result} PARENT_SCOPE)
    return()
  endif()
  set_property(GLOBAL PROPERTY _parallax_torch_${target} FALSE)  # breaks cycles
  get_target_property(type ${target} TYPE)
  set(result FALSE)
  set(libs)
  if(NOT type STREQUAL "INTERFACE_LIBRARY")
    get_target_property(libs ${target} LINK_LIBRARIES)
  endif()
  get_target_property(interface_libs ${target} INTERFACE_LINK_LIBRARIES)
  foreach(lib IN LISTS libs interface_libs)
    if(lib MATCHES "NOTFOUND$" OR lib STREQUAL "")
      continue()
    endif()
    string(REGEX REPLACE "^\\$<LINK_ONLY:(.*)>$" "\\1" lib "${lib}")
    if(lib IN_LIST TORCH_LIBRARIES)
      set(result TRUE)
      break()
    endif()
    if(TARGET ${lib})
      get_target_property(imported ${lib} IMPORTED)
      if(NOT imported)
        _parallax_links_torch(${lib} child)
        if(child)
          set(result TRUE)
          break()
        endif()
      endif()
    endif()
  endforeach()
  set_property(GLOBAL PROPERTY _parallax_torch_${target} ${result})
  set(${out} ${result} PARENT_SCOPE)
endfunction()

# _parallax_targets_in(<dir> <out-var>): every target defined under <dir>.
function(_parallax_targets_in dir out)
  get_property(targets DIRECTORY ${dir} PROPERTY BUILDSYSTEM_TARGETS)
  get_property(subdirs DIRECTORY ${dir} PROPERTY SUBDIRECTORIES)
  foreach(subdir IN LISTS subdirs)
    _parallax_targets_in(${subdir} more)
    list(APPEND targets ${more})
  endforeach()
  set(${out} ${targets} PARENT_SCOPE)
endfunction()

function(parallax_precompile_torch)
  if(NOT PARALLAX_PRECOMPILE_TORCH OR NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    return()
  endif()
  _parallax_targets_in(${PROJECT_SOURCE_DIR} targets)
  set(source "${PROJECT_BINARY_DIR}/parallax_torch_pch.cpp")
  file(CONFIGURE OUTPUT "${source}" CONTENT "// The translation unit that owns the precompiled <torch/torch.h>.\n")
  # -fno-pch-timestamp: the header carries no build time, so ccache can reuse what uses it.
  set(timestamp_free "SHELL:-Xclang -fno-pch-timestamp")
  add_library(parallax_torch_pch_pic OBJECT "${source}")
  add_library(parallax_torch_pch_pie OBJECT "${source}")
  set_target_properties(parallax_torch_pch_pie PROPERTIES POSITION_INDEPENDENT_CODE OFF)
  target_compile_options(parallax_torch_pch_pie PRIVATE ${CMAKE_CXX_COMPILE_OPTIONS_PIE})
  foreach(owner parallax_torch_pch_pic parallax_torch_pch_pie)
    target_link_libraries(${owner} PRIVATE parallax_flags ${TORCH_LIBRARIES})
    target_compile_options(${owner} PRIVATE ${timestamp_free})
    target_precompile_headers(${owner} PRIVATE <torch/torch.h>)
  endforeach()
  set(count 0)
  foreach(target IN LISTS targets)
    get_target_property(type ${target} TYPE)
    if(NOT type MATCHES "^(EXECUTABLE|SHARED_LIBRARY|STATIC_LIBRARY|MODULE_LIBRARY|OBJECT_LIBRARY)$"
       OR target MATCHES "^parallax_torch_pch_")
      continue()
    endif()
    _parallax_links_torch(${target} uses_torch)
    if(NOT uses_torch)
      continue()
    endif()
    if(type STREQUAL "EXECUTABLE")
      target_precompile_headers(${target} REUSE_FROM parallax_torch_pch_pie)
    else()
      target_precompile_headers(${target} REUSE_FROM parallax_torch_pch_pic)
    endif()
    target_compile_options(${target} PRIVATE ${timestamp_free})
    math(EXPR count "${count} + 1")
  endforeach()
  message(STATUS "Parallax: <torch/torch.h> precompiled once for ${count} targets (Clang)")
endfunction()
