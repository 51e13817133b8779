# Installs libmpt, its headers and a CMake package: find_package(mpt CONFIG REQUIRED) -> mpt::mpt.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

install(TARGETS mpt EXPORT mptTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY include/mpt DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT mptTargets NAMESPACE mpt:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/mpt)
configure_package_config_file(cmake/mptConfig.cmake.in ${CMAKE_CURRENT_BINARY_DIR}/mptConfig.cmake
                              INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/mpt)
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/mptConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/mptConfig.cmake ${CMAKE_CURRENT_BINARY_DIR}/mptConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/mpt)
