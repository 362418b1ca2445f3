# Installs the build tree into a scratch prefix, then configures, builds and
# runs a consumer that finds ruda with find_package (shared and static).
# Then checks the version policy: while the major version is 0, a consumer
# asking for an older minor version is refused (each 0.x minor may break
# the ABI). Arguments: -DBUILD_DIR= -DSOURCE_DIR= -DWORK_DIR=
file(REMOVE_RECURSE ${WORK_DIR})
execute_process(COMMAND ${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${WORK_DIR}/prefix
                RESULT_VARIABLE rc OUTPUT_QUIET)
if(rc)
  message(FATAL_ERROR "install failed: ${rc}")
endif()
include(${BUILD_DIR}/rudaConfigVersion.cmake) # sets PACKAGE_VERSION
string(REGEX MATCH "^([0-9]+)\\.([0-9]+)" _ "${PACKAGE_VERSION}")
set(major ${CMAKE_MATCH_1})
set(minor ${CMAKE_MATCH_2})
execute_process(COMMAND ${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${WORK_DIR}/build
                        -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix -DRUDA_WANT=${major}.${minor} RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "configuring the consumer failed: ${rc}")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} --build ${WORK_DIR}/build RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "building the consumer failed: ${rc}")
endif()
foreach(exe consumer_shared consumer_static)
  execute_process(COMMAND ${WORK_DIR}/build/${exe} RESULT_VARIABLE rc OUTPUT_VARIABLE out)
  message(STATUS "${exe}: ${out}")
  if(rc)
    message(FATAL_ERROR "${exe} failed: ${rc}")
  endif()
endforeach()
if(major EQUAL 0 AND minor GREATER 0)
  math(EXPR older "${minor} - 1")
  execute_process(COMMAND ${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${WORK_DIR}/build-older
                          -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix -DRUDA_WANT=0.${older}
                  RESULT_VARIABLE rc OUTPUT_QUIET ERROR_QUIET)
  if(NOT rc)
    message(FATAL_ERROR "find_package(ruda 0.${older}) accepted ruda ${PACKAGE_VERSION}")
  endif()
endif()
