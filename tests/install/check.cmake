# Installs the build tree into a scratch prefix, then builds and runs
# consumers of it the two ways a project finds ruda: find_package
# (ruda::ruda, ruda::ruda_static, ruda::ruda_mpi where built) and
# pkg-config (shared, static, ruda_mpi). pkg-config sees only the prefix's
# .pc files, so neither way may lean on liburcu's or ck's. Then checks the
# version policy: while the major version is 0, a consumer asking for an
# older minor version is refused (each 0.x minor may break the ABI).
# Arguments: -DBUILD_DIR= -DSOURCE_DIR= -DWORK_DIR= -DCC= -DPKG_CONFIG=
file(REMOVE_RECURSE ${WORK_DIR})
set(prefix ${WORK_DIR}/prefix)
execute_process(COMMAND ${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${prefix}
                RESULT_VARIABLE rc OUTPUT_QUIET)
if(rc)
  message(FATAL_ERROR "install failed: ${rc}")
endif()
file(GLOB pcdir ${prefix}/lib*/pkgconfig)
get_filename_component(libdir ${pcdir} DIRECTORY)
set(ENV{PKG_CONFIG_LIBDIR} ${pcdir})
set(ENV{PKG_CONFIG_PATH} "")
set(want_mpi OFF)
if(EXISTS ${libdir}/cmake/ruda/ruda_mpiTargets.cmake)
  set(want_mpi ON)
endif()

function(run what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(rc)
    message(FATAL_ERROR "${what} failed (${rc}):\n${out}\n${err}")
  endif()
  set(out "${out}" PARENT_SCOPE)
endfunction()

include(${BUILD_DIR}/rudaConfigVersion.cmake) # sets PACKAGE_VERSION
string(REGEX MATCH "^([0-9]+)\\.([0-9]+)" _ "${PACKAGE_VERSION}")
set(major ${CMAKE_MATCH_1})
set(minor ${CMAKE_MATCH_2})
run("configuring the consumer" ${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${WORK_DIR}/build
    -DCMAKE_PREFIX_PATH=${prefix} -DRUDA_WANT=${major}.${minor} -DRUDA_WANT_MPI=${want_mpi})
run("building the consumer" ${CMAKE_COMMAND} --build ${WORK_DIR}/build)
set(exes consumer_shared consumer_static)
if(want_mpi)
  list(APPEND exes consumer_mpi)
endif()
foreach(exe ${exes})
  run("${exe}" ${WORK_DIR}/build/${exe})
  message(STATUS "find_package ${exe}: ${out}")
endforeach()

# pkg-config: the flags are ruda's own, with no system include directory
# or compiler macro from a dependency's .pc file.
run("pkg-config --cflags ruda" ${PKG_CONFIG} --cflags ruda)
string(STRIP "${out}" cflags)
set(dir "")
if(cflags MATCHES "^-I([^ ]+)$")
  get_filename_component(dir ${CMAKE_MATCH_1} REALPATH)
endif()
get_filename_component(include_dir ${prefix}/include REALPATH)
if(NOT dir STREQUAL include_dir)
  message(FATAL_ERROR "pkg-config --cflags ruda gave '${cflags}', expected -I${prefix}/include alone")
endif()
# The README's own lines ("Using it from another project"), run as written
# by sh on app.c (consumer.c) in a scratch folder: `cc app.c $(pkg-config
# ...)`, shared and static. Each leaves a.out, run with no LD_LIBRARY_PATH
# and no ldconfig: the shared one finds libruda.so by the RPATH that
# ruda.pc gives for a prefix outside the system's library directories.
file(STRINGS ${SOURCE_DIR}/../../README.md readme_cc REGEX "^cc app\\.c ")
list(LENGTH readme_cc n)
if(NOT n EQUAL 2)
  message(FATAL_ERROR "README.md: expected two `cc app.c $(pkg-config ...)` lines, found ${n}")
endif()
get_filename_component(pc_bin ${PKG_CONFIG} DIRECTORY)
get_filename_component(cc_bin ${CC} DIRECTORY)
set(ENV{PATH} "${pc_bin}:${cc_bin}:$ENV{PATH}")
set(ENV{LD_LIBRARY_PATH} "")
set(i 0)
foreach(line IN LISTS readme_cc)
  string(REGEX REPLACE "[ ]+#.*$" "" line "${line}")
  set(dir ${WORK_DIR}/readme${i})
  file(MAKE_DIRECTORY ${dir})
  configure_file(${SOURCE_DIR}/consumer.c ${dir}/app.c COPYONLY)
  execute_process(COMMAND sh -c "${line}" WORKING_DIRECTORY ${dir} RESULT_VARIABLE rc ERROR_VARIABLE err)
  if(rc)
    message(FATAL_ERROR "the README's `${line}` failed (${rc}):\n${err}")
  endif()
  run("${line}: ./a.out" ${dir}/a.out)
  message(STATUS "README `${line}`: ${out}")
  math(EXPR i "${i} + 1")
endforeach()
if(want_mpi)
  run("pkg-config ruda_mpi" ${PKG_CONFIG} --cflags --libs ruda_mpi)
  separate_arguments(mpi_flags UNIX_COMMAND "${out}")
  run("cc with pkg-config ruda_mpi" ${CC} ${SOURCE_DIR}/consumer_mpi.c ${mpi_flags} -o ${WORK_DIR}/pc_mpi)
  run("pc_mpi" ${WORK_DIR}/pc_mpi)
  message(STATUS "pkg-config pc_mpi: ${out}")
endif()
# The shared library's RPATH, checked from the other side too: a consumer
# linked with `pkg-config --libs ruda` names the prefix's libdir.
run("pkg-config --libs ruda" ${PKG_CONFIG} --libs ruda)
if(NOT out MATCHES "-Wl,-rpath,")
  message(FATAL_ERROR "pkg-config --libs ruda for a prefix in ${prefix} gave no RPATH: '${out}'")
endif()

# The installed examples build on their own against the install and run
# (on the host backend).
run("configuring the installed examples" ${CMAKE_COMMAND} -S ${prefix}/share/ruda/examples
    -B ${WORK_DIR}/examples -DCMAKE_PREFIX_PATH=${prefix})
run("building the installed examples" ${CMAKE_COMMAND} --build ${WORK_DIR}/examples)
set(ENV{RUDA_BACKEND} host)
run("the installed demo" ${WORK_DIR}/examples/ruda_demo)
message(STATUS "installed examples: ${out}")
if(want_mpi AND NOT EXISTS ${WORK_DIR}/examples/train_mpi)
  message(FATAL_ERROR "the installed examples did not build train_mpi against ruda::ruda_mpi")
endif()

if(major EQUAL 0 AND minor GREATER 0)
  math(EXPR older "${minor} - 1")
  execute_process(COMMAND ${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${WORK_DIR}/build-older
                          -DCMAKE_PREFIX_PATH=${prefix} -DRUDA_WANT=0.${older}
                  RESULT_VARIABLE rc OUTPUT_QUIET ERROR_QUIET)
  if(NOT rc)
    message(FATAL_ERROR "find_package(ruda 0.${older}) accepted ruda ${PACKAGE_VERSION}")
  endif()
endif()
