# `cmake --install` and `make deb`: the cohort binary, the library (cohort::cohort), its public headers,
# the ready configs and the CMake package that find_package(cohort CONFIG) reads.
include(CMakePackageConfigHelpers)

install(TARGETS cohort RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY configs/ DESTINATION ${CMAKE_INSTALL_DATADIR}/cohort/configs)

set(COHORT_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/cohort)
install(EXPORT cohortTargets NAMESPACE cohort:: DESTINATION ${COHORT_CMAKE_DIR})
# The package config finds the same LibTorch this build used (Debian's, or a pip venv's), unless the
# program found one itself first.
set(COHORT_TORCH_DIR "${_cohort_torch_dir}")
configure_package_config_file(cmake/cohortConfig.cmake.in ${CMAKE_BINARY_DIR}/cohortConfig.cmake
                              INSTALL_DESTINATION ${COHORT_CMAKE_DIR})
write_basic_package_version_file(${CMAKE_BINARY_DIR}/cohortConfigVersion.cmake COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_BINARY_DIR}/cohortConfig.cmake ${CMAKE_BINARY_DIR}/cohortConfigVersion.cmake
        DESTINATION ${COHORT_CMAKE_DIR})

# A Debian package of the same install (`make deb`, for a build against Debian's LibTorch). The runtime
# libraries come from dpkg-shlibdeps; the -dev packages are what a program that links cohort::cohort
# compiles against (the headers of LibTorch, JSON and TOML; the static library's link dependencies).
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME cohort)
set(CPACK_PACKAGE_VENDOR "cohort")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "Data-parallel training of image classifiers with LibTorch (DDP, ZeRO, FSDP, swarm)")
set(CPACK_PACKAGE_CONTACT "cohort developers <cohort@localhost>")
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION science)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_DEPENDS
    "libtorch-dev, nlohmann-json3-dev, libtomlplusplus-dev, zlib1g-dev, libcurl4-openssl-dev | libcurl-dev, libssl-dev, libjpeg62-turbo-dev | libjpeg-dev, libsodium-dev, libzmq3-dev, pkgconf | pkg-config, cmake")
if(COHORT_HAVE_SWARM)
  string(APPEND CPACK_DEBIAN_PACKAGE_DEPENDS ", libopendht-dev")
endif()
# OpenBLAS: Debian's LibTorch does fp32 matrix products in the system BLAS, the reference libblas3 unless
# an optimized one is installed (scripts/install-deps says what it costs ViT-B/32).
set(CPACK_DEBIAN_PACKAGE_RECOMMENDS "dataset-fashion-mnist, libopenblas0-openmp")
include(CPack)
