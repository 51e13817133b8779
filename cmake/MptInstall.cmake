# Installs libmpt, its headers and a CMake package: find_package(mpt CONFIG REQUIRED) -> mpt::mpt.
# The package only re-finds PUBLIC dependencies (xtensor, nlohmann_json); the PRIVATE ones (oneDNN, OpenMP, HDF5,
# zlib, protobuf, libzip, CUDA) are linked into the shared libmpt and are not a consumer's concern.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(MPT_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/mpt)

# The installed libmpt must still find the private libraries it links from outside the system
# library directories (the CUDA toolkit, cuDNN): keep their directories in its RUNPATH.
set_target_properties(mpt PROPERTIES INSTALL_RPATH_USE_LINK_PATH ON)

install(TARGETS mpt EXPORT mptTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/mpt DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT mptTargets NAMESPACE mpt:: DESTINATION ${MPT_INSTALL_CMAKEDIR})
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/mptConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/mptConfig.cmake
                              INSTALL_DESTINATION ${MPT_INSTALL_CMAKEDIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/mptConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/mptConfig.cmake ${PROJECT_BINARY_DIR}/mptConfigVersion.cmake
        DESTINATION ${MPT_INSTALL_CMAKEDIR})
