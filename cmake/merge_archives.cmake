# cmake -DAR= -DRANLIB= -DARCHIVE= -DMERGE="a.a;b.a" -P merge_archives.cmake
# Appends every member of the MERGE archives to ARCHIVE (GNU ar's MRI
# script: members of the same name from different archives are kept).
set(script "create ${ARCHIVE}.merged\naddlib ${ARCHIVE}\n")
foreach(a ${MERGE})
  string(APPEND script "addlib ${a}\n")
endforeach()
string(APPEND script "save\nend\n")
file(WRITE ${ARCHIVE}.mri "${script}")
execute_process(COMMAND ${AR} -M INPUT_FILE ${ARCHIVE}.mri RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "merging ${MERGE} into ${ARCHIVE} failed: ${rc}")
endif()
execute_process(COMMAND ${RANLIB} ${ARCHIVE}.merged RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "ranlib ${ARCHIVE}.merged failed: ${rc}")
endif()
file(RENAME ${ARCHIVE}.merged ${ARCHIVE})
file(REMOVE ${ARCHIVE}.mri)
