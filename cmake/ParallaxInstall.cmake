# Install rules and the exported package (find_package(Parallax) → Parallax::parallax).
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

# parallax_install_targets(<target>...): install libraries into the ParallaxTargets export.
function(parallax_install_targets)
  install(TARGETS ${ARGN} EXPORT ParallaxTargets
    LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
    ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
    RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endfunction()

# parallax_install_headers(<module> <header>...): headers go to include/parallax/<module>/.
function(parallax_install_headers module)
  install(FILES ${ARGN} DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/parallax/${module})
endfunction()

function(parallax_install_package)
  set(PARALLAX_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/Parallax)
  install(EXPORT ParallaxTargets NAMESPACE Parallax:: DESTINATION ${PARALLAX_CMAKE_DIR})
  configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/ParallaxConfig.cmake.in
    ${PROJECT_BINARY_DIR}/ParallaxConfig.cmake INSTALL_DESTINATION ${PARALLAX_CMAKE_DIR})
  write_basic_package_version_file(${PROJECT_BINARY_DIR}/ParallaxConfigVersion.cmake
    COMPATIBILITY SameMinorVersion)
  install(FILES ${PROJECT_BINARY_DIR}/ParallaxConfig.cmake
                ${PROJECT_BINARY_DIR}/ParallaxConfigVersion.cmake
                ${PROJECT_SOURCE_DIR}/cmake/ParallaxTorchLibraries.cmake
          DESTINATION ${PARALLAX_CMAKE_DIR})
endfunction()
