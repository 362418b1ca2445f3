# Install rules (included by the top CMakeLists.txt): headers, libruda.so
# and libruda.a, libruda_mpi where MPI was found, pkg-config files and the
# CMake package. What a consumer needs is written out here, so neither
# find_package(ruda) nor pkg-config needs liburcu's or ck's .pc files.

# libruda.a carries ruda's private jemalloc (ruda_je_*) and, with
# RUDA_STATIC_DEPS, liburcu-common and ck: their archives are merged into
# it after it is built, so it links with nothing but the C library's
# threads, libm and libdl. Without RUDA_STATIC_DEPS its consumers link the
# shared liburcu-common and ck, by name.
set(RUDA_MERGED_ARCHIVES)
if(RUDA_JEMALLOC) # off: the program supplies the ruda_je_* entry points
  list(APPEND RUDA_MERGED_ARCHIVES ${RUDA_JE_ARCHIVE})
endif()
if(RUDA_STATIC_DEPS)
  list(APPEND RUDA_MERGED_ARCHIVES ${URCU_COMMON_A} ${CK_A})
  set(RUDA_PC_LIBS_PRIVATE "-lpthread -ldl -lm")
else()
  target_link_libraries(ruda_static INTERFACE
    $<BUILD_INTERFACE:PkgConfig::URCU> $<BUILD_INTERFACE:PkgConfig::CK>
    $<INSTALL_INTERFACE:urcu-common> $<INSTALL_INTERFACE:ck>)
  set(RUDA_PC_LIBS_PRIVATE "-lurcu-common -lck -lpthread -ldl -lm")
endif()
target_link_libraries(ruda_static INTERFACE Threads::Threads m dl)
add_dependencies(ruda_static ruda_jemalloc_archive)
if(RUDA_MERGED_ARCHIVES)
  add_custom_command(TARGET ruda_static POST_BUILD
    COMMAND ${CMAKE_COMMAND} -DAR=${CMAKE_AR} -DRANLIB=${CMAKE_RANLIB} -DARCHIVE=$<TARGET_FILE:ruda_static>
            "-DMERGE=${RUDA_MERGED_ARCHIVES}" -P ${PROJECT_SOURCE_DIR}/cmake/merge_archives.cmake
    COMMENT "Merging ruda's static dependencies into libruda.a" VERBATIM)
endif()

install(DIRECTORY include/ruda DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(FILES ${PROJECT_BINARY_DIR}/include/ruda/version.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/ruda)
install(TARGETS ruda ruda_static EXPORT rudaTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT rudaTargets NAMESPACE ruda:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/ruda)
# Installed outside the linker's own directories (/usr/local/lib among
# them: ld.so finds a new library there only after ldconfig), the shared
# library's consumers get an RPATH to it from `pkg-config --libs`.
set(RUDA_PC_RPATH "")
if(NOT CMAKE_INSTALL_FULL_LIBDIR IN_LIST CMAKE_C_IMPLICIT_LINK_DIRECTORIES)
  set(RUDA_PC_RPATH " -Wl,-rpath,\${libdir}")
endif()
configure_file(${PROJECT_SOURCE_DIR}/cmake/ruda.pc.in ${PROJECT_BINARY_DIR}/ruda.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/ruda.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)

# libruda_mpi: ruda::ruda_mpi (the package's component `mpi`) and
# ruda_mpi.pc; its header includes <mpi.h> and its users call MPI, so
# both carry MPI's C flags and libraries.
if(RUDA_HAVE_MPI)
  install(TARGETS ruda_mpi EXPORT ruda_mpiTargets LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
  install(EXPORT ruda_mpiTargets NAMESPACE ruda:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/ruda)
  set(RUDA_MPI_PC_CFLAGS "")
  foreach(dir ${MPI_C_INCLUDE_DIRS})
    string(APPEND RUDA_MPI_PC_CFLAGS " -I${dir}")
  endforeach()
  string(JOIN " " RUDA_MPI_PC_LIBS ${MPI_C_LIBRARIES})
  configure_file(${PROJECT_SOURCE_DIR}/cmake/ruda_mpi.pc.in ${PROJECT_BINARY_DIR}/ruda_mpi.pc @ONLY)
  install(FILES ${PROJECT_BINARY_DIR}/ruda_mpi.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
endif()

# The examples, to build against this install (examples/CMakeLists.txt
# stands alone).
install(FILES examples/CMakeLists.txt examples/demo.c examples/inference_server.c examples/training_loop.c
              examples/train_mpi.c examples/mlp_blas.c examples/cublas_dl.h examples/mlp_lt.c
              examples/cublaslt_dl.h examples/mlp_model.h examples/linear_model.h
        DESTINATION ${CMAKE_INSTALL_DATADIR}/ruda/examples)

include(CMakePackageConfigHelpers)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/rudaConfig.cmake.in
  ${PROJECT_BINARY_DIR}/rudaConfig.cmake INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/ruda)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/rudaConfigVersion.cmake
  COMPATIBILITY ${RUDA_PACKAGE_COMPATIBILITY})
install(FILES ${PROJECT_BINARY_DIR}/rudaConfig.cmake ${PROJECT_BINARY_DIR}/rudaConfigVersion.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/ruda)
