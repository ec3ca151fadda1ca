# Installs what a C++ user links against: the headers, libseqpar, the seqpar program, the CMake
# package (seqparConfig.cmake, seqparConfigVersion.cmake, the exported target seqpar::seqpar)
# and seqpar.pc for pkg-config.
#   cmake --install build --prefix P
#   find_package(seqpar REQUIRED)  target_link_libraries(app PRIVATE seqpar::seqpar)
include(CMakePackageConfigHelpers)
set(SEQPAR_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/seqpar)

install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/seqpar ${PROJECT_BINARY_DIR}/include/seqpar
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(TARGETS seqpar_library EXPORT seqparTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
if(TARGET seqpar)
  # The program finds libseqpar's private dependencies where the system keeps them; its own
  # libraries are linked statically.
  install(TARGETS seqpar RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()
install(EXPORT seqparTargets NAMESPACE seqpar:: DESTINATION ${SEQPAR_CMAKE_DIR})

configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/seqparConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/seqparConfig.cmake
                              INSTALL_DESTINATION ${SEQPAR_CMAKE_DIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/seqparConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/seqparConfig.cmake ${PROJECT_BINARY_DIR}/seqparConfigVersion.cmake
        DESTINATION ${SEQPAR_CMAKE_DIR})

# seqpar.pc locates the prefix from its own folder, so `cmake --install --prefix P` needs no
# reconfiguration.
file(RELATIVE_PATH SEQPAR_PC_TO_PREFIX /${CMAKE_INSTALL_LIBDIR}/pkgconfig /)
configure_file(${PROJECT_SOURCE_DIR}/cmake/seqpar.pc.in ${PROJECT_BINARY_DIR}/seqpar.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/seqpar.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
